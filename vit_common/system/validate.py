"""The one validation layer: every value from the command line, a config field or a file is checked here,
where it enters, before anything is allocated or run.

- Numbers: ``int_in`` / ``float_in`` refuse bools, strings, NaN, infinities and values out of range;
  ``arg`` turns one into an argparse ``type=`` (``type=arg(float_in, 0, 1)``), so a bad flag is refused
  at parse time naming the flag's value.
- Sizes a file or a command declares: ``check_model_size`` refuses a config whose parameters and
  activations would not fit ``memory_limit()`` (the machine's memory, or ``VIT_MAX_BYTES``), and
  ``check_holds`` a config that declares more parameters than the file holds (a few KB of tensors
  cannot be depth 10^9). ``check_bytes`` bounds any other declared size (an .npz member, a dataset).
- Paths: ``regular_file`` refuses FIFOs, devices and sockets before they are opened (reading one would
  block or never end).
- Weights: ``check_weights`` refuses tensors that are not floating point.

Every error is a ``ValueError`` (or ``OSError`` for paths) whose message names the value and what was
expected, on one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

LIMIT_ENV = "VIT_MAX_BYTES"  # bytes (or e.g. "64G"): the largest model, dataset or member vit will allocate
MAX_INT = 2**31 - 1  # shapes and counts stay int32-addressable in every framework
_ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def int_in(name: str, value: Any, lo: int = 1, hi: int = MAX_INT) -> int:
    """``value`` if it is an int (not a bool) with lo <= value <= hi.

    Raises:
        ValueError: naming ``name``, the value and the range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r}: expected an integer in [{lo}, {hi}]")
    return int(value)


def float_in(
    name: str, value: Any, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False
) -> float:
    """``value`` as a float if it is a finite real number (not a bool or string) within the bounds
    (``lo_open`` / ``hi_open`` exclude the bound itself).

    Raises:
        ValueError: naming ``name``, the value and the range.
    """
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        try:
            v = float(value)
        except OverflowError:  # an int beyond float's range (a 400-digit literal)
            v = math.inf
        ok = math.isfinite(v) and (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)
    if not ok:
        left, right = "(" if lo_open or lo == -math.inf else "[", ")" if hi_open or hi == math.inf else "]"
        raise ValueError(f"{name}={value!r}: expected a finite number in {left}{lo:g}, {hi:g}{right}")
    return float(value)


