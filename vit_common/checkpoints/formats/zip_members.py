"""Zip members checked against their CRC-32 and their central directory entry: .npz files and torch.save's
zip format are zips whose members are read memory-mapped, which ``zipfile`` never checks (it checks a
member's CRC-32 only when it reads the member to its end itself), so a damaged byte would pass silently.

``member_offset`` checks a member's local header (or data descriptor) against the central directory,
``zlib_crc`` computes a mapped member's CRC-32 a chunk at a time (no copy), ``check_crc`` names a
mismatch, and ``verify_zip`` checks every member of a file.
"""

from __future__ import annotations

import mmap
import os
import pickle
import zipfile
import zlib

from vit_common.checkpoints.formats.errors import FormatError

CRC_CHUNK = 16 * 2**20  # bytes of a mapped member a CRC-32 step reads (Ctrl-C is seen between steps)
_ZIP64_EXTRA = 0x0001
_LOCAL_SIZE = 0xFFFFFFFF  # a zip64 member's local header sizes: the real ones are in its zip64 extra field


def member_offset(fh, info: zipfile.ZipInfo, path, name: str) -> int:
    """Where zip member ``info``'s data starts in the open file ``fh``, after checking its local header
    against the central directory (what ``zipfile`` reads): the name, and the CRC-32 and sizes, from the
    local header or, where the writer gave them after the data (general-purpose flag bit 3, as
    ``torch.save`` writes), from the data descriptor there.

    Raises:
        FormatError: no local header there, or one that disagrees with the central directory, naming
            ``path``, the member ``name`` and both values.
    """
    fh.seek(info.header_offset)
    local = fh.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise FormatError(f"{path}: member {name!r}: no local header at byte {info.header_offset}: a damaged zip")
    n, e = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
    local_name, extra = fh.read(n), fh.read(e)
    at = info.header_offset + 30 + n + e
    if local_name != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):
        raise FormatError(f"{path}: member {name!r}: its local header names {local_name!r}: a damaged zip")
    want = (info.CRC, info.compress_size, info.file_size)
    if info.flag_bits & 0x08:
        fh.seek(at + info.compress_size)
        tail = fh.read(24)
        tail = tail[4:] if tail[:4] == b"PK\x07\x08" else tail
        found = [
            tuple(int.from_bytes(tail[i : i + w], "little") for i, w in ((0, 4), (4, k), (4 + k, k))) for k in (4, 8)
        ]
        where, got = "data descriptor", found[0] if found[1] != want else found[1]
    else:
        crc, csize, usize = (int.from_bytes(local[i : i + 4], "little") for i in (14, 18, 22))
        big = iter(_zip64_sizes(extra))
        usize = next(big, usize) if usize == _LOCAL_SIZE else usize
        csize = next(big, csize) if csize == _LOCAL_SIZE else csize
        where, got = "local header", (crc, csize, usize)
    if got[0] != want[0]:
        raise FormatError(
            f"{path}: member {name!r}: CRC-32 fields differ (its {where} {got[0]:08x}, the central "
            f"directory {want[0]:08x}): a damaged zip"
        )
    if got[1:] != want[1:]:
        raise FormatError(
            f"{path}: member {name!r}: its {where} declares {got[2]} bytes ({got[1]} stored), the central "
            f"directory {want[2]} ({want[1]} stored): a damaged zip"
        )
    return at


def _zip64_sizes(extra: bytes) -> list[int]:
    """The 8-byte values of a zip64 extra field (a local header's: uncompressed, then compressed size)."""
    i = 0
    while i + 4 <= len(extra):
        tag, size = int.from_bytes(extra[i : i + 2], "little"), int.from_bytes(extra[i + 2 : i + 4], "little")
        if tag == _ZIP64_EXTRA:
            body = extra[i + 4 : i + 4 + size]
            return [int.from_bytes(body[j : j + 8], "little") for j in range(0, len(body) - 7, 8)]
        i += 4 + size
    return []


def zlib_crc(mapped, at: int, size: int) -> int:
    """The CRC-32 of bytes ``at:at + size`` of a memory map, ``CRC_CHUNK`` at a time, without copying them."""
    crc = 0
    with memoryview(mapped) as view:
        for i in range(at, at + size, CRC_CHUNK):
            crc = zlib.crc32(view[i : min(i + CRC_CHUNK, at + size)], crc)
    return crc


