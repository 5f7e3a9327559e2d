"""``hf:PATH``: a Hugging Face dataset on disk, read lazily a row at a time (``datasets`` + pyarrow).

Two layouts, both as ``datasets`` writes them:

- ``save_to_disk``: a ``Dataset`` folder (``state.json``, ``dataset_info.json``, ``data-*.arrow``) or a
  ``DatasetDict`` folder (``dataset_dict.json`` and one such folder per split). Read with
  ``datasets.load_from_disk`` for the features and files; the rows from the memory-mapped Arrow files.
- A folder of Parquet files (``Dataset.to_parquet``, the Hub's ``data/train-00000-of-00004.parquet``):
  splits from the file names by ``datasets``' own rules (``datasets.data_files.get_data_patterns``),
  features from the schema metadata ``datasets`` writes. Rows are read a row group at a time, the last
  one kept: in order (the up-front check) every row group is read once; in a shuffled training order
  each example reads its row group, so for large sets ``vit data convert hf:PATH DST`` (ArrayRecord,
  one record per image) is the faster format.

Columns: the image is the one column of the ``Image`` feature (or the column ``image``), holding encoded
bytes or a file path (a relative path is taken from PATH); the label is the one ``ClassLabel`` column
(several: the one named ``label``), whose names become the class names, or an integer column named
``label`` / ``labels`` (classes ``0..K-1``). Splits: ``train``, and the first of ``val``,
``validation``, ``valid``, ``test`` as the test split; without one the test split is drawn by
``--val-fraction`` as for image folders. ``datasets`` and pyarrow are imported when a dataset is opened.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from vit_common.data.stored_datasets import MAX_CLASSES, TEST_SPLITS, Stored, Subset, check_classes, file_stats


class ArrowRows:
    """Rows of Arrow (``save_to_disk``) or Parquet files: element ``{"image": bytes or path (str),
    "label": int32}``. Picklable (grain's worker processes): files are opened where they are read.

    files: the files in order, each with its row count; image, label: column names; base: the folder
    relative image paths are taken from; labels: int32 [N], every row's label.
    """

    def __init__(self, files: list[tuple[str, int]], parquet: bool, image: str, label: str, base: Path, labels):
        self.files, self.parquet, self.image, self.label, self.base = files, parquet, image, label, str(base)
        self.labels = np.asarray(labels, np.int32)
        self._starts = np.cumsum([0] + [n for _, n in files])
        self._open: dict = {}

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_open"} | {"_open": {}}

    def __len__(self) -> int:
        return len(self.labels)

    def _table(self, f: int, row: int):
        """(the table holding row ``row`` of file ``f``, the row's index in it)."""
        import pyarrow.parquet as pq

        path = self.files[f][0]
        if not self.parquet:
            if path not in self._open:
                with _damaged(path, "Arrow"):
                    self._open = {path: _arrow_table(path).select([self.image])}
            return self._open[path], row
        if (path, "meta") not in self._open:
            with _damaged(path, "Parquet"):
                self._open = {(path, "meta"): pq.ParquetFile(path)}
        meta = self._open[(path, "meta")]
        sizes = np.cumsum([0] + [meta.metadata.row_group(g).num_rows for g in range(meta.num_row_groups)])
        g = int(np.searchsorted(sizes, row, side="right") - 1)
        if (path, g) not in self._open:
            with _damaged(path, "Parquet", f" (row group {g}, rows {int(sizes[g])}..{int(sizes[g + 1]) - 1})"):
                self._open = {(path, "meta"): meta, (path, g): meta.read_row_group(g, columns=[self.image])}
        return self._open[(path, g)], row - int(sizes[g])

    def name(self, i: int) -> str:
        """Where row ``i`` is stored (file and row), for errors."""
        f = int(np.searchsorted(self._starts, i, side="right") - 1)
        return f"{self.files[f][0]}: row {i - int(self._starts[f])}"

    def _image(self, i: int) -> tuple[str, bytes | str]:
        """(name of the row for errors, its image: bytes, or a path)."""
        f = int(np.searchsorted(self._starts, i, side="right") - 1)
        table, row = self._table(f, i - int(self._starts[f]))
        name = self.name(i)
        value = table.column(0)[row].as_py()
        if isinstance(value, dict):  # the Image feature: {"bytes": ..., "path": ...}
            value = value.get("bytes") or value.get("path")
        if isinstance(value, str):
            return name, os.path.join(self.base, value)
        return name, value if isinstance(value, bytes) else b""  # nothing: refused as no image by the check

    def __getitem__(self, i: int) -> dict:
        return {"image": self._image(int(i))[1], "label": self.labels[i]}

    def images(self) -> Iterator[tuple[str, bytes | str]]:
        return (self._image(i) for i in range(len(self)))

    def take(self, indices: np.ndarray):
        return Subset(self, indices)


def _columns(where: str, features) -> tuple[str, str, tuple[str, ...] | None]:
    """(image column, label column, class names or None for a plain integer column) of ``features``.

    Raises:
        ValueError: no image column, no label column, or a label column that is not integer.
    """
    import datasets

    names = list(features)
    images = [k for k, f in features.items() if isinstance(f, datasets.Image)]
    image = images[0] if len(images) == 1 else "image" if "image" in features else None
    if image is None:
        raise ValueError(f"{where}: no image column (an Image feature, or a column 'image'); columns {names}")
    labels = [k for k, f in features.items() if isinstance(f, datasets.ClassLabel)]
    if len(labels) == 1 or "label" in labels:
        label = labels[0] if len(labels) == 1 else "label"
        return image, label, tuple(features[label].names)
    label = next((k for k in ("label", "labels") if k in features), None)
    if label is None:
        raise ValueError(
            f"{where}: no label column (a ClassLabel, or an integer column 'label'); columns {names}"
            + (f" (ClassLabel columns {labels}: name the one to use 'label')" if labels else "")
        )
    dtype = getattr(features[label], "dtype", type(features[label]).__name__)
    if not str(dtype).startswith(("int", "uint")):
        raise ValueError(f"{where}: label column {label!r} holds {dtype}; expected integers (a ClassLabel or int)")
    return image, label, None


def _labels(
    where: str, values: np.ndarray, classes: tuple[str, ...] | None, files: list[tuple[str, int]]
) -> np.ndarray:
    """The label column as int32, checked as it is read: every value in [0, K) (K the ClassLabel's names,
    or the limit), the first that is not named by its file and row."""
    k = len(classes) if classes is not None else MAX_CLASSES
    if not np.issubdtype(values.dtype, np.integer):  # pyarrow gives floats (NaN) for an int column with nulls
        raise ValueError(f"{where}: the label column has missing values; expected a label for every row")
    bad = np.flatnonzero((values < 0) | (values >= k)) if len(values) else values
    if len(bad):
        i = int(bad[0])
        starts = np.cumsum([0] + [n for _, n in files])
        f = int(np.searchsorted(starts, i, side="right") - 1)
        names = f" (the ClassLabel names {k} classes)" if classes is not None else ""
        raise ValueError(
            f"{files[f][0]}: row {i - int(starts[f])}: label {int(values[i])}: expected labels in [0, {k - 1}]{names}"
        )
    return values.astype(np.int32)


def _saved(root: Path) -> dict:
    """{split: (files with row counts, features, False)} of a ``save_to_disk`` folder."""
    import json

    import datasets

    try:
        loaded = datasets.load_from_disk(str(root))
    except IndexError:  # what datasets raises on a dataset of 0 rows (its Arrow files hold no batch)
        files = sorted(root.rglob("*.arrow"))
        for f in files:
            with _damaged(str(f), "Arrow"):
                rows = _arrow_table(str(f)).num_rows
            if rows:
                raise ValueError(f"{root}: a save_to_disk folder datasets cannot load ({f}: {rows} rows)") from None
        raise ValueError(f"{root}: 0 rows; expected labelled images") from None
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{root}: not a dataset saved with save_to_disk ({e})") from e
    splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    out = {}
    for name, ds in splits.items():
        files = [c["filename"] for c in ds.cache_files]
        out[name] = ([(f, _arrow_table(f).num_rows) for f in files], ds.features, False)
    return out


def _arrow_table(path: str):
    """A ``save_to_disk`` Arrow file (the IPC stream format) as a table, memory-mapped (zero-copy)."""
    import pyarrow as pa

    with pa.memory_map(path) as source:
        return pa.ipc.open_stream(source).read_all()


def _parquet(root: Path) -> dict:
    """{split: (files with row counts, features, True)} of a folder of Parquet files."""
    import datasets
    import pyarrow.parquet as pq
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        patterns = get_data_patterns(str(root))
        resolved = DataFilesDict.from_patterns(patterns, base_path=str(root))
    except (FileNotFoundError, datasets.exceptions.DataFilesNotFoundError) as e:
        raise ValueError(
            f"{root}: neither a dataset saved with save_to_disk nor a folder of Parquet files ({e})"
        ) from e
    out = {}
    for name, files in resolved.items():
        files = sorted(str(f) for f in files if str(f).endswith(".parquet"))
        if not files:
            continue
        try:
            metas = [pq.ParquetFile(f) for f in files]
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise ValueError(f"{root}: a Parquet file that cannot be read ({e})") from e
        features = datasets.Features.from_arrow_schema(metas[0].schema_arrow)
        for f, m in zip(files, metas, strict=True):
            if datasets.Features.from_arrow_schema(m.schema_arrow) != features:
                raise ValueError(f"{f}: its columns differ from those of {files[0]}")
        out[name] = ([(f, m.metadata.num_rows) for f, m in zip(files, metas, strict=True)], features, True)
    if not out:
        raise ValueError(f"{root}: neither a dataset saved with save_to_disk nor a folder of Parquet files")
    return out


def _label_values(files: list[tuple[str, int]], label: str, parquet: bool) -> np.ndarray:
    """Every row's label, file by file.

    Raises:
        ValueError: a file whose pages or record batches cannot be read (a damaged file), naming it.
    """
    import pyarrow.parquet as pq

    out = []
    for f, _ in files:
        with _damaged(f, "Parquet" if parquet else "Arrow"):
            table = pq.read_table(f, columns=[label]) if parquet else _arrow_table(f)
            out.append(table.column(label).to_numpy())
    return np.concatenate(out)


@contextlib.contextmanager
def _damaged(path: str, kind: str, where: str = ""):
    """pyarrow's errors reading ``path`` (OSError, ArrowInvalid: a ValueError), which name no file, as one
    line that does."""
    try:
        yield
    except (OSError, ValueError) as e:
        text = " ".join(str(e).split())
        raise ValueError(f"{path}: a damaged {kind} file{where} ({text[:200]})") from None


def open_hf(root: Path) -> Stored:
    """The splits of ``hf:PATH`` (module docstring), unsplit and unchecked.

    Raises:
        FileNotFoundError: no such folder.
        ValueError: neither layout; a split of 0 rows; a damaged Parquet or Arrow file (named); no image or
            label column, a label column that is not integer or holds values outside its classes (naming
            the file and row); splits with other columns or other class names; class names empty or
            repeated, or a class no row has (``check_classes``); no ``train`` split among several.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder")
    saved = (root / "dataset_dict.json").is_file() or (root / "state.json").is_file()
    splits = _saved(root) if saved else _parquet(root)
    if "train" not in splits and len(splits) > 1:
        raise ValueError(f"{root}: no 'train' split among {sorted(splits)}")
    train_name = "train" if "train" in splits else next(iter(splits))
    test_name = next((n for n in TEST_SPLITS if n in splits), None)
    sources, classes = {}, None
    for name in (train_name, test_name):
        if name is None:
            continue
        files, features, parquet = splits[name]
        where = f"{root} (split {name!r})"
        image, label, names = _columns(where, features)
        if classes is not None and names is not None and names != classes:
            raise ValueError(f"{where}: class names {list(names)} differ from the train split's {list(classes)}")
        if not sum(n for _, n in files):
            raise ValueError(f"{where}: 0 rows; expected labelled images")
        values = _labels(where, _label_values(files, label, parquet), names, files)
        classes = names if names is not None else classes
        sources[name] = ArrowRows(files, parquet, image, label, root, values)
    held = np.concatenate([s.labels for s in sources.values()])
    if classes is None:
        classes = tuple(str(k) for k in range(int(held.max()) + 1))
        check_classes(f"{root} (integer labels: a class per value 0..{len(classes) - 1})", classes, held)
    else:
        check_classes(f"{root} (the ClassLabel of split {train_name!r})", classes, held)
    read = [f for s in sources.values() for f, _ in s.files]
    read += [str(p) for p in root.rglob("*.json")]
    test = sources.get(test_name) if test_name else None
    return Stored(sources[train_name], test, tuple(classes), file_stats(root, sorted(set(read))))