def arg(check: Callable[..., Any], *bounds: Any, **options: Any) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses a flag's text as an int (``int_in``) or a float (``float_in``)
    and checks it: ``type=arg(float_in, 0, 1, hi_open=True)``."""
    parse = int if check is int_in else float

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            value = text
        try:
            return check("value", value, *bounds, **options)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{text!r}: {str(e).split(': ', 1)[1]}") from None

    convert.__name__ = "integer" if check is int_in else "number"  # argparse names the type in its error
    return convert


@dataclass(frozen=True)
class Range:
    """The bounds of a number field, kept in its metadata (``field(metadata={"range": Range(0, 1)})``):
    ``check_fields`` checks the field's value and ``vit_cli.flags`` the flag made from it, one rule for
    both. ``integer``: an int field (``int_in``), else a float one (``float_in``)."""

    lo: float = -math.inf
    hi: float = math.inf
    integer: bool = False
    lo_open: bool = False
    hi_open: bool = False

    def check(self, name: str, value: Any) -> Any:
        """``value`` if it lies in the range (``int_in`` / ``float_in``); ValueError naming it otherwise."""
        if self.integer:
            return int_in(name, value, int(max(self.lo, -MAX_INT)), int(min(self.hi, MAX_INT)))
        return float_in(name, value, self.lo, self.hi, lo_open=self.lo_open, hi_open=self.hi_open)

    def flag_type(self) -> Callable[[str], Any]:
        """An argparse ``type=`` checking this range (``arg``)."""
        if self.integer:
            return arg(int_in, int(max(self.lo, -MAX_INT)), int(min(self.hi, MAX_INT)))
        return arg(float_in, self.lo, self.hi, lo_open=self.lo_open, hi_open=self.hi_open)


def check_fields(obj: Any) -> None:
    """Check every field of the dataclass instance ``obj`` whose metadata holds a ``Range`` (None passes
    only for an optional field, one whose default is None, left unset).

    Raises:
        ValueError: the first field out of its range, or None where a number is needed, naming it, its
            value and the range.
    """
    for f in dataclasses.fields(obj):
        bounds, value = f.metadata.get("range"), getattr(obj, f.name)
        if bounds is None or (value is None and f.default is None):
            continue
        if value is None:
            raise ValueError(f"{f.name}=None: expected a number")
        bounds.check(f.name, value)


def check_sequence(cfg: Any, name: str) -> tuple | None:
    """``cfg.<name>`` (a list or tuple of numbers, or None) as a tuple of floats (``input_mean``,
    ``input_std``) or ints (``summary_idxs``).

    Raises:
        ValueError: not a sequence of finite numbers (of ints for ``summary_idxs``), naming it.
    """
    value, whole = getattr(cfg, name), name == "summary_idxs"
    if value is None:
        return None
    kind = "ints" if whole else "finite numbers"
    if not isinstance(value, (list, tuple)) or any(
        isinstance(v, bool) or not isinstance(v, (int, float)) or (whole and not isinstance(v, int)) for v in value
    ):
        raise ValueError(f"{name}={value!r}: expected a sequence of {kind}")
    out = tuple(int(v) if whole else float(v) for v in value)
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name}={value!r}: expected a sequence of {kind}")
    return out


def check_radio(cfg: Any) -> None:
    """RADIO's fields of a ``ViTConfig``: the input normalisation (``input_mean`` and ``input_std`` together,
    one value per channel, std > 0) and the summary (pool 'summary' takes summary_idxs, each a prefix token,
    and no rep_size).

    Raises:
        ValueError: naming the values and what was expected.
    """
    if (cfg.input_mean is None) != (cfg.input_std is None):
        raise ValueError(f"input_mean={cfg.input_mean} with input_std={cfg.input_std}: give both or neither")
    if cfg.input_mean is not None:
        if len(cfg.input_mean) != cfg.in_chans or len(cfg.input_std) != cfg.in_chans:
            raise ValueError(
                f"input_mean={cfg.input_mean}, input_std={cfg.input_std}: expected one value per channel "
                f"(in_chans={cfg.in_chans})"
            )
        if min(cfg.input_std) <= 0:
            raise ValueError(f"input_std={cfg.input_std}: expected values > 0")
    if cfg.pool == "summary":
        if not cfg.summary_idxs or not all(0 <= i < cfg.num_prefix_tokens for i in cfg.summary_idxs):
            raise ValueError(
                f"pool='summary' with summary_idxs={cfg.summary_idxs}: expected prefix token indices in "
                f"[0, {cfg.num_prefix_tokens})"
            )
        if cfg.rep_size:
            raise ValueError(f"pool='summary' takes no rep_size; got rep_size={cfg.rep_size}")


def memory_limit() -> int:
    """The most bytes one model, dataset or file member may need: ``VIT_MAX_BYTES`` if set (a number
    of bytes, or with a K/M/G/T suffix, binary: 10M and 10MiB are 10 x 2**20), else the machine's
    physical memory.

    Raises:
        ValueError: ``VIT_MAX_BYTES`` is not a positive size.
    """
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*(?:([KMGT])I?)?B?", text.upper())
    n = int(float(m.group(1)) * _UNITS[m.group(2) or ""]) if m else 0
    if n <= 0:
        raise ValueError(f"{LIMIT_ENV}={text!r}: expected a positive size such as 32G or 1000000")
    return n


def _gb(n: float) -> str:
    """``n`` bytes in decimal units (GB, MB, kB), three significant digits."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} bytes"


def check_bytes(what: str, need: int) -> None:
    """Raise unless ``need`` bytes (what a file or command declares) fit ``memory_limit()``.

    Raises:
        ValueError: naming ``what``, the size and the limit, and how to raise the limit.
    """
    limit = memory_limit()
    if need > limit:
        raise ValueError(
            f"{what} declares {_gb(need)}, beyond the limit of {_gb(limit)} "
            f"(set {LIMIT_ENV} to raise it if this is meant)"
        )


