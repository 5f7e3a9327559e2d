"""Tensor files written as a stream: safetensors and .npz bytes produced one tensor at a time.

The tensors come as a mapping whose values are numpy arrays or anything ``np.asarray`` turns into one
(a lazy tensor that computes its values when asked, with ``shape`` and ``dtype`` known beforehand): the
writers ask for each tensor once, write its bytes and let it go, so a file of any size is written
holding one tensor in memory. ``vit_common.system.io`` calls these on its temporary files (atomic
writes); nothing here names a destination.

safetensors (https://huggingface.co/docs/safetensors, "Format"): 8 bytes little-endian N, an N-byte JSON
header ``{"__metadata__": {str: str}, NAME: {"dtype", "shape", "data_offsets": [begin, end]}, ...}``
padded with spaces to a multiple of 8, then the tensors' little-endian bytes, C order, at their offsets.
The header is laid out as the safetensors library (0.8) lays it out: tensors ordered by dtype, widest
first, then by name, compact JSON, so the bytes equal ``safetensors.numpy.save_file``'s
(``tests/test_streaming.py``), except that several metadata keys are sorted (the library writes them in
its hash map's order, which varies from run to run). .npz: a zip of stored ``NAME.npy`` members written with
``np.lib.format.write_array``, each opened with ``force_zip64`` as ``np.savez`` does. Stored members of
a zip whose writer reserved their space without writing them (``torch.save`` under
``torch.serialization.skip_data()``) are filled in place, one at a time (``fill_stored_members``).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

# numpy dtype name -> safetensors dtype, in the order of safetensors' ``Dtype`` enum (the file orders
# tensors by it, descending)
SAFETENSORS_DTYPES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
}
_RANK = {name: i for i, name in enumerate(SAFETENSORS_DTYPES)}
_WRITE_CHUNK = 1 << 20  # bytes of an .npz member handed to zipfile at a time: its CRC-32 reads them in cache


TILE = 256  # elements along each of the two axes a tile cuts (256 x 256 float32: 256 KiB, within L2)
_TILE_ELEMENTS = 1 << 20  # the most elements of a block of rows, where the layouts agree (its mask: 1 MiB)


def tiles(shape: tuple[int, ...], *strides: tuple[int, ...]) -> Iterator[tuple[slice, ...]]:
    """Index tuples whose blocks cover an array of ``shape`` once, for arrays laid out with ``strides`` (one
    tuple of byte strides per array): where the arrays' fastest axes differ (a transposed view beside a
    C-ordered array), blocks of ``TILE`` along each of them and whole along the others, so that both
    sides of a copy or a comparison are read a few cache lines at a time instead of one element per
    line; where they agree, blocks of rows of at most ``_TILE_ELEMENTS`` elements."""
    shape = tuple(shape)
    if not shape or math.prod(shape) == 0:
        yield (slice(None),) * len(shape)
        return
    long = [i for i, n in enumerate(shape) if n > 1] or [0]
    cut = sorted({min(long, key=lambda i, st=st: abs(st[i])) for st in strides})
    if len(cut) < 2:
        step = max(1, _TILE_ELEMENTS // max(1, math.prod(shape[1:])))
        for i in range(0, shape[0], step):
            yield (slice(i, i + step),)
        return
    ranges = [range(0, shape[a], TILE) for a in cut]
    for starts in itertools.product(*ranges):
        index = [slice(None)] * len(shape)
        for a, i in zip(cut, starts, strict=True):
            index[a] = slice(i, i + TILE)
        yield tuple(index)


class Stage:
    """A scratch buffer through which a tile of a strided view is read in its own memory order (whole cache
    lines, one after another) before numpy reorders it, in cache, into another layout. Its rows are padded
    by ``PAD`` elements: a kernel with rows of 4 KiB (ViT-L's 1024 float32) read a column at a time maps
    every element to one cache set, and a tile of 256 rows then evicts itself; through the padded buffer a
    transposed copy of ViT-L/16 kernels ran 3.0 GB/s of CPU time where the tiles alone ran 1.3 and numpy 0.7.

    ``stage(v)``: a view of the buffer holding ``v``'s values, for tiles of ``tiles(shape, v_strides, ...)``;
    None where the buffer would exceed ``_STAGE_BYTES`` (the caller copies directly).
    """

    PAD = 16

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype):
        self.order = tuple(int(i) for i in np.argsort([-abs(s) for s in strides], kind="stable"))
        self.back = tuple(int(i) for i in np.argsort(self.order))
        dims = [min(shape[i], TILE) for i in self.order]
        dims[-1] += self.PAD
        self.buffer = np.empty(dims, dtype) if math.prod(dims) * dtype.itemsize <= _STAGE_BYTES else None

    def __call__(self, v: np.ndarray) -> np.ndarray | None:
        if self.buffer is None:
            return None
        ordered = v.transpose(self.order)
        if any(n > m for n, m in zip(ordered.shape, self.buffer.shape, strict=True)):
            return None
        held = self.buffer[tuple(slice(0, n) for n in ordered.shape)]
        np.copyto(held, ordered)
        return held.transpose(self.back)


_STAGE_BYTES = 4 << 20  # the most bytes of a Stage's buffer


def contiguous(a: np.ndarray, dtype: np.dtype | type | None = None) -> np.ndarray:
    """``a`` in C order (cast to ``dtype`` if given): ``a`` itself where it is, else a copy made a tile at a
    time (``tiles``), each tile read in ``a``'s memory order through a ``Stage`` and cast as it is stored:
    numpy's own copy of a transposed kernel reads one element per cache line (measured on the B/16 and
    L/16 float32 kernels, 2 to 16 MiB, CPU time: numpy 0.7 to 1.4 GB/s, this 3.0 to 3.2 GB/s; AVX-512,
    2 cores). A cast of a transposed view is one copy, not a cast in ``a``'s order and then a reorder."""
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    if a.flags.c_contiguous:
        return a if a.dtype == dtype else a.astype(dtype)
    out = np.empty(a.shape, dtype)
    stage = Stage(a.shape, a.strides, a.dtype)
    for index in tiles(a.shape, a.strides, out.strides):
        held = stage(a[index])
        out[index] = a[index] if held is None else held
    return out


