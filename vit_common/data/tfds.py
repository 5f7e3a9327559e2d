"""``tfds:PATH``: a prepared TensorFlow Datasets dataset in ArrayRecord format, read without TensorFlow.

PATH is the folder ``tfds`` prepared (``DATA_DIR/NAME/VERSION``, holding ``dataset_info.json``), or
``DATA_DIR/NAME`` when it holds one version. It is opened with ``tfds.builder_from_directory`` and read
with ``builder.as_data_source(split)`` (tfds's ``ArrayRecordDataSource``, random access, no TensorFlow),
the image feature left encoded (``tfds.decode.SkipDecoding``) so that the one image path decodes it as
it decodes every other kind. A dataset prepared as TFRecord (tfds's default ``file_format``) is refused:
reading TFRecord needs TensorFlow.

Features: the image is the one ``tfds.features.Image`` (``supervised_keys``' first where they name one),
the label the one ``ClassLabel`` (``supervised_keys``' second where given), whose names become the class
names. Splits: ``train``, and the first of ``val``, ``validation``, ``valid``, ``test`` as the test split;
without one the test split is drawn by ``--val-fraction`` as for image folders. Records are read in the
order tfds stored them (a dataset prepared with ``disable_shuffling`` keeps its generator's order).
``tensorflow_datasets`` (the optional extra ``tfds``) is imported when a dataset is opened; opening reads
every record once, for the labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from vit_common.data.stored_datasets import MAX_CLASSES, TEST_SPLITS, Stored, Subset, check_classes, file_stats
from vit_common.system.extras import install_hint
from vit_common.system.imports import gc_paused

INFO = "dataset_info.json"
_READ_BATCH = 256  # records read at once when every record is read in order


def import_tfds():
    """The ``tensorflow_datasets`` module, imported with the garbage collector paused
    (``vit_common.system.imports`` says why).

    Raises:
        ValueError: tensorflow-datasets is not installed (names the extra that installs it).
    """
    try:
        with gc_paused():
            import tensorflow_datasets as tfds
    except ImportError:
        raise ValueError(f"tfds: needs tensorflow-datasets (the optional extra: {install_hint('tfds')})") from None
    return tfds


def version_folder(path: Path) -> Path:
    """The prepared folder ``path`` names: itself if it holds ``dataset_info.json``, else its one version
    subfolder that does.

    Raises:
        FileNotFoundError: ``path`` does not exist. ValueError: no prepared dataset there, or several versions.
    """
    if not path.exists():
        raise FileNotFoundError(f"tfds:{path}: no such folder")
    if (path / INFO).is_file():
        return path
    versions = sorted(p for p in path.iterdir() if (p / INFO).is_file()) if path.is_dir() else []
    if len(versions) != 1:
        what = (
            f"{len(versions)} versions ({', '.join(p.name for p in versions)}): name one"
            if versions
            else (f"no {INFO} in it or in a version folder below it")
        )
        raise ValueError(f"tfds:{path}: {what}; expected a folder tfds prepared (DATA_DIR/NAME/VERSION)")
    return versions[0]


class TfdsSource:
    """One split of a prepared tfds dataset: element ``{"image": bytes, "label": int32}``. Picklable
    (grain's worker processes): the data source is made where it reads.

    folder: the prepared folder; split: the tfds split name; image, label: feature names; labels:
    int32 [N], every record's label, in order; shards: the split's shard files in order, each with its
    record count (``dataset_info.json``'s, which ``check_shards`` compared with the file).
    """

    def __init__(
        self, folder: str, split: str, image: str, label: str, labels: np.ndarray, shards: list[tuple[str, int]]
    ):
        self.folder, self.split, self.image, self.label = folder, split, image, label
        self.labels = np.asarray(labels, np.int32)
        self.shards = shards
        self._starts = np.cumsum([0] + [n for _, n in shards])
        self._source = None

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_source": None}

    def __len__(self) -> int:
        return len(self.labels)

    def _records(self):
        if self._source is None:
            self._source = _data_source(Path(self.folder), self.split, self.image)
        return self._source

    def name(self, i: int) -> str:
        """Where record ``i`` is stored (shard file and record), for errors."""
        f = int(np.searchsorted(self._starts, i, side="right") - 1)
        return f"{self.shards[f][0]}: record {i - int(self._starts[f])}"

    def __getitem__(self, i: int) -> dict:
        return {"image": self._records()[int(i)][self.image], "label": self.labels[i]}

    def images(self) -> Iterator[tuple[str, bytes]]:
        for lo in range(0, len(self), _READ_BATCH):
            for i, rec in enumerate(self._records().__getitems__(range(lo, min(lo + _READ_BATCH, len(self)))), lo):
                yield self.name(i), rec[self.image]

    def take(self, indices: np.ndarray) -> Subset:
        return Subset(self, indices)


def _data_source(folder: Path, split: str, image: str):
    tfds = import_tfds()
    builder = tfds.builder_from_directory(str(folder))
    return builder.as_data_source(split, decoders={image: tfds.decode.SkipDecoding()})


def _features(info, where: str) -> tuple[str, str, list[str]]:
    """(image feature, label feature, class names) of a tfds ``DatasetInfo``."""
    tfds = import_tfds()
    feats = info.features
    keys = list(info.supervised_keys or ())[:2] if isinstance(info.supervised_keys, tuple) else []
    images = [k for k, f in feats.items() if isinstance(f, tfds.features.Image)]
    labels = [k for k, f in feats.items() if isinstance(f, tfds.features.ClassLabel)]
    image = keys[0] if keys and keys[0] in images else images[0] if len(images) == 1 else None
    label = keys[1] if len(keys) > 1 and keys[1] in labels else labels[0] if len(labels) == 1 else None
    if image is None or label is None:
        raise ValueError(
            f"{where}: expected one Image and one ClassLabel feature (or supervised_keys naming them), "
            f"got features {sorted(feats.keys())}"
        )
    return image, label, list(feats[label].names)


def check_shards(folder: Path, split) -> None:
    """Compare each shard's record count that ``dataset_info.json`` declares (a tfds ``SplitInfo``'s
    ``shard_lengths``) with the count its file holds (the ArrayRecord footer), before any record is read.

    Raises:
        ValueError: a shard missing, not a regular file, unreadable, or holding another count (named).
    """
    from array_record.python.array_record_module import ArrayRecordReader

    from vit_common.system.validate import regular_file

    lengths = list(split.shard_lengths)
    paths = [Path(p) for p in split.filepaths]
    if len(paths) != len(lengths):
        raise ValueError(f"{folder / INFO}: split {split.name}: {len(lengths)} shard lengths for {len(paths)} files")
    for path, declared in zip(paths, lengths, strict=True):
        regular_file(path, f"shard of split {split.name!r}")
        try:
            reader = ArrayRecordReader(str(path))
            held = reader.num_records()
            reader.close()
        except RuntimeError as e:  # the C++ reader's one error type: truncated, overwritten
            raise ValueError(f"{path}: a damaged ArrayRecord shard ({' '.join(str(e).split())[:200]})") from None
        if held != declared:
            raise ValueError(f"{folder / INFO}: declares {declared} records in {path.name}; the file holds {held}")


def open_tfds(path: Path) -> Stored:
    """The splits of ``tfds:PATH`` (module docstring), unsplit and unchecked.

    Raises:
        FileNotFoundError: PATH does not exist. ValueError: tensorflow-datasets is not installed, no
            prepared dataset at PATH, a dataset stored as TFRecord, no Image / ClassLabel feature, no
            train split, a shard missing, damaged or holding another record count than dataset_info.json
            declares (``check_shards``), labels beyond the class names (naming the record), class names
            empty or repeated, or a class no record has (``check_classes``).
    """
    folder = version_folder(path)
    where = f"tfds:{path}"
    tfds = import_tfds()
    try:
        builder = tfds.builder_from_directory(str(folder))
        info = builder.info
    except Exception as e:  # tfds raises many types for a damaged dataset_info.json / features.json
        raise ValueError(f"{where}: not a dataset tfds can open ({type(e).__name__}: {e})") from e
    fmt = getattr(info.file_format, "value", info.file_format)
    if fmt != "array_record":
        raise ValueError(
            f"{where}: stored as {fmt}, which only TensorFlow reads; prepare it with file_format='array_record' "
            "(tfds build --file_format=array_record, or download_and_prepare(file_format='array_record'))"
        )
    image, label, classes = _features(info, where)
    splits = list(info.splits.keys())
    if "train" not in splits:
        raise ValueError(f"{where}: no train split (splits: {', '.join(splits) or 'none'})")
    test = next((s for s in TEST_SPLITS if s in splits), None)

    def source(split: str) -> TfdsSource:
        check_shards(folder, info.splits[split])
        n, labels = info.splits[split].num_examples, []
        try:
            records = _data_source(folder, split, image)
            for lo in range(0, n, _READ_BATCH):
                labels += [int(r[label]) for r in records.__getitems__(range(lo, min(lo + _READ_BATCH, n)))]
        except Exception as e:  # the ArrayRecord reader raises RuntimeError, tfds its own on a missing shard
            raise ValueError(f"{where}: split {split} cannot be read ({type(e).__name__}: {e})") from e
        bad = [k for k, v in enumerate(labels) if not 0 <= v < min(len(classes), MAX_CLASSES)]
        if bad:
            raise ValueError(f"{where}: {split} record {bad[0]}: label {labels[bad[0]]} has no class name")
        split_info = info.splits[split]  # check_shards: as many lengths as files
        shards = [(str(p), int(n)) for p, n in zip(split_info.filepaths, split_info.shard_lengths, strict=True)]
        return TfdsSource(str(folder), split, image, label, np.asarray(labels, np.int64), shards)

    read = sorted(p for p in folder.iterdir() if p.is_file())
    train, test_source = source("train"), source(test) if test else None
    held = np.concatenate([s.labels for s in (train, test_source) if s is not None])
    check_classes(f"{folder / INFO} (the ClassLabel {label!r})", tuple(classes), held)
    return Stored(train, test_source, tuple(classes), file_stats(folder, read))