def model_bytes(cfg, batch: int = 1, seq: int | None = None, parameters: bool = True) -> int:
    """An estimate of the bytes a model needs: its parameters in ``cfg.param_dtype`` (unless
    ``parameters`` is False: a conversion streams them from the file) plus one forward pass's largest
    activations in float32 at ``batch`` images (the qkv or MLP hidden tensor of one block, and one block's
    attention logits) of ``seq`` tokens (None: those of ``cfg.image_size``)."""
    itemsize = _ITEMSIZE[cfg.param_dtype]
    if seq is None:
        grid = math.prod(-(-s // p) for s, p in zip(cfg.image_size, cfg.patch_size, strict=True))
        seq = cfg.num_prefix_tokens + grid
    activations = batch * (seq * max(3 * cfg.width, cfg.mlp_dim) + cfg.num_heads * seq * seq) * 4
    return (cfg.param_count() * itemsize if parameters else 0) + activations


def check_model_size(cfg, context: str, batch: int = 1, training: bool = False, parameters: bool = True) -> None:
    """Raise unless ``model_bytes(cfg, batch, parameters=parameters)`` fits ``memory_limit()``; with
    ``training``, also the gradients and AdamW's two moments (3 float32 values per parameter). Without
    ``parameters`` (a conversion, which holds about one tensor at a time) only the activations its
    config declares are counted, so that a declared image size is still bounded.

    Raises:
        ValueError: naming ``context``, the config's size fields, the estimate and the limit.
    """
    sizes = f"depth={cfg.depth}, width={cfg.width}, mlp_dim={cfg.mlp_dim}, image_size={tuple(cfg.image_size)}"
    what = "parameters, gradients, optimizer state and activations" if training else "parameters and activations"
    what = what if parameters else "activations"
    extra = 3 * 4 * cfg.param_count() if training else 0
    check_bytes(f"{context}: a model with {sizes} ({what})", model_bytes(cfg, batch, parameters=parameters) + extra)


def check_declared_sizes(context: str, tensors: Mapping[str, Any], depth: int, width: int, mlp_dim: int) -> None:
    """Raise if sizes a file declares before any config is built (a timm hub folder's ``model_args``, which
    timm.create_model would build a module a block of) claim more parameters than ``tensors`` hold: each
    of ``depth`` blocks holds at least the 4 D x D attention and the 2 D x F MLP weights.

    Raises:
        ValueError: naming ``context``, the sizes, the count they need and the count held.
    """
    held = sum(math.prod(np.shape(v)) for v in tensors.values())
    need = depth * (4 * width * width + 2 * width * mlp_dim)
    if need > held:
        raise ValueError(
            f"{context}: declares depth={depth}, width={width}, mlp_dim={mlp_dim}: {need:,} parameters in the "
            f"blocks alone, but the file holds {held:,} values in all"
        )


def check_holds(cfg, tensors: Mapping[str, Any], context: str) -> None:
    """Raise if ``cfg`` declares more parameters (its head left aside) than ``tensors`` hold in all:
    a stored or overridden config that does not describe the file (before any per-tensor check,
    which would list every missing tensor of the declared depth).

    Raises:
        ValueError: naming ``context``, the declared count and the count held.
    """
    held = sum(math.prod(np.shape(v)) for v in tensors.values())
    need = cfg.replace(num_classes=0).param_count()
    if need > held:
        raise ValueError(
            f"{context}: the config (depth={cfg.depth}, width={cfg.width}, mlp_dim={cfg.mlp_dim}) declares "
            f"{need:,} parameters besides the head, but the file holds {held:,} values in all"
        )


def check_weights(state: Mapping[str, Any], context: str) -> None:
    """Raise if a tensor is not floating point (an int or bool tensor is not a weight of this model).

    Raises:
        ValueError: naming the tensors and their dtypes.
    """
    bad = [f"{k} ({_dtype(v)})" for k, v in state.items() if not is_float(v)]
    if bad:
        raise ValueError(f"{context}: tensors that are not floating point: {', '.join(bad)}")


def _dtype(a: Any) -> np.dtype:
    """``a``'s dtype, without loading a lazy array (anything with a ``dtype``)."""
    return np.dtype(a.dtype) if hasattr(a, "dtype") else np.asarray(a).dtype


def is_float(a: Any) -> bool:
    """True for float16/32/64 and bfloat16 (ml_dtypes) arrays (lazy ones not loaded)."""
    dtype = _dtype(a)
    return np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16"


def regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` if it is a regular file (symlinks followed); checked before opening, so that a FIFO or
    device is refused instead of blocking.

    Raises:
        FileNotFoundError: no such path. IsADirectoryError: a folder. OSError: a symlink loop or an
        unreadable path. ValueError: a FIFO, device or socket.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such {what}") from None
    except OSError as e:
        raise OSError(e.errno, f"{path}: cannot be read ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{path}: a folder, expected a {what}")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise ValueError(f"{path}: {kind}, expected a regular {what}")
    return path
