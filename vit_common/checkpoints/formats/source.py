"""Containers: what a checkpoint path is on disk (a safetensors file, an .npz, a PyTorch pickle, an HF
folder, an orbax folder) and its tensors, before any format interprets them.

Found from the contents, never the name. vit_common imports neither framework, so PyTorch files and
orbax folders are read through callables the framework adapters provide
(``readers={"torch": vit_torch.formats.read_torch_file, "orbax": vit_jax.formats.read_orbax}``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import mmap
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Source
from vit_common.checkpoints.formats.tensors import LazyTensor, Tensor, materialize
from vit_common.checkpoints.formats.zip_members import check_crc, member_offset, unchecked, verify_zip, zlib_crc
from vit_common.system.io import read_json
from vit_common.system.validate import check_bytes, regular_file

ORBAX_CONFIG = "vit_config.json"  # beside the orbax ``state/`` folder: {"format": ..., "vit_config": ...}
HF_INDEX = "model.safetensors.index.json"
HF_WEIGHTS = ("model.safetensors", HF_INDEX, "pytorch_model.bin")
TORCH_SUFFIXES = (".pth", ".pt", ".bin")
# safetensors dtype names -> numpy (little-endian, as the format stores them); BF16 through ml_dtypes
_ST_DTYPES = {
    name: np.dtype(t).newbyteorder("<")
    for name, t in {
        "BOOL": np.bool_,
        "U8": np.uint8,
        "I8": np.int8,
        "U16": np.uint16,
        "I16": np.int16,
        "F16": np.float16,
        "BF16": ml_dtypes.bfloat16,
        "U32": np.uint32,
        "I32": np.int32,
        "F32": np.float32,
        "U64": np.uint64,
        "I64": np.int64,
        "F64": np.float64,
    }.items()
}

Reader = Callable[..., Any]

# A training checkpoint's entries that hold weights. "auto" takes the first present in this order, the
# one timm's own loader takes (timm/models/_helpers.py load_state_dict, use_ema=True by default): the EMA
# weights when the file has them, since they are what timm evaluates and exports.
WEIGHT_ENTRIES = ("state_dict_ema", "model_ema", "state_dict", "model", "module")
EMA_ENTRIES = ("state_dict_ema", "model_ema")
_WEIGHTS_ENTRY = contextvars.ContextVar("vit_weights_entry", default="auto")


@contextlib.contextmanager
def weights_entry(entry: str | None) -> Iterator[None]:
    """Within this block, training checkpoints are read from ``entry`` (one of ``WEIGHT_ENTRIES``, or
    "auto"/None: the first present); the command's ``--weights-entry``.

    Raises:
        ValueError: ``entry`` is not one of them.
    """
    entry = entry or "auto"
    if entry != "auto" and entry not in WEIGHT_ENTRIES:
        raise ValueError(f"--weights-entry {entry!r}: expected auto or one of {', '.join(WEIGHT_ENTRIES)}")
    token = _WEIGHTS_ENTRY.set(entry)
    try:
        yield
    finally:
        _WEIGHTS_ENTRY.reset(token)


def current_weights_entry() -> str:
    """The weights entry training checkpoints are read from here ("auto" outside ``weights_entry``)."""
    return _WEIGHTS_ENTRY.get()


def training_weights_entry(entry: str | None) -> str:
    """The weights entry to read when a training checkpoint's optimizer state is continued (``vit train
    --init-optimizer``): the moments belong to the weights the optimizer stepped, timm's ``state_dict``,
    so "auto"/None means "state_dict" and any non-EMA entry asked for is kept.

    Raises:
        ValueError: an EMA entry (``EMA_ENTRIES``): no optimizer stepped those weights.
    """
    if entry in (None, "auto"):
        return "state_dict"
    if entry in EMA_ENTRIES:
        raise ValueError(
            f"--weights-entry {entry} with --init-optimizer: the optimizer state belongs to the trained "
            "weights ('state_dict'), not to their moving average; drop --weights-entry or --init-optimizer"
        )
    return entry


def choose_weights(path: str | os.PathLike, present: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """(the entry of a training checkpoint at ``path`` to read, the other weight entries with the line
    that states the choice) among the weight entries ``present`` (in ``WEIGHT_ENTRIES`` order).

    Raises:
        FormatError: the entry asked for (``weights_entry``) is not in the file.
    """
    asked = _WEIGHTS_ENTRY.get()
    if asked != "auto" and asked not in present:
        raise FormatError(f"{path}: --weights-entry {asked}: the file holds {present or 'no weight entries'}")
    chosen = present[0] if asked == "auto" else asked
    how = (
        "asked for" if asked != "auto" else "timm's loader's choice, EMA first" if len(present) > 1 else "the one there"
    )
    kind = "EMA weights" if chosen in EMA_ENTRIES else "training weights"
    others = [
        (k, f"weights not used: the model is {chosen!r} ({kind}; {how}); --weights-entry {k} reads these")
        for k in present
        if k != chosen
    ]
    return chosen, others


def json_object(path: Path) -> dict:
    """A JSON file holding an object; FormatError naming the path otherwise."""
    try:
        data = read_json(path)
    except ValueError as e:
        raise FormatError(str(e)) from e
    if not isinstance(data, dict):
        raise FormatError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, header metadata) of a safetensors file, the tensors read-only views of a memory map of
    the file (no copy: their pages are the file's, read when used). bfloat16, which safetensors' numpy
    reader cannot return, is viewed as ``ml_dtypes.bfloat16`` (bit-exact).

    The header is checked by safetensors (``safe_open``: offsets inside the file, matching the shapes)
    before any view is made.

    Raises:
        FormatError: the file is missing, not a regular file, truncated, not safetensors, or holds a
            dtype numpy cannot represent; the message names the path (and the tensor).
    """
    try:
        regular_file(path)
        with safe_open(str(path), framework="np") as f:
            meta = dict(f.metadata() or {})
            names = list(f.keys())
            kinds = {k: f.get_slice(k).get_dtype() for k in names}
        bad = sorted(k for k, kind in kinds.items() if kind not in _ST_DTYPES)
        if bad:
            raise TypeError(f"{bad[0]} is {kinds[bad[0]]}")
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            mapped = (
                mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                if any(header[k]["data_offsets"][1] > header[k]["data_offsets"][0] for k in names)
                else b""
            )
    except (SafetensorError, OSError, ValueError) as e:
        raise FormatError(f"{path}: not a readable safetensors file ({e})") from e
    except TypeError as e:
        raise FormatError(f"{path}: holds a tensor dtype numpy cannot represent ({e})") from e
    tensors = {}
    for k in names:
        start, end = header[k]["data_offsets"]
        dtype, shape = _ST_DTYPES[kinds[k]], tuple(header[k]["shape"])
        data = np.frombuffer(mapped, dtype, (end - start) // dtype.itemsize, 8 + n + start) if end > start else None
        tensors[k] = data.reshape(shape) if data is not None else np.zeros(shape, dtype)
    return tensors, meta


NPZ_PREFIXES = ("", "opt/target/", "params/", "params/img/")  # the flax .npz layouts' key prefixes
# Dimensions the flax .npz layouts (original ViT, big_vision) fix, by member name without the prefix:
# matched in order, first match wins; under ``Transformer/encoderblock/`` (scan=True) one more, the layers.
_NDIM = (
    (re.compile(r"^embedding/kernel$"), (4, 2)),  # (P, P, C, D); naflex_vit's Dense (P*P*C, D)
    (re.compile(r"^(cls|MAPHead_0/probe)$"), (3,)),  # (1, 1, D)
    (re.compile(r"(^|/)pos_embedding$"), (3,)),  # (1, L, D); naflex_vit's (G, G, D)
    (re.compile(r"MultiHeadDotProductAttention_\d+/(query|key|value)/kernel$"), (3,)),  # (D, N, D/N)
    (re.compile(r"MultiHeadDotProductAttention_\d+/(query|key|value)/bias$"), (2,)),  # (N, D/N)
    (re.compile(r"MultiHeadDotProductAttention_\d+/out/kernel$"), (3,)),  # (N, D/N, D)
    (re.compile(r"(MlpBlock_\d+/Dense_\d+|^pre_logits|^head)/kernel$"), (2,)),  # dense (in, out)
    (
        re.compile(
            r"(LayerNorm_\d+|encoder_norm|MlpBlock_\d+/Dense_\d+|/out|^pre_logits|^head|^embedding)/(bias|scale)$"
        ),
        (1,),
    ),
)


def expected_ndims(name: str) -> tuple[int, ...] | None:
    """The numbers of dimensions the flax .npz layouts allow for member ``name``, or None for names they
    do not define (optimizer state, a text tower): checked from the member's header before its data is
    read."""
    prefix = max((p for p in NPZ_PREFIXES if name.startswith(p)), key=len)
    key = name[len(prefix) :]
    for pattern, ndim in _NDIM:
        if pattern.search(key):
            return tuple(n + key.startswith("Transformer/encoderblock/") for n in ndim)
    return None


def open_npz(path: str | os.PathLike) -> dict[str, Tensor]:
    """The arrays of an .npz file, member by member, without pickle (what ``np.load(allow_pickle=False)``
    guarantees) and with every declared size checked first.

    Each member's local header is checked against the central directory and a stored member's bytes
    against its CRC-32 (``zip_members``: read once through a memory map, a chunk at a time, nothing
    copied; a compressed member's as it is inflated), so a damaged byte is refused, never read as a
    weight. Then its .npy header is parsed, its dimensions compared with those the layouts fix for its name
    (``expected_ndims``), and its declared byte size compared with the member's real size
    (the zip's declared uncompressed size: reading stops there) and with
    ``vit_common.system.validate.memory_limit()``, so a corrupt header or a compressed bomb cannot ask for
    terabytes. A stored (uncompressed, as ``np.savez`` writes) member is a read-only view of a memory map
    of its bytes; a compressed one a ``LazyTensor`` that inflates it when loaded.

    Raises:
        FormatError: not a regular file, not a zip of .npy members, a pickled (object) array, a member
            of the wrong number of dimensions for its name, a corrupt member (a CRC-32 mismatch: naming
            both values), or members declaring more bytes than the memory limit (a compressed member found
            truncated or damaged: when it is loaded).
    """
    out: dict[str, Tensor] = {}
    total = 0
    try:
        with open(regular_file(path), "rb") as fh, zipfile.ZipFile(fh) as zf:
            mapped = None
            for info in zf.infolist():
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                at = member_offset(fh, info, path, name)
                stored_member = info.compress_type == zipfile.ZIP_STORED and info.file_size > 0
                if stored_member:  # before its header is parsed: a damaged header is named as damage
                    mapped = mapped or mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                    check_crc(path, name, info.CRC, zlib_crc(mapped, at, info.file_size))
                with zf.open(info) as fp:
                    shape, fortran, dtype = _npy_header(fp, path, name)
                    need, have = math.prod(shape) * dtype.itemsize, info.file_size - fp.tell()
                    start = fp.tell()
                total += need
                check_bytes(f"{path}: member {name!r} ({shape} {dtype}) and those before it", total)
                if need != have:
                    raise FormatError(
                        f"{path}: member {name!r} declares {shape} {dtype} ({need} bytes) "
                        f"but holds {have} bytes: truncated or corrupt"
                    )
                stored = shape[::-1] if fortran else shape
                if stored_member and need:
                    arr = np.frombuffer(mapped, dtype, math.prod(shape), at + start).reshape(stored)
                    out[name] = arr.T if fortran else arr
                else:
                    load = functools.partial(_inflate, Path(path), info, name, stored, dtype, start, fortran)
                    out[name] = LazyTensor(shape, dtype, load)
    except FormatError:
        raise
    except _ZIP_ERRORS as e:
        raise FormatError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from e
    return out


_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    ValueError,
    OSError,
    EOFError,
    KeyError,
    NotImplementedError,
    RuntimeError,
)


