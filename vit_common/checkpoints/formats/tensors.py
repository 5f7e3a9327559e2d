"""Tensors that load when they are used: how checkpoints stream through the formats.

A reader's tensors and a writer's input are a ``TensorMap``: a mapping from name to a numpy array or a
``LazyTensor``, whose shape and dtype are known without its data and whose values are produced by a thunk
each time ``np.asarray`` (``__array__``) asks for them, never kept. Files are opened as views that hold
no anonymous memory (a safetensors file or a stored .npz member is a read-only memory map of its
bytes); the format rules' reshapes, transposes and concatenations are ``LazyTensor``s over them; a
writer that streams (safetensors, .npz, sharded HF folders) asks for one tensor at a time and lets it
go, so converting between such formats holds about one tensor in memory at once. ``np.shape``,
``np.ndim`` and ``dtype_of`` answer without loading; ``materialize`` loads a whole map into owned,
writable arrays (what ``load_checkpoint`` returns, and what writers whose libraries need the whole tree
at once, orbax and torch pickles, are given).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np


class LazyTensor:
    """An array of known ``shape`` and ``dtype`` whose values ``load`` (a thunk) produces on demand.

    ``np.asarray(t)`` calls the thunk (every time: nothing is cached) and checks that the result has the
    declared shape and dtype; ``np.shape(t)``, ``np.ndim(t)``, ``t.nbytes`` do not load it.

    Raises (on load):
        AssertionError: the thunk produced another shape or dtype than declared (a format bug).
    """

    __slots__ = ("_load", "dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype, load: Callable[[], np.ndarray]):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._load = load

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def load(self) -> np.ndarray:
        """The values, freshly produced."""
        a = np.asarray(self._load())
        if a.shape != self.shape or a.dtype != self.dtype:
            raise AssertionError(f"a lazy tensor declared {self.shape} {self.dtype} but produced {a.shape} {a.dtype}")
        return a

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self.load()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"LazyTensor({self.shape}, {self.dtype})"


Tensor = np.ndarray | LazyTensor
TensorMap = Mapping[str, Tensor]


def dtype_of(v) -> np.dtype:
    """The dtype of an array or ``LazyTensor`` without loading it."""
    dtype = getattr(v, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(v).dtype


def nbytes_of(v) -> int:
    """The bytes of an array or ``LazyTensor`` without loading it."""
    return math.prod(np.shape(v)) * dtype_of(v).itemsize


def concat_rows(parts: list[Tensor]) -> LazyTensor:
    """The tensors ``parts`` (same trailing shape and dtype) concatenated along axis 0, loaded on use."""
    shape = (sum(np.shape(p)[0] for p in parts), *np.shape(parts[0])[1:])
    return LazyTensor(shape, dtype_of(parts[0]), lambda: np.concatenate([np.asarray(p) for p in parts]))


def row_slice(t: Tensor, lo: int, hi: int) -> LazyTensor:
    """Rows ``lo:hi`` of ``t`` (a contiguous copy), loaded on use."""
    return LazyTensor((hi - lo, *np.shape(t)[1:]), dtype_of(t), lambda: np.ascontiguousarray(np.asarray(t)[lo:hi]))


def materialize(tensors: TensorMap) -> dict[str, np.ndarray]:
    """Every tensor loaded into a writable numpy array (a read-only memory-mapped view is copied), in order."""
    out = {}
    for k, v in tensors.items():
        a = np.asarray(v)
        out[k] = a if a.flags.writeable else a.copy()
    return out