def check_crc(path, name: str, stored: int, computed: int, what: str = "") -> None:
    """FormatError naming ``path``, member ``name`` (``what`` after it: the tensors it holds) and both
    values where the CRC-32s differ."""
    if stored != computed:
        raise FormatError(
            f"{path}: member {name!r}{what}: CRC-32 mismatch (stored {stored:08x}, computed {computed:08x}); "
            "the file is damaged"
        )


def unchecked(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    """A copy of ``info`` without its CRC-32, which ``zipfile`` then does not check: the caller checks it
    (``check_crc``), naming the value it computed."""
    copy = zipfile.ZipInfo(info.filename, info.date_time)
    for k in info.__slots__:
        if k != "CRC" and hasattr(info, k):
            setattr(copy, k, getattr(info, k))
    return copy


def verify_zip(path: str | os.PathLike) -> list[str]:
    """Check every member of the zip at ``path`` (a torch.save file) against the CRC-32 it stores: the
    stored members over a memory map of the file, ``CRC_CHUNK`` bytes at a time (no copy), others as
    ``zipfile`` inflates them; and each local header against the central directory (``member_offset``).

    Returns the warnings to report: one where every member stores 0, as ``torch.save`` writes under
    ``torch.serialization.set_crc32_options(False)``, whose members cannot be checked.

    Raises:
        FormatError: a member whose bytes or headers disagree with the central directory, naming it.
    """
    with open(path, "rb") as fh, zipfile.ZipFile(fh) as zf:
        infos = zf.infolist()
        skipped = bool(infos) and all(i.CRC == 0 for i in infos)
        mapped = None
        try:
            for info in infos:
                at = member_offset(fh, info, path, info.filename)
                if skipped or info.file_size == 0:
                    continue
                if info.compress_type == zipfile.ZIP_STORED:
                    mapped = mapped or mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                    crc = zlib_crc(mapped, at, info.file_size)
                else:
                    crc = 0
                    with zf.open(unchecked(info)) as fp:
                        while chunk := fp.read(CRC_CHUNK):
                            crc = zlib.crc32(chunk, crc)
                if crc != info.CRC:
                    names = record_tensors(zf, info.filename)
                    check_crc(path, info.filename, info.CRC, crc, f" (tensor {', '.join(names)})" if names else "")
        finally:
            if mapped is not None:
                mapped.close()
    if skipped:
        return [
            f"{os.path.basename(path)} was written without CRC-32s (torch.serialization.set_crc32_options(False)): "
            "its members could not be checked for damage"
        ]
    return []


class _Record:
    """A torch.save storage, by its record key (``ARCHIVE/data/KEY``)."""

    __slots__ = ("key",)

    def __init__(self, key: str):
        self.key = key


class _Stub:
    """What every other global of a pickle read by ``_StorageKeys`` builds: nothing, whatever its arguments."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class _OrderedDict(dict):
    """An OrderedDict of the pickle (``state_dict()``'s) as a dict: its state (``_metadata``) is dropped."""

    def __setstate__(self, state):
        pass


def _first(*args, **kwargs):
    """A tensor rebuilt (``torch._utils._rebuild_*``): its storage, the first argument."""
    return args[0] if args else None


class _StorageKeys(pickle.Unpickler):
    """A torch.save ``data.pkl`` read into its containers with every tensor its storage's ``_Record``; no
    global of the file is looked up (OrderedDict is ``_OrderedDict``, tensor rebuilders ``_first``, the rest
    ``_Stub``), so nothing of it runs."""

    def find_class(self, module: str, name: str):
        return _OrderedDict if name == "OrderedDict" else _first if name.startswith("_rebuild") else _Stub

    def persistent_load(self, pid):
        return _Record(str(pid[2]))  # ('storage', storage type, key, location, numel)


def record_tensors(zf: zipfile.ZipFile, record: str) -> list[str]:
    """The names (dotted through the containers) of the tensors whose storage is the torch.save record
    ``record`` (``ARCHIVE/data/KEY``) of ``zf``, read from its ``data.pkl`` (``_StorageKeys``); [] for
    another member or where that cannot be read: a name for an error already found, at best."""
    archive, _, key = record.rpartition("/data/")
    names: list[str] = []

    def walk(v, at: str) -> None:
        if isinstance(v, _Record) and v.key == key:
            names.append(at)
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list | tuple) else ()
        for k, x in items:
            walk(x, f"{at}.{k}" if at else str(k))

    if not archive or "/" in key:
        return []
    try:
        with zf.open(f"{archive}/data.pkl") as fp:
            walk(_StorageKeys(fp).load(), "")
    except Exception:  # noqa: BLE001 - a damaged or unusual pickle: the record's name is said instead
        return []
    return names
