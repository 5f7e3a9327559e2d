"""PyTorch file containers (.pth, .pt, .bin) for ``vit_common.checkpoints.convert``, which cannot import torch.

Files are read with ``torch.load(weights_only=True)``: tensors, containers and primitives only, never
arbitrary pickled objects. A zip-format file (what ``torch.save`` has written since PyTorch 1.6) is
memory-mapped (``mmap=True``): its tensors are read-only numpy views of the file's pages, which belong
to the page cache, not to the process, so a file larger than the free memory can be converted; a legacy
(pre-1.6, non-zip) file cannot be mapped and is read whole. Training checkpoints also hold a few
harmless objects, which are allowed by name (``SAFE_GLOBALS``): ``argparse.Namespace`` (timm's
'args'), numpy scalars, dtypes and plain arrays (a saved best accuracy or epoch counter; numpy arrays
of Python objects would need further globals and stay refused). A file that is still refused is named
with the global that blocked it.
``READERS`` and ``WRITERS`` are what ``vit_common.checkpoints.convert.load_checkpoint(readers=...)`` /
``save_checkpoint(writers=...)`` take; ``READERS["timm"]`` is timm's own reading of a timm hub folder's
config.json (``vit_torch.timm_models.read_hub_config``; None where timm is not installed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.source import WEIGHT_ENTRIES, choose_weights, verified_torch_file
from vit_common.system.io import atomic_write
from vit_common.system.tensor_files import fill_stored_members, save_under_name
from vit_torch.weights import tensor_to_numpy


def _safe_globals() -> list:
    """Globals a weights-only load may construct: argparse.Namespace and numpy's scalar, array and dtype
    reconstructors, under numpy 2's module names and numpy 1's (pickles keep the writer's names)."""
    try:
        from numpy._core import multiarray  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1
        from numpy.core import multiarray
    dtypes = [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")] if hasattr(np, "dtypes") else []
    out = [argparse.Namespace, np.ndarray, np.dtype, multiarray.scalar, multiarray._reconstruct, *dtypes]
    for name in ("scalar", "_reconstruct"):  # written by numpy 1
        out.append((getattr(multiarray, name), f"numpy.core.multiarray.{name}"))
    return out


SAFE_GLOBALS = _safe_globals()


def _blocking_globals(path) -> list[str]:
    """The globals in ``path``'s pickle that the weights-only loader does not allow (torch >= 2.5)."""
    find = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if find is None:
        return []
    allowed = {f"{g.__module__}.{g.__qualname__}" if not isinstance(g, tuple) else g[1] for g in SAFE_GLOBALS}
    try:
        return [g for g in find(path) if g not in allowed]
    except Exception:  # noqa: BLE001 - a damaged file: the load error says what is wrong
        return []


def _is_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and any(isinstance(v, torch.Tensor) for v in obj.values())


_ZIP_MAGIC = b"PK\x03\x04"  # a zip file's first local header: torch.save's format since PyTorch 1.6


def _is_zip(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == _ZIP_MAGIC
    except OSError:
        return False  # torch.load names the error


def _load(path: str | os.PathLike):
    """``torch.load`` of ``path``, weights only, memory-mapped where the file is a zip (legacy files are
    read whole)."""
    safe = getattr(torch.serialization, "safe_globals", None)
    ctx = safe(SAFE_GLOBALS) if safe is not None else contextlib.nullcontext()
    try:
        with ctx:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=_is_zip(path))
    except pickle.UnpicklingError as e:
        blocked = _blocking_globals(path)
        if blocked:
            raise FormatError(
                f"{path}: not a readable PyTorch weights file: it pickles {', '.join(blocked)}, which the "
                "weights-only loader refuses (loading it could run code). Re-save the weights alone, e.g. "
                "torch.save(checkpoint['state_dict'], ...) or as safetensors, where you trust the file"
            ) from e
        raise FormatError(f"{path}: not a readable PyTorch weights file (UnpicklingError: {e})") from e
    except (
        RuntimeError,
        EOFError,
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        IndexError,
        zipfile.BadZipFile,
        UnicodeDecodeError,
        NotImplementedError,
    ) as e:
        raise FormatError(f"{path}: not a readable PyTorch weights file ({type(e).__name__}: {e})") from e


def read_torch_file(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], list[tuple[str, str]]]:
    """(tensors as numpy, dropped entries with reasons) of a .pth/.pt/.bin file: read-only views of the
    loaded (memory-mapped: see the module) tensors, copied only where a tensor is not contiguous.

    A plain state_dict is returned whole; a training checkpoint's weights are taken from the entry
    ``vit_common.checkpoints.formats.source.choose_weights`` picks (``--weights-entry``; by default the
    first of ``WEIGHT_ENTRIES`` it has: EMA weights first, as timm's loader), its other weight entries
    are reported as dropped with the line stating the choice, and its other entries (optimizer, epoch,
    args...) as dropped. Non-tensor values inside the state_dict are dropped and reported too. The
    members' CRC-32s are checked before, by the caller (``source.load_tensors``: ``verified_torch_file``).

    Raises:
        FormatError: unreadable, refused by the weights-only loader, holding no state_dict, or lacking
            the entry asked for.
    """
    obj = _load(path)
    dropped: list[tuple[str, str]] = []
    if not _is_state_dict(obj):
        present = [k for k in WEIGHT_ENTRIES if isinstance(obj, Mapping) and _is_state_dict(obj.get(k))]
        if not present:
            keys = list(obj)[:8] if isinstance(obj, Mapping) else type(obj).__name__
            raise FormatError(
                f"{path}: holds no state_dict of tensors (top level: {keys}); expected one of "
                f"{WEIGHT_ENTRIES} or a plain state_dict"
            )
        entry, others = choose_weights(path, present)
        dropped += others
        dropped += [
            (
                str(k),
                f"optimizer state, not used (vit train --init-optimizer continues with it; the weights come from "
                f"{entry!r})"
                if k == "optimizer"
                else f"training-checkpoint entry, the weights come from {entry!r}",
            )
            for k in obj
            if k != entry and k not in present
        ]
        obj = obj[entry]
    tensors = {}
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            tensors[str(k)] = _numpy_view(v)
        else:
            dropped.append((str(k), f"not a tensor ({type(v).__name__})"))
    return tensors, dropped


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    """A read-only numpy view of ``t``'s memory (torch.bfloat16 as ml_dtypes.bfloat16, bit-exact); a
    non-contiguous tensor is copied first."""
    t = t.detach().contiguous()
    a = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()
    a.flags.writeable = False
    return a


def read_timm_optimizer(path: str | os.PathLike, entry: str = "state_dict") -> dict:
    """The AdamW state of a timm training checkpoint (``timm/train.py``'s ``CheckpointSaver``: a dict of
    ``state_dict``, ``optimizer``, ``epoch``, ``args``, maybe ``state_dict_ema``) by canonical names:
    {"count": steps taken, "mu": {name: exp_avg}, "nu": {name: exp_avg_sq}} (numpy, PyTorch layouts),
    the form ``vit_jax.optimizer_state.with_adam_state`` takes.

    The optimizer's state numbers parameters through its groups; the names come back from the weights
    ``entry`` (its keys in ``named_parameters()`` order, DDP's ``module.`` removed) grouped as
    ``timm.optim.create_optimizer_v2`` groups them (``vit_common.training.recipes.timm_param_groups``) with the
    checkpoint's ``args.weight_decay`` / ``args.layer_decay`` (without ``args``: layer decay where the
    groups hold ``lr_scale``, weight-decay groups where any group decays). Read with the weights-only
    loader, as ``read_torch_file``, after its members' CRC-32s are checked (``verified_torch_file``).

    Raises:
        FormatError: unreadable; no ``optimizer`` entry or weights ``entry``; an optimizer other than
            Adam/AdamW (no ``exp_avg_sq``); groups whose sizes the names do not give; a moment whose shape
            is not its parameter's (named); steps that differ between parameters. ValueError: a step that
            is not a whole number in [0, 2^31 - 1], a moment that is not finite, a negative second moment
            (``vit_common.training.adam_values``), naming the file and the tensor.
    """
    from vit_common.training.adam_values import adam_step, check_adam_values
    from vit_common.training.recipes import timm_param_groups

    verified_torch_file(path)
    obj = _load(path)
    opt = obj.get("optimizer") if isinstance(obj, Mapping) else None
    if not (isinstance(opt, Mapping) and isinstance(opt.get("state"), Mapping) and opt.get("param_groups")):
        raise FormatError(f"{path}: holds no optimizer state (expected timm's training checkpoint: 'optimizer')")
    weights = obj.get(entry)
    if not _is_state_dict(weights):
        raise FormatError(f"{path}: holds no {entry!r} weights to name the optimizer state with")
    params = [(k.removeprefix("module."), v.ndim) for k, v in weights.items() if isinstance(v, torch.Tensor)]
    shapes = {k.removeprefix("module."): tuple(v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}
    args, groups = obj.get("args"), opt["param_groups"]
    if args is not None and hasattr(args, "weight_decay"):
        wd, ld = args.weight_decay, getattr(args, "layer_decay", None)
        how = f"args weight_decay={wd}, layer_decay={ld}"
    else:
        wd, ld = max(g.get("weight_decay", 0.0) for g in groups), 1.0 if "lr_scale" in groups[0] else None
        how = "the groups' weight_decay and lr_scale (no args)"
    named = timm_param_groups(params, wd, ld)
    sizes, want = [len(g["params"]) for g in groups], [len(g) for g in named]
    if sizes != want:
        raise FormatError(
            f"{path}: the optimizer's parameter groups hold {sizes} tensors; the {len(params)} tensors of "
            f"{entry!r} grouped as timm.optim.create_optimizer_v2 does ({how}) give {want}"
        )
    index = {i: n for g, ns in zip(groups, named, strict=True) for i, n in zip(g["params"], ns, strict=True)}
    mu, nu, steps = {}, {}, set()
    for i, state in opt["state"].items():
        name = index.get(i)
        if name is None or not {"exp_avg", "exp_avg_sq", "step"} <= set(state):
            raise FormatError(f"{path}: optimizer state {i} is not an Adam state of a parameter ({sorted(state)})")
        for what, table in (("exp_avg", mu), ("exp_avg_sq", nu)):
            if tuple(state[what].shape) != shapes[name]:
                raise FormatError(
                    f"{path}: optimizer {what} of {name!r} has shape {tuple(state[what].shape)}, the parameter "
                    f"{shapes[name]}"
                )
            table[name] = tensor_to_numpy(state[what])
        steps.add(adam_step(f"{path}: optimizer state of {name!r}", state["step"]))
    if len(steps) > 1:
        raise FormatError(f"{path}: the parameters' Adam steps differ ({sorted(steps)}): expected one count")
    check_adam_values(f"{path}: optimizer", mu, nu)
    return {"count": steps.pop() if steps else 0, "mu": mu, "nu": nu}


def write_torch_file(path: str | os.PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    """Write a plain state_dict as ``torch.save`` writes it, atomically, one tensor in memory at a time:
    ``torch.save`` under ``torch.serialization.skip_data()`` writes the pickle and reserves each tensor's
    record from placeholders of its shape and dtype (``torch.empty``, whose pages are never touched),
    then each record is filled with its tensor's C-order bytes and given its CRC-32
    (``fill_stored_members``), and the ``.data/serialization_id`` record is set to what ``torch.save``
    derives from those CRC-32s (all stay 0 under ``torch.serialization.set_crc32_options(False)``, as
    ``torch.save`` leaves them). The file's bytes equal ``torch.save``'s for the same tensors, made
    contiguous (``tests/test_torch_files.py``). The zip's records lie under the folder
    ``torch.save(state, path)`` names (``model/`` for ``model.pth``), not the temporary's name.

    Raises:
        ValueError: a dtype torch has no tensor type for (a structured or object array).
    """
    placeholders = {k: torch.empty(np.shape(v), dtype=_torch_dtype(v.dtype)) for k, v in tensors.items()}
    atomic_write(
        path, lambda tmp: save_under_name(tmp, Path(path).name, lambda p: _save_filled(p, tensors, placeholders))
    )


def _save_filled(path: Path, tensors: Mapping[str, np.ndarray], placeholders: Mapping[str, torch.Tensor]) -> None:
    """``torch.save(placeholders)`` without their bytes, then each record filled from ``tensors``: torch
    numbers the records of distinct storages in the order the pickle meets them (the dict's order).
    An older torch, without ``skip_data``, is handed every tensor at once."""
    if not hasattr(torch.serialization, "skip_data"):
        torch.save({k: _shared_tensor(v) for k, v in tensors.items()}, path)
        return
    with torch.serialization.skip_data():
        torch.save(placeholders, path)
    with zipfile.ZipFile(path) as zf:
        archive = zf.namelist()[0].rpartition("/")[0]  # the folder of data.pkl, torch's first record
    records = {f"{archive}/data/{i}": v for i, v in enumerate(tensors.values()) if np.size(v)}
    crc = torch.serialization.get_crc32_options()
    fill_stored_members(path, records, crc)
    if not crc:  # torch.save stores 0 for every CRC-32, and the serialization id skip_data wrote
        return
    ident = f"{archive}/{_SERIALIZATION_ID}"
    with zipfile.ZipFile(path) as zf:
        crcs = [i.CRC for i in zf.infolist() if i.file_size and i.filename != ident]
        old = zf.read(ident) if ident in zf.namelist() else None
    if old is not None:
        fill_stored_members(path, {ident: np.frombuffer(_serialization_id(old, crcs), np.uint8)})


def _shared_tensor(a) -> torch.Tensor:
    """A torch tensor over ``a``'s memory (ml_dtypes.bfloat16 as torch.bfloat16, bit-exact), copied only to
    make it contiguous; read-only arrays included (torch warns that writing to one is undefined: nothing
    writes to it here)."""
    a = np.ascontiguousarray(a).reshape(np.shape(a))  # ascontiguousarray makes a 0-d array 1-d
    bf16 = a.dtype == ml_dtypes.bfloat16
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        t = torch.from_numpy(a.view(np.int16) if bf16 else a)
    return t.view(torch.bfloat16) if bf16 else t


_SERIALIZATION_ID = ".data/serialization_id"
_MASK64 = 2**64 - 1


def _serialization_id(old: bytes, crcs: list[int]) -> bytes:
    """The ``.data/serialization_id`` record ``torch.save`` writes (caffe2/serialize/inline_container.cc,
    ``writeSerializationId``): 20 digits hashed from the record names, kept from ``old``, then 20 digits
    of the CRC-32s of the non-empty records before it, in order, folded with ``c10::hash_combine``."""
    combined = 0
    for crc in crcs:
        combined ^= (crc + 0x9E3779B9 + ((combined << 6) & _MASK64) + (combined >> 2)) & _MASK64
    return old[:20] + b"%020d" % combined


def _torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of numpy ``dtype`` (ml_dtypes.bfloat16 as torch.bfloat16)."""
    dtype = np.dtype(dtype)
    if dtype == ml_dtypes.bfloat16:
        return torch.bfloat16
    try:
        return torch.from_numpy(np.empty(0, dtype.newbyteorder("="))).dtype
    except TypeError as e:
        raise ValueError(f"a .pth cannot hold tensors of dtype {dtype}") from e


def read_timm_hub_config(folder: str | os.PathLike):
    """``vit_torch.timm_models.read_hub_config``, imported when a timm hub folder is read."""
    from vit_torch.timm_models import read_hub_config

    return read_hub_config(folder)


READERS = {"torch": read_torch_file, "timm": read_timm_hub_config}
WRITERS = {"torch": write_torch_file}