def _npy_header(fp, path, name: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of an .npy member's header, refusing pickles and wrong ndims."""
    version = np.lib.format.read_magic(fp)
    if version not in ((1, 0), (2, 0)):
        raise FormatError(f"{path}: member {name!r} has .npy format version {version}")
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(fp)
    if dtype.hasobject:
        raise FormatError(f"{path}: member {name!r} holds Python objects (pickle); refused")
    ndims = expected_ndims(name)
    if ndims is not None and len(shape) not in ndims:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise FormatError(
            f"{path}: member {name!r} has shape {shape}, the format's is {want}; refused before reading its data"
        )
    return tuple(shape), fortran, dtype


def _inflate(path: Path, info, name: str, stored, dtype, start: int, fortran: bool) -> np.ndarray:
    """A compressed .npz member's array (its header at ``start`` bytes already checked by ``open_npz``),
    its CRC-32 checked over the bytes inflated (``check_crc``)."""
    arr = np.empty(stored, dtype)
    need = arr.nbytes
    try:
        with zipfile.ZipFile(path) as zf, zf.open(unchecked(info)) as fp:
            crc = zlib.crc32(fp.read(start))
            if need and fp.readinto(memoryview(arr.reshape(-1).view(np.uint8))) != need:
                raise FormatError(f"{path}: member {name!r} is truncated")
            check_crc(path, name, info.CRC, zlib.crc32(arr.reshape(-1).view(np.uint8), crc))
    except FormatError:
        raise
    except _ZIP_ERRORS as e:
        raise FormatError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from e
    return arr.T if fortran else arr


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an .npz file (``open_npz``'s, loaded into writable arrays: ``materialize``).

    Raises:
        FormatError: as ``open_npz``, and a compressed member found truncated.
    """
    return materialize(open_npz(path))


def _holds(path: Path, what: str) -> bool:
    """Whether a folder holds ``path`` (a link, dangling or not, counts); one it holds must be a regular
    file, so that a FIFO, a device (a link to /dev/zero) or a folder is named as what it is, never taken
    for a missing file or read until the memory runs out.

    Raises:
        ValueError: a FIFO, device or socket; FileNotFoundError: a dangling link; IsADirectoryError: a
            folder; OSError: a link loop (``vit_common.system.validate.regular_file``).
    """
    if not os.path.lexists(path):
        return False
    regular_file(path, what)
    return True


def _hf_folder(path: Path) -> Source:
    config = json_object(path / "config.json")
    index = path / HF_INDEX
    if _holds(index, "index file"):
        wmap = json_object(index).get("weight_map")
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise FormatError(f"{index}: no weight_map of tensor names to file names")
        names = sorted(set(wmap.values()))
        if any(Path(f).name != f or f in (".", "..") for f in names):
            raise FormatError(f"{index}: weight_map names files outside the folder")
        missing = [f for f in names if not _holds(path / f, "checkpoint shard")]
        if missing:
            raise FormatError(f"{index}: weight_map names shard file(s) that do not exist: {missing}")
        return Source(path, "hf_folder", tuple(path / f for f in names), config, dict(wmap))
    for name in ("model.safetensors", "pytorch_model.bin"):
        if _holds(path / name, "weights file"):
            return Source(path, "hf_folder", (path / name,), config)
    raise FormatError(f"{path}: config.json but none of {HF_WEIGHTS}")


def open_source(path: str | os.PathLike) -> Source:
    """What kind of container ``path`` is, from its contents (no tensors read yet).

    Raises:
        FileNotFoundError: no such path. FormatError: not a container vit reads.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():  # a broken or looping link is named below
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir():
        if _holds(path / ORBAX_CONFIG, "config file") and (path / "state").is_dir():
            return Source(path, "orbax_folder", (path,), json_object(path / ORBAX_CONFIG))
        if _holds(path / "config.json", "config file"):
            return _hf_folder(path)
        raise FormatError(
            f"{path}: a folder that is neither a Hugging Face ViT folder (config.json + weights) "
            f"nor an orbax checkpoint of the JAX twin ({ORBAX_CONFIG} + state/)"
        )
    try:
        regular_file(path, "checkpoint file")
        with open(path, "rb") as fh:
            head = fh.read(9)
        size = path.stat().st_size
    except (OSError, ValueError) as e:
        raise FormatError(f"{path}: cannot read ({e})") from e
    if head[:4] == b"PK\x03\x04":
        try:
            with open(path, "rb") as fh, zipfile.ZipFile(fh) as zf:
                names = zf.namelist()
                if any(n.endswith("data.pkl") for n in names):
                    return Source(path, "torch", (path,))
                if names and all(n.endswith(".npy") for n in names):
                    return Source(path, "npz", (path,))
                for info in zf.infolist():  # a damaged name: its local header's disagrees
                    member_offset(fh, info, path, info.filename)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise FormatError(f"{path}: a damaged zip archive ({e})") from e
        raise FormatError(f"{path}: a zip archive that is neither .npz nor a PyTorch file")
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return Source(path, "torch", (path,))  # legacy (pre-1.6) torch.save pickle stream
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") >= 2:
        declared = int.from_bytes(head[:8], "little")
        if declared > size - 8:
            raise FormatError(
                f"{path}: a truncated or damaged safetensors file (its first 8 bytes declare a {declared}-byte "
                f"header, and {size - 8} bytes follow)"
            )
        parent = path.parent / "config.json"
        config = json_object(parent) if path.name in HF_WEIGHTS and parent.is_file() else None
        return Source(path, "safetensors", (path,), config)
    raise FormatError(
        f"{path}: not a checkpoint format vit reads (safetensors, .npz, PyTorch .pth/.bin, "
        f"Hugging Face folder, orbax folder); it starts with {head[:8]!r}"
    )


def container_needs(src: Source) -> str | None:
    """The framework reading ``src``'s container needs: 'jax' (orbax), 'torch' (pickles) or None."""
    if src.container == "orbax_folder":
        return "jax"
    return "torch" if src.container == "torch" or any(f.suffix == ".bin" for f in src.files) else None


def reader(readers: Mapping[str, Reader] | None, what: str, path: Path, file: Path | None = None) -> Reader:
    """The framework reader ``what`` ('torch' | 'orbax') for the checkpoint at ``path`` (``file``: the
    torch pickle inside a folder); FormatError naming the framework, why and what to pass if absent."""
    fn = (readers or {}).get(what)
    if fn is None and what == "torch":
        raise FormatError(
            f"{file or path}: a torch pickle, which only torch.load reads, and this reader has no torch "
            "(the JAX twin never imports it): pass `--framework torch` on the command line (vit_torch.load_model), "
            f"or convert it once to a file both twins read: `vit convert {path} OUT.safetensors`"
        )
    if fn is None:
        raise FormatError(
            f"{path}: reading this orbax checkpoint needs jax, and the caller gave no orbax reader (use "
            "vit_jax.load_model, `--framework jax` on the command line, or `vit convert` to a format both twins read)"
        )
    return fn


def _read_file(src: Source, f: Path, readers) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if f.suffix == ".bin" or src.container == "torch":
        read = reader(readers, "torch", src.path, f)
        src.warnings += verified_torch_file(f)
        part, why = read(f)
        src.dropped += why
        return part, {}
    if src.container == "npz":
        return open_npz(f), {}
    return read_safetensors(f)


def verified_torch_file(path: Path) -> list[str]:
    """``verify_zip``'s warnings for a torch.save zip file (none for a legacy pickle stream, which has no
    checksums); FormatError where a member is damaged or the file is not a readable zip."""
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"PK\x03\x04":
                return []
        return verify_zip(path)
    except FormatError:
        raise
    except _ZIP_ERRORS as e:
        raise FormatError(f"{path}: not a readable PyTorch weights file ({type(e).__name__}: {e})") from e


def load_tensors(src: Source, readers: Mapping[str, Reader] | None = None) -> Source:
    """Fill ``src.tensors`` and ``src.meta`` (orbax folders are read whole by their format instead).

    A sharded HF folder is read through its index: each tensor from the shard the weight_map names;
    a tensor a shard holds but the map does not name is dropped (reported).

    Raises:
        FormatError: an unreadable file, a needed framework reader missing, or an index that names a
            tensor its shard does not hold.
    """
    if src.container == "orbax_folder":
        return src
    if src.weight_map is None:
        for f in src.files:
            part, meta = _read_file(src, f, readers)
            src.tensors.update(part)
            src.meta = src.meta or meta
        return src
    shards = {f.name: _read_file(src, f, readers)[0] for f in src.files}
    absent = [f"{k} (in {v})" for k, v in src.weight_map.items() if k not in shards[v]]
    if absent:
        raise FormatError(f"{src.path / HF_INDEX}: the weight_map names tensors their shard lacks: {absent}")
    src.tensors = {k: shards[v][k] for k, v in src.weight_map.items()}
    src.dropped += [
        (k, f"in shard {name} but not in the index's weight_map, which is the map read")
        for name, part in shards.items()
        for k in part
        if src.weight_map.get(k) != name
    ]
    return src
