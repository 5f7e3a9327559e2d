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

from vit_common.system.tensor_files import Stage, contiguous, tiles


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


class Widened(LazyTensor):
    """``base`` (a bfloat16 or float16 array or lazy tensor) as float32, which holds every such value
    exactly: loaded whole in one C-order copy (``contiguous``), while ``RowSlice`` casts only its rows and
    ``same_bits`` a tile at a time, so that nothing holds the whole float32 tensor to compare or split it."""

    __slots__ = ("base",)

    def __init__(self, base: Tensor):
        super().__init__(np.shape(base), np.float32, lambda: contiguous(np.asarray(base), np.float32))
        self.base = base


class RowConcat(LazyTensor):
    """``parts`` (arrays or lazy tensors of one trailing shape and dtype) concatenated along axis 0."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Tensor]):
        shape = (sum(np.shape(p)[0] for p in parts), *np.shape(parts[0])[1:])
        super().__init__(shape, dtype_of(parts[0]), lambda: np.concatenate([np.asarray(p) for p in parts]))
        self.parts = tuple(parts)


class RowSlice(LazyTensor):
    """Rows ``lo:hi`` of ``base`` (an array or a lazy tensor that is neither a ``RowSlice`` nor a
    ``RowConcat``): a view of an array's rows, a copy of a lazy tensor's (so that the whole can go)."""

    __slots__ = ("base", "hi", "lo")

    def __init__(self, base: Tensor, lo: int, hi: int):
        super().__init__((hi - lo, *np.shape(base)[1:]), dtype_of(base), self._rows)
        self.base, self.lo, self.hi = base, lo, hi

    def _rows(self) -> np.ndarray:
        if isinstance(self.base, Widened):
            return contiguous(np.asarray(self.base.base)[self.lo : self.hi], np.float32)
        rows = np.asarray(self.base)[self.lo : self.hi]
        return np.ascontiguousarray(rows) if isinstance(self.base, np.ndarray) else rows.copy()


def concat_rows(parts: list[Tensor]) -> Tensor:
    """The tensors ``parts`` (same trailing shape and dtype) concatenated along axis 0, loaded on use.

    Rows sliced from one tensor and joined back in order are that tensor's rows again, loaded from it
    directly (``gate, up = row_slice(fc1, 0, f), row_slice(fc1, f, 2 * f)`` joined is ``fc1`` itself);
    a single part is returned as it is."""
    flat: list[Tensor] = []
    for p in parts:
        for q in p.parts if isinstance(p, RowConcat) else (p,):
            last = flat[-1] if flat else None
            if isinstance(q, RowSlice) and isinstance(last, RowSlice) and last.base is q.base and last.hi == q.lo:
                flat[-1] = row_slice(q.base, last.lo, q.hi)
            else:
                flat.append(q)
    return flat[0] if len(flat) == 1 else RowConcat(flat)


def row_slice(t: Tensor, lo: int, hi: int) -> Tensor:
    """Rows ``lo:hi`` of ``t``, loaded on use: ``t`` itself for all its rows, a slice of the part it was
    joined from for a ``concat_rows`` (nothing else of the join is loaded), a slice of the original for
    a slice; of an array, a view."""
    if (lo, hi) == (0, np.shape(t)[0]):
        return t
    if isinstance(t, RowSlice):
        return row_slice(t.base, t.lo + lo, t.lo + hi)
    if isinstance(t, RowConcat):
        pieces, start = [], 0
        for p in t.parts:
            end = start + np.shape(p)[0]
            if start < hi and lo < end:
                pieces.append(row_slice(p, max(lo, start) - start, min(hi, end) - start))
            start = end
        return concat_rows(pieces)
    return RowSlice(t, lo, hi)


def row_parts(t: Tensor) -> list[Tensor]:
    """Tensors whose rows, joined in order, are ``t``'s: a ``concat_rows``'s parts, else ``t`` alone; to
    check a join part by part without loading it whole."""
    return list(t.parts) if isinstance(t, RowConcat) else [t]


def identical(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` are known to hold the same bits without loading them: the same object,
    arrays over the same memory with the same layout, or the same rows of (or join of) such tensors.
    False says nothing (they may still be equal)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype) == (
            b.__array_interface__["data"][0],
            b.shape,
            b.strides,
            b.dtype,
        )
    if isinstance(a, RowSlice) and isinstance(b, RowSlice):
        return (a.lo, a.hi) == (b.lo, b.hi) and identical(a.base, b.base)
    if isinstance(a, RowConcat) and isinstance(b, RowConcat):
        return len(a.parts) == len(b.parts) and all(identical(p, q) for p, q in zip(a.parts, b.parts, strict=True))
    return False


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors (arrays or lazy ones) are bit-identical: without loading them when they are
    known to be (``identical``), else loaded and compared as unsigned integers of their item size, a
    tile at a time (``tiles``: no contiguous copies, no mask the size of the tensor), a transposed side's
    tile read through a ``Stage``; a ``Widened`` side is read as its base, each tile cast as it is
    compared."""
    dtype = dtype_of(a)
    if dtype != dtype_of(b) or np.shape(a) != np.shape(b):
        return False
    if identical(a, b):
        return True
    a, b = (np.atleast_1d(np.asarray(t.base if isinstance(t, Widened) else t)) for t in (a, b))
    if identical(a, b):  # two lazy tensors that load views of the same memory
        return True
    if dtype.itemsize not in (1, 2, 4, 8):  # an item size no unsigned integer has (complex128): byte for byte
        a, b = np.ascontiguousarray(a).reshape(-1).view(np.uint8), np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    bits = np.dtype(f"u{a.dtype.itemsize}") if a.dtype == b.dtype else np.dtype(f"u{dtype.itemsize}")
    if a.ndim > 1 and abs(a.strides[-1]) > min(abs(st) for st in a.strides):  # a is the transposed one
        a, b = b, a
    stage = Stage(b.shape, b.strides, b.dtype)
    for i in tiles(a.shape, a.strides, b.strides):
        held = stage(b[i])
        x, y = a[i], b[i] if held is None else held
        if x.dtype != y.dtype:  # one side Widened: its tile cast to the other's dtype
            x, y = x.astype(dtype, copy=False), y.astype(dtype, copy=False)
        if not np.array_equal(x.view(bits), y.view(bits)):
            return False
    return True


def materialize(tensors: TensorMap) -> dict[str, np.ndarray]:
    """Every tensor loaded into a writable numpy array (a read-only memory-mapped view is copied), in order."""
    out = {}
    for k, v in tensors.items():
        a = np.asarray(v)
        out[k] = a if a.flags.writeable else a.copy()
    return out
