"""PyTorch file containers (.pth, .pt, .bin) for ``vit_common.convert``, which cannot import torch.

Files are read with ``torch.load(weights_only=True)``: tensors, containers and primitives only, never
arbitrary pickled objects (``argparse.Namespace``, which timm's training checkpoints store as 'args', is
allowed where torch supports allow-listing). ``READERS`` and ``WRITERS`` are what
``vit_common.convert.load_checkpoint(readers=...)`` / ``save_checkpoint(writers=...)`` take.
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

from vit_common.formats.base import FormatError
from vit_common.io import atomic_write
from vit_torch.weights import numpy_to_tensor, tensor_to_numpy

# Entries of training checkpoints that hold the weights, in the order they are preferred (timm's
# load_state_dict takes 'state_dict' or 'model'; EMA weights only when nothing else is there).
WEIGHT_ENTRIES = ("state_dict", "model", "module", "state_dict_ema", "model_ema")


def _is_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and any(isinstance(v, torch.Tensor) for v in obj.values())


def _load(path: str | os.PathLike):
    safe = getattr(torch.serialization, "safe_globals", None)
    ctx = safe([argparse.Namespace]) if safe is not None else contextlib.nullcontext()
    try:
        with ctx:
            return torch.load(path, map_location="cpu", weights_only=True)
    except (
        RuntimeError,
        pickle.UnpicklingError,
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

    A plain state_dict is returned whole; a training checkpoint's weights are taken from the first of
    ``WEIGHT_ENTRIES`` it has, and its other entries (optimizer, epoch, args, EMA copy...) are reported
    as dropped. Non-tensor values inside the state_dict are dropped and reported too.

    Raises:
        FormatError: unreadable, refused by the weights-only loader, or holding no state_dict.
    """
    obj = _load(path)
    dropped: list[tuple[str, str]] = []
    if not _is_state_dict(obj):
        entry = next((k for k in WEIGHT_ENTRIES if isinstance(obj, Mapping) and _is_state_dict(obj.get(k))), None)
        if entry is None:
            keys = list(obj)[:8] if isinstance(obj, Mapping) else type(obj).__name__
            raise FormatError(
                f"{path}: holds no state_dict of tensors (top level: {keys}); expected one of "
                f"{WEIGHT_ENTRIES} or a plain state_dict"
            )
        dropped += [(str(k), f"training-checkpoint entry, the weights come from {entry!r}") for k in obj if k != entry]
        obj = obj[entry]
    tensors = {}
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            tensors[str(k)] = tensor_to_numpy(v)
        else:
            dropped.append((str(k), f"not a tensor ({type(v).__name__})"))
    return tensors, dropped


def write_torch_file(path: str | os.PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    """Write a plain state_dict with ``torch.save``, atomically; tensors contiguous (K10)."""
    state = {k: numpy_to_tensor(np.ascontiguousarray(v)) for k, v in tensors.items()}
    atomic_write(path, lambda tmp: torch.save(state, tmp))


READERS = {"torch": read_torch_file}
WRITERS = {"torch": write_torch_file}
