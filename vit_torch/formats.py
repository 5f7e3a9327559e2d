"""PyTorch file containers (.pth, .pt, .bin) for ``vit_common.checkpoints.convert``, which cannot import torch.

Files are read with ``torch.load(weights_only=True)``: tensors, containers and primitives only, never
arbitrary pickled objects. Training checkpoints also hold a few harmless objects, which are allowed by
name (``SAFE_GLOBALS``): ``argparse.Namespace`` (timm's 'args'), numpy scalars, dtypes and plain arrays
(a saved best accuracy or epoch counter; numpy arrays of Python objects would need further globals and
stay refused). A file that is still refused is named with the global that blocked it.
``READERS`` and ``WRITERS`` are what ``vit_common.checkpoints.convert.load_checkpoint(readers=...)`` /
``save_checkpoint(writers=...)`` take; ``READERS["timm"]`` is timm's own reading of a timm hub folder's
config.json (``vit_torch.timm_models.read_hub_config``; None where timm is not installed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import zipfile
from collections.abc import Mapping

import numpy as np
import torch

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.source import WEIGHT_ENTRIES, choose_weights
from vit_common.system.io import atomic_write
from vit_torch.weights import numpy_to_tensor, tensor_to_numpy


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


def _load(path: str | os.PathLike):
    safe = getattr(torch.serialization, "safe_globals", None)
    ctx = safe(SAFE_GLOBALS) if safe is not None else contextlib.nullcontext()
    try:
        with ctx:
            return torch.load(path, map_location="cpu", weights_only=True)
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
    """(tensors as numpy, dropped entries with reasons) of a .pth/.pt/.bin file.

    A plain state_dict is returned whole; a training checkpoint's weights are taken from the entry
    ``vit_common.checkpoints.formats.source.choose_weights`` picks (``--weights-entry``; by default the
    first of ``WEIGHT_ENTRIES`` it has: EMA weights first, as timm's loader), its other weight entries
    are reported as dropped with the line stating the choice, and its other entries (optimizer, epoch,
    args...) as dropped. Non-tensor values inside the state_dict are dropped and reported too.

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
            (str(k), f"training-checkpoint entry, the weights come from {entry!r}")
            for k in obj
            if k != entry and k not in present
        ]
        obj = obj[entry]
    tensors = {}
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            tensors[str(k)] = tensor_to_numpy(v)
        else:
            dropped.append((str(k), f"not a tensor ({type(v).__name__})"))
    return tensors, dropped


def write_torch_file(path: str | os.PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    """Write a plain state_dict with ``torch.save``, atomically; tensors made contiguous."""
    state = {k: numpy_to_tensor(np.ascontiguousarray(v)) for k, v in tensors.items()}
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def read_timm_hub_config(folder: str | os.PathLike):
    """``vit_torch.timm_models.read_hub_config``, imported when a timm hub folder is read."""
    from vit_torch.timm_models import read_hub_config

    return read_hub_config(folder)


READERS = {"torch": read_torch_file, "timm": read_timm_hub_config}
WRITERS = {"torch": write_torch_file}
