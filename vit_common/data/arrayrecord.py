"""``arrayrecord:PATTERN``: ArrayRecord files (grain's native format) of encoded images and labels.

A record is ``MAGIC`` (4 bytes, ``b"VIT\\x01"``: this layout, version 1), the label as a uint32
little-endian, then the image file's bytes as they were (JPEG, PNG, ...; never re-encoded): nothing in
a record is unpickled or executed. ``vit data convert SRC DST`` (``write_arrayrecord``) writes a
folder of them from an image folder or a Hugging Face dataset: ``train-00000-of-00004.array_record``
..., ``test-...`` when the source has a test split, and ``dataset.json`` with the class names. The
files are written with ``group_size:1`` (one record per chunk), the option grain recommends for random
access.

PATTERN is such a folder (its ``*.array_record``) or a glob of files. A file whose name starts with
``train`` is training data, one starting with ``val``, ``validation``, ``valid`` or ``test`` test data;
files naming no split are one set, split by ``--val-fraction`` as image folders are. Class names come
from ``dataset.json`` beside the files, else ``0..K-1``. Read through array_record's
``ArrayRecordReader``, a reader per file opened at its first read (as its ``ArrayRecordDataSource``
does, which grain's extends; grain's own imports JAX, this module must not), imported when a dataset is
opened. Opening reads every record once, for the labels; the up-front check decodes every image once
more.
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from vit_common.data.stored_datasets import MAX_CLASSES, TEST_SPLITS, Stored, Subset, check_classes, file_stats
from vit_common.system.validate import regular_file

MAGIC = b"VIT\x01"
SUFFIX = ".array_record"
INFO = "dataset.json"  # beside the files: {"format": FORMAT, "classes": [...], "record": the layout}
FORMAT = "vit-twins/arrayrecord/1"
RECORD_LAYOUT = "b'VIT\\x01', then the label as uint32 little-endian, then the encoded image file"
_READ_BATCH = 256  # records read at once when every record is read in order


def encode_record(image: bytes, label: int) -> bytes:
    """One record: ``MAGIC`` + uint32 LE ``label`` + ``image`` (an encoded image file's bytes)."""
    return MAGIC + int(label).to_bytes(4, "little") + image


def decode_record(record: bytes, name: str) -> tuple[int, bytes]:
    """(label, image bytes) of a record (``encode_record``'s layout).

    Raises:
        ValueError: a record of another layout (named by ``name``: file and record index).
    """
    if len(record) < 8 or record[:4] != MAGIC:
        raise ValueError(f"{name}: not a vit-twins image record (expected {RECORD_LAYOUT})")
    return int.from_bytes(record[4:8], "little"), record[8:]


def pattern_folder(pattern: str) -> Path:
    """The folder a PATTERN reads from: itself if a folder, else the part of the path before any glob
    character."""
    path = Path(pattern)
    if path.is_dir():
        return path
    parts = []
    for part in path.parts:
        if any(c in part for c in "*?["):
            break
        parts.append(part)
    return Path(*parts).parent if len(parts) == len(path.parts) else Path(*parts) if parts else Path(".")


def pattern_files(pattern: str) -> list[Path]:
    """The files a PATTERN names, sorted.

    Raises:
        ValueError: nothing matches.
    """
    path = Path(pattern)
    files = sorted(path.glob(f"*{SUFFIX}")) if path.is_dir() else sorted(map(Path, glob.glob(pattern)))
    files = [f for f in files if not f.is_dir()]
    if not files:
        what = f"no *{SUFFIX} files in the folder" if path.is_dir() else "no files match"
        raise ValueError(f"arrayrecord:{pattern}: {what}; expected ArrayRecord files (vit data convert writes them)")
    return files


def _split_of(name: str) -> str | None:
    for split in ("train", *TEST_SPLITS):
        if name.startswith(split) and not name[len(split) : len(split) + 1].isalpha():
            return "train" if split == "train" else "test"
    return None


class RecordSource:
    """Records of ArrayRecord files: element ``{"image": bytes, "label": int32}``. Picklable (grain's
    worker processes): a file's reader (array_record's ``ArrayRecordReader``, with the random-access
    options of its ``ArrayRecordDataSource``) is opened where and when the file is first read, so a file
    damaged after the dataset was opened fails only the records read from it, each named; so does a file
    that holds another number of records than when it was opened (cut at a block boundary, array_record
    opens it as a shorter file and reads ``b""`` past its end).

    files: the files in order; labels: int32 [N], every record's label, in the same order.
    """

    def __init__(self, files: list[str], labels: np.ndarray, counts: list[int]):
        self.files, self.labels, self.counts = files, np.asarray(labels, np.int32), counts
        self._starts = np.cumsum([0] + counts)
        self._readers: dict[int, object] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_readers", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__ |= state | {"_readers": {}, "_lock": threading.Lock()}

    def __len__(self) -> int:
        return len(self.labels)

    def _reader(self, f: int):
        with self._lock:  # grain's threads share one source
            if f not in self._readers:
                from array_record.python.array_record_module import ArrayRecordReader

                reader = ArrayRecordReader(
                    self.files[f], options="readahead_buffer_size:0", file_reader_buffer_size=32768
                )
                held = reader.num_records()
                if held != self.counts[f]:  # a file cut at a block boundary opens, and reads b"" past its end
                    with contextlib.suppress(RuntimeError):  # closing reports the damage too, without a message
                        reader.close()
                    raise RuntimeError(
                        f"it holds {held} records, {self.counts[f]} when the dataset was opened: truncated or "
                        "rewritten since"
                    )
                self._readers[f] = reader
            return self._readers[f]

    def _locate(self, i: int) -> tuple[int, int]:
        f = int(np.searchsorted(self._starts, i, side="right") - 1)
        return f, int(i) - int(self._starts[f])

    def name(self, i: int) -> str:
        f, k = self._locate(i)
        return f"{self.files[f]}: record {k}"

    def _read(self, f: int, keys) -> list[bytes]:
        """Records ``keys`` of file ``f``.

        Raises:
            ValueError: the file cannot be opened or the records read (the reader's error, one line).
        """
        try:
            return self._reader(f).read(list(keys))
        except (RuntimeError, ValueError, OSError) as e:  # the C++ reader raises RuntimeError on damage
            with self._lock:
                self._readers.pop(f, None)  # opened again at the next read (the file may be repaired)
            at = f"record {keys[0]}" if len(keys) == 1 else f"records {keys[0]}..{keys[-1]}"
            raise ValueError(f"{self.files[f]}: {at}: a damaged ArrayRecord file ({_why(e)})") from None

    def __getitem__(self, i: int) -> dict:
        f, k = self._locate(i)
        return {"image": decode_record(self._read(f, [k])[0], self.name(i))[1], "label": self.labels[i]}

    def images(self) -> Iterator[tuple[str, bytes]]:
        """(name, image bytes) of every record in order, read a file at a time."""
        for f, n in enumerate(self.counts):
            for lo in range(0, n, _READ_BATCH):
                keys = range(lo, min(lo + _READ_BATCH, n))
                for k, record in zip(keys, self._read(f, keys), strict=True):
                    name = f"{self.files[f]}: record {k}"
                    yield name, decode_record(record, name)[1]
            with self._lock:  # a pass over the file (the up-front check) keeps no reader open after it
                reader = self._readers.pop(f, None)
            if reader is not None:
                reader.close()

    def take(self, indices: np.ndarray) -> Subset:
        return Subset(self, indices)


def _open_files(files: list[Path], declared: tuple[str, ...] | None, info: Path) -> RecordSource:
    """Read every record's label, each checked as it is read: a record of another layout, or a label
    without a class name in ``declared`` (``info``'s names; None: beyond the limit), is refused naming the
    file and the record."""
    from array_record.python.array_record_module import ArrayRecordReader

    limit = len(declared) if declared is not None else MAX_CLASSES
    names = f"{info} names {limit} classes; " if declared is not None else ""
    labels, counts = [], []
    for f in files:
        regular_file(f, "ArrayRecord file")  # a FIFO or device named, never read
        if not f.stat().st_size:
            raise ValueError(f"{f}: an empty file (0 bytes); expected an ArrayRecord file (vit data convert)")
        try:
            reader = ArrayRecordReader(str(f))
        except (RuntimeError, ValueError, OSError) as e:  # the C++ reader raises RuntimeError on a bad file
            raise ValueError(f"{f}: not an ArrayRecord file ({_why(e)})") from e
        n, i = 0, 0
        try:
            n = reader.num_records()
            for lo in range(0, n, _READ_BATCH):
                for i, record in enumerate(reader.read(range(lo, min(lo + _READ_BATCH, n))), lo):
                    label = decode_record(record, f"{f}: record {i}")[0]
                    if label >= limit:
                        raise ValueError(f"{f}: record {i}: label {label}: {names}expected labels in [0, {limit - 1}]")
                    labels.append(label)
                i = min(lo + _READ_BATCH, n)
            reader.close()  # where a truncated or overwritten file's damage shows (its footer, its last chunk)
        except RuntimeError as e:  # the C++ reader's one error type: truncated, overwritten, a bad chunk
            at = f"at record {i} of {n}: " if n else "its index unreadable: "
            raise ValueError(f"{f}: a damaged ArrayRecord file ({at}{_why(e)})") from None
        counts.append(n)
    return RecordSource([str(f) for f in files], np.asarray(labels, np.int64), counts)


def _why(e: BaseException) -> str:
    """The C++ reader's message on one line (it may be empty, or long)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _declared(path: Path) -> tuple[dict, tuple[str, ...]] | None:
    """``dataset.json`` at ``path`` and its class names, or None where there is none.

    Raises:
        ValueError: a dataset.json without a list of class names (``check_classes`` checks the names).
    """
    from vit_common.system import io

    if not os.path.lexists(path):
        return None
    info = io.read_json(path)
    classes = info.get("classes") if isinstance(info, dict) else None
    if not isinstance(classes, list):
        raise ValueError(f"{path}: expected {{'classes': [names]}}, got {type(classes).__name__}")
    return info, tuple(classes)


def _classes(path: Path, declared, splits: dict[str, RecordSource], whole: bool) -> tuple[str, ...]:
    """The class names of ``declared`` (``_declared(path)``), else 0..the largest label. What dataset.json
    declares is checked against the records (``check_classes``): its names and, when the records read are
    the ``whole`` folder (not a glob of some files), a record for every class and the record count of each
    split it states.

    Raises:
        ValueError: one line naming dataset.json and the first thing it contradicts.
    """
    labels = np.concatenate([s.labels for s in splits.values()])
    if declared is None:
        classes = tuple(str(k) for k in range(int(labels.max()) + 1 if len(labels) else 1))
        check_classes(
            f"{path.parent} (no {INFO}: a class per label value 0..{len(classes) - 1})", classes, labels, every=whole
        )
        return classes
    info, classes = declared
    records = info.get("records")
    for split, source in splits.items() if whole and isinstance(records, dict) else ():
        if split in records and records[split] != len(source):  # first: a missing shard explains the rest
            counts = ", ".join(f"{Path(f).name}: {n}" for f, n in zip(source.files, source.counts, strict=True))
            raise ValueError(
                f"{path}: declares {records[split]} {split} records; the files hold {len(source)} ({counts})"
            )
    check_classes(str(path), classes, labels, every=whole)
    return classes


def open_arrayrecord(pattern: str) -> Stored:
    """The splits of ``arrayrecord:PATTERN`` (module docstring), unsplit and unchecked.

    Raises:
        ValueError: nothing matches, a file that is not ArrayRecord, is empty, damaged (truncated,
            overwritten: the reader's error, naming the file and the record) or holds records of another
            layout, files of which some name a split and some do not, a label without a name in
            ``dataset.json`` (naming the record), a ``dataset.json`` whose names are empty or repeated,
            that names a class no record has or states other record counts.
    """
    files = pattern_files(pattern)
    folder = files[0].parent
    splits = {f: _split_of(f.name) for f in files}
    if any(splits.values()) and not all(splits.values()):
        loose = [f.name for f, s in splits.items() if s is None][:5]
        raise ValueError(f"arrayrecord:{pattern}: files {loose} name no split (train-..., test-...) but others do")
    if not any(s == "train" for s in splits.values()) and any(splits.values()):
        raise ValueError(f"arrayrecord:{pattern}: no file of the train split (train-...)")
    declared = _declared(folder / INFO)  # its names bound the labels as the records are read
    names = declared[1] if declared is not None else None
    train = _open_files([f for f, s in splits.items() if s in ("train", None)], names, folder / INFO)
    test_files = [f for f, s in splits.items() if s == "test"]
    test = _open_files(test_files, names, folder / INFO) if test_files else None
    read = [*files, *([folder / INFO] if (folder / INFO).exists() else [])]
    sources = {"train": train} | ({"test": test} if test is not None else {})
    classes = _classes(folder / INFO, declared, sources, whole=Path(pattern).is_dir())
    return Stored(train, test, classes, file_stats(folder, read))


def write_arrayrecord(stored: Stored, dst: Path, shard_size: int = 1024) -> dict[str, int]:
    """Write ``stored``'s splits into the new folder ``dst`` (module docstring), atomically
    (``vit_common.system.io.atomic_write_dir``: nothing is left if anything fails). Images are copied
    as they are stored (file bytes, or a dataset's image bytes), in the source's order.

    Returns:
        {split: records written}.
    Raises:
        DestinationError: ``dst`` exists and is neither empty nor a folder this function wrote (which
            ``dataset.json`` lists whole, ``vit_common.system.io.folder_mark``); OSError: a write failed.
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    from vit_common.system import io
    from vit_common.system.validate import regular_file

    splits = {"train": stored.train} | ({"test": stored.test} if stored.test is not None else {})
    written = {}

    def write(tmp: Path) -> None:
        for split, source in splits.items():
            n = len(source)
            shards = max(1, -(-n // shard_size))
            images = iter(source.images())
            for s in range(shards):
                writer = ArrayRecordWriter(str(tmp / f"{split}-{s:05d}-of-{shards:05d}{SUFFIX}"), "group_size:1")
                try:
                    for i in range(s * shard_size, min((s + 1) * shard_size, n)):
                        _, image = next(images)
                        data = image if isinstance(image, bytes) else regular_file(image, "image file").read_bytes()
                        writer.write(encode_record(data, int(source.labels[i])))
                finally:
                    writer.close()
            written[split] = n
        info = {"format": FORMAT, "record": RECORD_LAYOUT, "classes": list(stored.classes), "records": written}
        files = [INFO, *(e.name for e in os.scandir(tmp))]  # dataset.json lists the folder: it proves it ours
        io.write_json(tmp / INFO, io.folder_mark(info, files))

    io.atomic_write_dir(dst, write)
    return written