def _spec(v: Any) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of an array or a lazy tensor, without loading the latter."""
    dtype = np.dtype(v.dtype) if hasattr(v, "dtype") else np.asarray(v).dtype
    return tuple(int(s) for s in np.shape(v)), dtype


def _le_bytes(v: Any) -> memoryview:
    """The tensor's values as C-order little-endian bytes (a view where they are already so)."""
    a = contiguous(np.asarray(v))
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return memoryview(a.reshape(-1).view(np.uint8))


def safetensors_header(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None) -> tuple[bytes, list[str]]:
    """(the file's first 8 + N bytes, the tensor names in file order) for ``tensors`` (from their shapes
    and dtypes; nothing is loaded) and string ``metadata``.

    Raises:
        ValueError: a dtype safetensors cannot hold, or metadata that is not str -> str (names it).
    """
    specs = {k: _spec(v) for k, v in tensors.items()}
    bad = [f"{k} ({d})" for k, (_, d) in specs.items() if d.name not in SAFETENSORS_DTYPES]
    if bad:
        raise ValueError(f"safetensors cannot hold the dtype of {', '.join(bad)}")
    meta = dict(metadata or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise ValueError(f"safetensors metadata must map str to str, got {meta!r}")
    order = sorted(specs, key=lambda k: (-_RANK[specs[k][1].name], k))
    header: dict[str, Any] = {"__metadata__": dict(sorted(meta.items()))} if meta else {}
    offset = 0
    for k in order:
        shape, dtype = specs[k]
        n = math.prod(shape) * dtype.itemsize
        header[k] = {
            "dtype": SAFETENSORS_DTYPES[dtype.name],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, order


def write_safetensors(fh: IO[bytes], tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> int:
    """Write ``tensors`` as a safetensors file to the open binary file ``fh``, one tensor in memory at a
    time; returns the bytes written.

    Raises:
        ValueError: as ``safetensors_header``.
    """
    head, order = safetensors_header(tensors, metadata)
    fh.write(head)
    total = len(head)
    for k in order:
        total += fh.write(_le_bytes(tensors[k]))
    return total


def write_npz(fh: IO[bytes], arrays: Mapping[str, Any]) -> None:
    """Write ``arrays`` as an uncompressed .npz to the open binary file ``fh``, member by member, as
    ``np.savez`` does (no pickled objects)."""
    with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for k, v in arrays.items():
            with zf.open(f"{k}.npy", "w", force_zip64=True) as member:
                _write_npy(member, np.asarray(v))


def _write_npy(fh: IO[bytes], a: np.ndarray) -> None:
    """``a`` as ``np.lib.format.write_array`` writes it (the same header and bytes; Fortran order kept),
    its data handed to ``fh`` as views of ``_WRITE_CHUNK`` bytes (numpy's writer copies it to bytes 16 MiB
    at a time), each of which zipfile's CRC-32 and the write then read while it is in cache.

    Raises:
        ValueError: an object array (it would need a pickle).
    """
    if a.dtype.hasobject:
        raise ValueError(f"an .npz member of dtype {a.dtype} would need a pickle")
    header = np.lib.format.header_data_from_array_1_0(a)
    try:
        np.lib.format.write_array_header_1_0(fh, header)
    except ValueError:  # a header over 64 KiB
        np.lib.format.write_array_header_2_0(fh, header)
    data = a.T if header["fortran_order"] else contiguous(a)
    with memoryview(data.reshape(-1).view(np.uint8)) as view:
        for i in range(0, len(view), _WRITE_CHUNK):
            fh.write(view[i : i + _WRITE_CHUNK])


def save_under_name(tmp: str, name: str, save: Callable[[Path], object]) -> None:
    """``save(path)`` with a ``path`` whose file name is ``name``, then its bytes moved to the temporary
    file ``tmp``: for writers that record their file's name inside it (``torch.save`` names its zip's
    archive folder after it, ``model/`` for ``model.pth``). The folder it is written in is ``tmp`` +
    ".d", so it carries the temporary's prefix and a killed writer's is removed by the next write."""
    inner = Path(f"{tmp}.d")
    inner.mkdir()
    try:
        save(inner / name)
        os.replace(inner / name, tmp)
    finally:
        shutil.rmtree(inner, ignore_errors=True)


_FILL_CHUNK = 16 * 2**20  # bytes written (and added to the CRC-32) per step


def fill_stored_members(path: str | os.PathLike, contents: Mapping[str, Any], crc: bool = True) -> None:
    """Write each value of ``contents`` (member name -> array or lazy tensor, asked for once) as the
    C-order little-endian bytes of that stored member of the zip at ``path``, in place, and (``crc``) set
    the member's CRC-32 in its data descriptor and its central directory entry: for a zip whose writer
    reserved the members' space and left their CRC-32s 0 (``torch.save`` under
    ``torch.serialization.skip_data()``). One value in memory at a time.

    Raises:
        ValueError: a name the zip does not hold, or a member that is compressed, has no data
            descriptor (general-purpose flag bit 3), or whose size is not the value's byte count.
    """
    with open(path, "r+b") as fh, zipfile.ZipFile(fh) as zf:
        entries = _central_entries(fh, zf)
        for name, value in contents.items():
            if name not in entries:
                raise ValueError(f"{path}: holds no member {name!r} to fill")
            info, central = entries[name]
            data = _le_bytes(value)
            if info.compress_type != zipfile.ZIP_STORED or not info.flag_bits & 0x08 or info.file_size != data.nbytes:
                raise ValueError(
                    f"{path}: member {name!r} is not a stored member of {data.nbytes} bytes with a data descriptor"
                )
            fh.seek(info.header_offset + 26)
            n, e = (int.from_bytes(fh.read(2), "little") for _ in range(2))
            at, value_crc = info.header_offset + 30 + n + e, 0
            fh.seek(at)
            for i in range(0, data.nbytes, _FILL_CHUNK):
                chunk = data[i : i + _FILL_CHUNK]
                fh.write(chunk)
                value_crc = zlib.crc32(chunk, value_crc) if crc else 0
            del data
            descriptor = at + info.file_size + (4 if fh.read(4) == b"PK\x07\x08" else 0)
            for where in (descriptor, central + 16) if crc else ():
                fh.seek(where)
                fh.write(value_crc.to_bytes(4, "little"))


def _central_entries(fh: IO[bytes], zf: zipfile.ZipFile) -> dict[str, tuple[zipfile.ZipInfo, int]]:
    """Each member's ZipInfo and the offset of its central directory entry, walked from the start of the
    central directory (46 fixed bytes, then the name, extra field and comment)."""
    out, at = {}, zf.start_dir
    for info in zf.infolist():
        fh.seek(at)
        fixed = fh.read(46)
        n, e, c = (int.from_bytes(fixed[i : i + 2], "little") for i in (28, 30, 32))
        if fixed[:4] != b"PK\x01\x02" or fh.read(n).decode("utf-8" if info.flag_bits & 0x800 else "cp437") != (
            info.orig_filename
        ):
            raise ValueError(f"no central directory entry for {info.orig_filename!r} where zipfile read it")
        out[info.orig_filename] = (info, at)
        at += 46 + n + e + c
    return out
