"""CRC-32s of a checkpoint's arrays, recorded by the writer in the folder's JSON file and checked on every read:
orbax and tensorstore store no checksum of an array's bytes, so an orbax data file zero-filled, with a byte
flipped or overwritten by another file of its size reads back as other values without an error.

Each array's entry (``RECORD_KEY``: ``{path: {"dtype", "shape", "crc32"}}``, ``path`` the tree's keys joined by
dots, ``blocks.3.attn.qkv.kernel``) holds the CRC-32 (``zlib.crc32``) of its elements' little-endian bytes in
C order, the bytes an uncompressed orbax folder stores; ``record`` makes it and ``check_record`` compares a
restored tree with it. Both read one array at a time, a non-contiguous one (a transposed view) in chunks of
about ``CHUNK_BYTES``, so neither holds a copy of the model.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError

RECORD_KEY = "state_crc32"  # the entry of a folder's JSON file holding its arrays' CRC-32s
CHUNK_BYTES = 4 << 20  # at most about this many bytes of a non-contiguous array are copied at a time


def leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) of every leaf of a nested mapping of arrays, the keys joined by dots, in key order."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from leaves(value, f"{path}.")
        else:
            yield path, value


def array_crc32(arr: np.ndarray) -> int:
    """CRC-32 of ``arr``'s elements as little-endian bytes in C order; a view that is not C-contiguous is
    copied ``CHUNK_BYTES`` at a time."""
    arr = np.atleast_1d(arr)
    little = arr.dtype.newbyteorder("<")
    rows = max(1, CHUNK_BYTES // max(1, arr[0].nbytes)) if len(arr) else 1
    crc = 0
    for i in range(0, len(arr), rows):
        crc = zlib.crc32(np.ascontiguousarray(arr[i : i + rows], little).reshape(-1).view(np.uint8), crc)
    return crc


def _entry(arr: np.ndarray) -> dict[str, Any]:
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "crc32": array_crc32(arr)}


def record(tree: Mapping[str, Any], to_host: Callable[[Any], np.ndarray] = np.asarray) -> dict[str, dict[str, Any]]:
    """``RECORD_KEY``'s value for a nested mapping of arrays (orbax's tree, string keys): each leaf's dtype
    name, shape and CRC-32, by path (each leaf brought to the host by ``to_host`` in turn)."""
    return {path: _entry(to_host(arr)) for path, arr in leaves(tree)}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _dtype_name(name: str) -> bool:
    """Whether ``name`` is the name of a numeric numpy dtype (``ml_dtypes``' too: bfloat16)."""
    import ml_dtypes

    try:
        dtype = np.dtype(getattr(ml_dtypes, name, name))
    except TypeError:
        return False
    return dtype.name == name and (dtype.kind in "biufc" or hasattr(ml_dtypes, name))


def _malformed(entry: Any) -> str:
    """What is wrong with one entry of ``RECORD_KEY`` (a mapping of a dtype name, a shape of non-negative
    ints and a CRC-32 in [0, 2**32)), '' if nothing."""
    if not isinstance(entry, Mapping) or set(entry) != {"dtype", "shape", "crc32"}:
        return f"{entry!r} (expected dtype, shape and crc32)"
    dtype, shape, crc = entry["dtype"], entry["shape"], entry["crc32"]
    if not _is_int(crc) or not 0 <= crc < 2**32:
        return f"crc32 {crc!r} (expected an integer in [0, 2**32))"
    if not isinstance(dtype, str) or not _dtype_name(dtype):
        return f"dtype {dtype!r} (expected a numeric dtype name)"
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        return f"shape {shape!r} (expected a list of non-negative integers)"
    return ""


def check_record(
    recorded: Any,
    tree: Mapping[str, Any],
    where: str,
    source: str,
    to_host: Callable[[Any], np.ndarray] = np.asarray,
) -> None:
    """Compare each leaf of ``tree`` (the arrays as restored, each brought to the host by ``to_host`` in
    turn) with its entry in ``recorded`` (``record``'s value, as read from the JSON file ``source``).

    Raises:
        FormatError: ``recorded`` is not such a mapping, or an entry of it is malformed (a crc32 that is no
            integer in [0, 2**32), a dtype that is no numeric dtype name, a shape that is no list of
            non-negative integers: named as the JSON file's entry, not as damaged data); or an array whose
            dtype, shape or CRC-32 differs from its entry, or that has none, or an entry whose array is
            missing: one line naming ``where`` (the folder holding the arrays) and the array's path.
    """
    if not isinstance(recorded, Mapping):
        raise FormatError(f"{where}: {source}'s {RECORD_KEY} entry is not a mapping of paths to dtype, shape and crc32")
    for path, entry in recorded.items():
        if bad := _malformed(entry):
            raise FormatError(f"{where}: {source}'s {RECORD_KEY} entry is malformed: {path} has {bad}")
    seen = set()
    for path, arr in leaves(tree):
        seen.add(path)
        if path not in recorded:
            raise FormatError(f"{where}: array {path} has no checksum in {source}, which vit recorded when writing it")
        if _entry(to_host(arr)) != dict(recorded[path]):
            raise FormatError(
                f"{where}: array {path} does not match the checksum {source} recorded when vit wrote it: "
                "the data files were changed or damaged"
            )
    if missing := sorted(set(recorded) - seen):
        raise FormatError(f"{where}: array {missing[0]}, which {source} records a checksum for, was not restored")
