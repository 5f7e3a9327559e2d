"""Datasets people store: Hugging Face (``save_to_disk`` and Parquet), ArrayRecord and TFDS, each built here with
the library that defines the format, give the same batches as the same images in an image folder:
same splits, labels, class names, decoded pixels, augmentation; through grain's worker processes,
resumed mid-run and split between processes. The fingerprint a resumed run compares, and bad input."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_common.data.arrayrecord import MAGIC, encode_record, write_arrayrecord
from vit_common.data.augment import Augment, ImageTransform
from vit_common.data.datasets import check_outside, load_dataset, open_stored
from vit_common.data.fingerprint import fingerprint_changes
from vit_common.data.images import Preprocess
from vit_common.data.tfds import import_tfds
from vit_jax.data import iterate, train_batches

CLASSES = ("cat", "dog", "emu")
TRANSFORM = ImageTransform((8, 8), 3, Preprocess(), Augment(crop_scale=0.3, flip=True))


def _jpeg(seed: int, size=(12, 10)) -> bytes:
    """A small JPEG of random pixels: its decoded pixels are what every format must reproduce."""
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _images(n_per_class: int = 4) -> list[tuple[bytes, int]]:
    """(encoded image, label), sorted by class then name as an image folder lists them."""
    return [(_jpeg(10 * k + i), k) for k in range(len(CLASSES)) for i in range(n_per_class)]


def _folder(root, images) -> str:
    for i, (data, label) in enumerate(images):
        (root / CLASSES[label]).mkdir(parents=True, exist_ok=True)
        (root / CLASSES[label] / f"{i:03d}.jpg").write_bytes(data)
    return f"imagefolder:{root}"


def _hf(images):
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES))})
    rows = {"image": [{"bytes": d, "path": None} for d, _ in images], "label": [y for _, y in images]}
    return datasets.Dataset.from_dict(rows, features=features)


def _split_folder(root, train, test) -> str:
    _folder(root / "train", train)
    _folder(root / "val", test)
    return f"imagefolder:{root}"


def _batches(data, workers: int = 0, start: int = 0, process_index: int = 0, process_count: int = 1) -> list[dict]:
    ds = train_batches(
        data.train,
        data.num_classes,
        batch_size=4,
        epochs=2,
        seed=7,
        transform=TRANSFORM,
        process_index=process_index,
        process_count=process_count,
    )
    with iterate(ds, start=start, workers=workers) as it:
        return list(it)


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert sorted(x) == sorted(y)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def _same_dataset(a, b) -> None:
    assert (a.classes, len(a.train), len(a.test)) == (b.classes, len(b.train), len(b.test))
    np.testing.assert_array_equal(a.train.labels, b.train.labels)
    np.testing.assert_array_equal(a.test.labels, b.test.labels)
    _same(_batches(a), _batches(b))


@pytest.mark.slow
def test_hf_saved_and_parquet_give_the_image_folders_batches(tmp_path):
    """One Dataset saved with save_to_disk, a DatasetDict with train/test splits, and the same as Parquet
    files in the Hub's layout: each equals the image folder of the same images, batch for batch."""
    import datasets

    images, test = _images(), _images(2)[::-1]
    folder = load_dataset(_folder(tmp_path / "flat", images), (8, 8), 3, val_fraction=0.25)
    _hf(images).save_to_disk(str(tmp_path / "saved"))
    _same_dataset(load_dataset(f"hf:{tmp_path / 'saved'}", (8, 8), 3, val_fraction=0.25), folder)
    test = sorted(test, key=lambda t: t[1])
    split = load_dataset(_split_folder(tmp_path / "split", images, test), (8, 8), 3)
    datasets.DatasetDict(train=_hf(images), validation=_hf(test)).save_to_disk(str(tmp_path / "dict"))
    _same_dataset(load_dataset(f"hf:{tmp_path / 'dict'}", (8, 8), 3), split)
    (tmp_path / "pq" / "data").mkdir(parents=True)
    _hf(images).to_parquet(str(tmp_path / "pq" / "data" / "train-00000-of-00001.parquet"), batch_size=5)
    _hf(test).to_parquet(str(tmp_path / "pq" / "data" / "test-00000-of-00001.parquet"))
    parquet = load_dataset(f"hf:{tmp_path / 'pq'}", (8, 8), 3)
    _same_dataset(parquet, split)
    # workers, resume and a process's share read the same rows (row groups of 5: several per file)
    _same(_batches(parquet, workers=2, start=3), _batches(split)[3:])
    _same(_batches(parquet, process_index=1, process_count=2), _batches(split, process_index=1, process_count=2))


def test_hf_image_paths_and_plain_integer_labels(tmp_path, monkeypatch):
    """An image column of file paths (relative to the dataset folder) and an int label column without
    class names: read as files, classes 0..K-1."""
    import datasets

    images = _images(3)
    (tmp_path / "hf" / "img").mkdir(parents=True)
    for i, (data, _) in enumerate(images):
        (tmp_path / "hf" / "img" / f"{i}.jpg").write_bytes(data)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    rows = {
        "image": [{"bytes": None, "path": f"img/{i}.jpg"} for i in range(len(images))],
        "label": [y for _, y in images],
    }
    monkeypatch.chdir(tmp_path / "hf")  # datasets takes a relative path from the current folder when writing
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "hf" / "train.parquet"))
    monkeypatch.chdir(tmp_path)  # vit takes it from the dataset's folder, wherever it runs
    d = load_dataset(f"hf:{tmp_path / 'hf'}", (8, 8), 3, val_fraction=0.34)
    folder = load_dataset(_folder(tmp_path / "flat", images), (8, 8), 3, val_fraction=0.34)
    assert d.classes == ("0", "1", "2")
    assert {d.train.source[i]["image"] for i in range(9)} == {
        str(tmp_path / "hf" / "img" / f"{i}.jpg") for i in range(9)
    }
    np.testing.assert_array_equal(d.train.labels, folder.train.labels)
    _same(_batches(d), _batches(folder))


@pytest.mark.slow
def test_arrayrecord_written_by_convert_and_by_array_record_equal_the_folder(tmp_path, capsys):
    """``vit data convert`` of an image folder (train/val layout, several shards) and records written
    directly with array_record's own writer (one set, split by --val-fraction) give the folder's batches."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from vit_cli.main import main

    images, test = _images(), sorted(_images(2), key=lambda t: t[1])
    spec = _split_folder(tmp_path / "split", images, test)
    assert main(["data", "convert", spec, str(tmp_path / "ar"), "--shard-size", "5"]) == 0
    assert "12 train + 6 test records, 3 classes" in capsys.readouterr().out
    names = sorted(os.listdir(tmp_path / "ar"))
    assert names[-3:] == [
        "train-00000-of-00003.array_record",
        "train-00001-of-00003.array_record",
        "train-00002-of-00003.array_record",
    ]
    converted = load_dataset(f"arrayrecord:{tmp_path / 'ar'}", (8, 8), 3)
    split = load_dataset(spec, (8, 8), 3)
    _same_dataset(converted, split)
    _same(_batches(converted, workers=2, start=2), _batches(split)[2:])
    writer = ArrayRecordWriter(str(tmp_path / "shard.array_record"), "group_size:1")
    for data, label in images:
        writer.write(encode_record(data, label))
    writer.close()
    direct = load_dataset(f"arrayrecord:{tmp_path / 'shard.array_*'}", (8, 8), 3, val_fraction=0.25)
    folder = load_dataset(_folder(tmp_path / "flat", images), (8, 8), 3, val_fraction=0.25)
    assert direct.classes == ("0", "1", "2")  # no dataset.json beside it
    np.testing.assert_array_equal(direct.train.labels, folder.train.labels)
    _same(_batches(direct), _batches(folder))


def _tfds(data_dir, splits: dict[str, list[tuple[bytes, int]]]) -> str:
    """A tfds dataset ``tiny`` prepared by tfds's own builder in ArrayRecord format, without TensorFlow
    (images given as files: tfds encodes arrays with TensorFlow); in the generator's order
    (``disable_shuffling``). Returns its version folder."""
    tfds = import_tfds()  # the collector paused (its docstring says why)
    files = {}
    for split, images in splits.items():
        (data_dir / "src" / split).mkdir(parents=True)
        files[split] = []
        for i, (data, label) in enumerate(images):
            (data_dir / "src" / split / f"{i}.jpg").write_bytes(data)
            files[split].append((str(data_dir / "src" / split / f"{i}.jpg"), label))

    class Tiny(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {"image": tfds.features.Image(), "label": tfds.features.ClassLabel(names=list(CLASSES))}
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(features),
                supervised_keys=("image", "label"),
                disable_shuffling=True,
            )

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(split) for split in files}

        def _generate_examples(self, split):
            for i, (path, label) in enumerate(files[split]):
                yield i, {"image": path, "label": label}

    builder = Tiny(data_dir=str(data_dir / "tfds"), file_format="array_record")
    builder.download_and_prepare()
    return str(builder.data_dir)


@pytest.mark.slow
def test_tfds_prepared_as_arrayrecord_gives_the_image_folders_batches(tmp_path):
    """A tfds dataset with train and validation splits, prepared and read without TensorFlow, equals the
    image folder of the same images batch for batch: through workers, resumed, and one process's share.
    Its JPEG bytes reach the image path as stored (not decoded by tfds)."""
    images, test = _images(), sorted(_images(2), key=lambda t: t[1])
    version = _tfds(tmp_path, {"train": images, "validation": test})
    d = load_dataset(f"tfds:{version}", (8, 8), 3)
    split = load_dataset(_split_folder(tmp_path / "split", images, test), (8, 8), 3)
    _same_dataset(d, split)
    assert [d.train[i]["image"] for i in range(3)] == [data for data, _ in images[:3]]
    _same(_batches(d, workers=2, start=3), _batches(split)[3:])
    _same(_batches(d, process_index=1, process_count=2), _batches(split, process_index=1, process_count=2))
    by_name = load_dataset(f"tfds:{tmp_path / 'tfds' / 'tiny'}", (8, 8), 3)  # NAME folder of one version
    np.testing.assert_array_equal(by_name.train.labels, d.train.labels)
    assert sorted(d.fingerprint["files"]) == sorted(os.listdir(version))


def test_grain_and_tfds_are_imported_with_no_garbage_collection_while_import_is_replaced():
    """grain and tfds replace ``builtins.__import__`` while they import parts of themselves (etils
    lazy_imports); a collection there runs finalizers whose imports fail. With a collection due at every
    allocation, none runs while the import is replaced, and the collector is on afterwards (a fresh
    interpreter; without the pause each import counts hundreds)."""
    code = (
        "import builtins, gc\n"
        "original, during = builtins.__import__, []\n"
        "gc.callbacks.append(lambda phase, _: phase == 'start' and builtins.__import__ is not original"
        " and during.append(phase))\n"
        "gc.set_threshold(1)\n"
        "import vit_jax.data\n"
        "print(len(during))\n"
        "from vit_common.data.tfds import import_tfds\n"
        "import_tfds()\n"
        "print(len(during), gc.isenabled())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["0", "0", "True"], run.stdout + run.stderr


def test_bad_tfds_datasets_are_refused_by_name(tmp_path, capsys):
    from vit_cli.main import main

    version = _tfds(tmp_path, {"test": _images(1)})
    with pytest.raises(ValueError, match=r"tfds:.*/tiny/1.0.0: no train split \(splits: test\)"):
        load_dataset(f"tfds:{version}", (8, 8), 3)
    capsys.readouterr()
    assert main(["train", "--dataset", f"tfds:{version}", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"vit train: error: tfds:{version}: no train split (splits: test)"], err
    assert not (tmp_path / "run").exists()
    with pytest.raises(FileNotFoundError, match=r"tfds:.*/missing: no such folder"):
        load_dataset(f"tfds:{tmp_path / 'missing'}", (8, 8), 3)
    with pytest.raises(ValueError, match=r"tfds:.*/src: no dataset_info.json in it or in a version folder"):
        load_dataset(f"tfds:{tmp_path / 'src'}", (8, 8), 3)
    info = Path(version) / "dataset_info.json"  # as tfds's default file format would have written it
    info.write_text(info.read_text().replace('"fileFormat": "array_record"', '"fileFormat": "tfrecord"'))
    with pytest.raises(ValueError, match=r"stored as tfrecord, which only TensorFlow reads"):
        load_dataset(f"tfds:{version}", (8, 8), 3)


def test_convert_of_a_parquet_dataset_keeps_its_bytes_and_class_names(tmp_path):
    (tmp_path / "pq").mkdir()
    images = _images(2)
    _hf(images).to_parquet(str(tmp_path / "pq" / "train.parquet"))
    stored = open_stored(f"hf:{tmp_path / 'pq'}")
    assert write_arrayrecord(stored, tmp_path / "ar") == {"train": 6}
    back = open_stored(f"arrayrecord:{tmp_path / 'ar'}")
    assert back.classes == CLASSES and back.test is None
    assert [back.train[i]["image"] for i in range(6)] == [d for d, _ in images]
    np.testing.assert_array_equal(back.train.labels, [y for _, y in images])


def test_fingerprint_lists_what_changed_and_mtimes_alone_only_warn(tmp_path):
    spec = _folder(tmp_path / "f", _images(3))
    before = load_dataset(spec, (8, 8), 3).fingerprint
    assert before["classes"] == list(CLASSES) and (before["train"], before["test"]) == (6, 3)
    assert sorted(before["files"])[:2] == ["cat/000.jpg", "cat/001.jpg"]
    os.utime(tmp_path / "f" / "cat" / "000.jpg", ns=(1, 1))
    errors, warnings = fingerprint_changes(before, load_dataset(spec, (8, 8), 3).fingerprint)
    assert errors == [] and warnings == ["file(s) have other modification times but the same sizes (1): cat/000.jpg"]
    (tmp_path / "f" / "dog" / "009.jpg").write_bytes(_jpeg(99))
    (tmp_path / "f" / "emu" / "006.jpg").write_bytes(_jpeg(98, (20, 20)))
    (tmp_path / "f" / "cat" / "001.jpg").unlink()
    errors, _ = fingerprint_changes(before, load_dataset(spec, (8, 8), 3).fingerprint)
    assert errors == [
        "files added (1): dog/009.jpg",
        "files removed (1): cat/001.jpg",
        "files of another size (1): emu/006.jpg",
    ]
    os.rename(tmp_path / "f" / "emu", tmp_path / "f" / "bird")
    errors, _ = fingerprint_changes(before, load_dataset(spec, (8, 8), 3).fingerprint)
    assert errors[0] == "classes: the run has ['cat', 'dog', 'emu'], the data now ['bird', 'cat', 'dog']"


def test_a_large_dataset_is_fingerprinted_by_folder(tmp_path, monkeypatch):
    """Beyond FINGERPRINT_FILES files the fingerprint holds a digest per folder (config.json stays small):
    changes are named by folder; a smaller dataset saved with a file list compares against it too."""
    import vit_common.data.datasets as datasets

    spec = _folder(tmp_path / "f", _images(3))
    listed = load_dataset(spec, (8, 8), 3).fingerprint
    monkeypatch.setattr(datasets, "FINGERPRINT_FILES", 4)
    before = load_dataset(spec, (8, 8), 3).fingerprint
    assert "files" not in before and sorted(before["folders"]) == list(CLASSES)
    assert [n for n, _, _ in before["folders"].values()] == [3, 3, 3]
    assert fingerprint_changes(listed, before) == ([], [])
    os.utime(tmp_path / "f" / "cat" / "000.jpg", ns=(1, 1))
    errors, warnings = fingerprint_changes(before, load_dataset(spec, (8, 8), 3).fingerprint)
    assert errors == [] and warnings == ["folder(s) whose files have other modification times only (1): cat"]
    (tmp_path / "f" / "dog" / "009.jpg").write_bytes(_jpeg(99))
    errors, _ = fingerprint_changes(before, load_dataset(spec, (8, 8), 3).fingerprint)
    assert errors == [
        "train images: the run has 6, the data now 7",
        "folders whose files were added, removed or resized (1): dog",
    ]


def test_every_stored_kind_fingerprints_the_files_it_reads(tmp_path):
    """hf: (save_to_disk's Arrow and JSON files), arrayrecord: (the shards and dataset.json) and npz:
    (the file) list their files; a shard removed is a change; an .npz rewritten at the same size with
    other labels is one too (the labels' digest), not only a new modification time."""
    images = _images(2)
    _hf(images).save_to_disk(str(tmp_path / "saved"))
    hf = load_dataset(f"hf:{tmp_path / 'saved'}", (8, 8), 3).fingerprint
    assert sorted(hf["files"]) == ["data-00000-of-00001.arrow", "dataset_info.json", "state.json"]
    write_arrayrecord(open_stored(f"hf:{tmp_path / 'saved'}"), tmp_path / "ar", shard_size=4)
    spec = f"arrayrecord:{tmp_path / 'ar' / 'train-*'}"
    before = load_dataset(spec, (8, 8), 3, val_fraction=0.5).fingerprint
    shards = ["train-00000-of-00002.array_record", "train-00001-of-00002.array_record"]
    assert sorted(before["files"]) == ["dataset.json", *shards]
    os.unlink(tmp_path / "ar" / shards[1])
    errors, _ = fingerprint_changes(before, load_dataset(spec, (8, 8), 3, val_fraction=0.5).fingerprint)
    assert errors == [
        "train images: the run has 3, the data now 2",
        "test images: the run has 3, the data now 2",
        f"files removed (1): {shards[1]}",
    ]
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2, 2), np.uint8), y=np.array([0, 1, 0, 1]))
    npz = load_dataset(f"npz:{tmp_path / 'd.npz'}", (2, 2), 1).fingerprint
    assert list(npz["files"]) == ["d.npz"]
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2, 2), np.uint8), y=np.array([1, 0, 1, 0]))
    errors, warnings = fingerprint_changes(npz, load_dataset(f"npz:{tmp_path / 'd.npz'}", (2, 2), 1).fingerprint)
    assert errors == ["labels: the same counts, but other labels or another order of them"]


def test_bad_stored_datasets_are_refused_by_name(tmp_path):
    import datasets

    images = _images(2)
    rows = {"image": [{"bytes": d, "path": None} for d, _ in images]}
    no_label = datasets.Dataset.from_dict(rows, features=datasets.Features({"image": datasets.Image()}))
    no_label.save_to_disk(str(tmp_path / "nolabel"))
    with pytest.raises(ValueError, match=r"nolabel \(split 'train'\): no label column"):
        load_dataset(f"hf:{tmp_path / 'nolabel'}", (8, 8), 3)
    texts = datasets.Dataset.from_dict(rows | {"label": ["cat"] * len(images)})
    texts = texts.cast_column("image", datasets.Image())
    texts.save_to_disk(str(tmp_path / "text"))
    with pytest.raises(ValueError, match=r"label column 'label' holds string; expected integers"):
        load_dataset(f"hf:{tmp_path / 'text'}", (8, 8), 3)
    holes = datasets.Dataset.from_dict(rows | {"label": [0, None] * 3})
    holes.cast_column("image", datasets.Image()).save_to_disk(str(tmp_path / "holes"))
    with pytest.raises(ValueError, match=r"holes \(split 'train'\): the label column has missing values"):
        load_dataset(f"hf:{tmp_path / 'holes'}", (8, 8), 3)
    broken = [(d if i != 2 else d[: len(d) // 2], y) for i, (d, y) in enumerate(images)]
    (tmp_path / "pq").mkdir()
    _hf(broken).to_parquet(str(tmp_path / "pq" / "train.parquet"))
    with pytest.raises(ValueError, match=r"1 unreadable .*pq/train.parquet: row 2: unreadable image"):
        load_dataset(f"hf:{tmp_path / 'pq'}", (8, 8), 3)
    with pytest.raises(ValueError, match=r"arrayrecord:.*/none-\*: no files match"):
        load_dataset(f"arrayrecord:{tmp_path / 'none-*'}", (8, 8), 3)
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(str(tmp_path / "other.array_record"), "group_size:1")
    writer.write(b"\x08\x01not ours")
    writer.close()
    with pytest.raises(ValueError, match=r"other.array_record: record 0: not a vit-twins image record"):
        load_dataset(f"arrayrecord:{tmp_path / 'other.array_record'}", (8, 8), 3)
    assert MAGIC == b"VIT\x01"
    with pytest.raises(ValueError, match=r"--out .*/pq/run lies inside the dataset"):
        check_outside(f"hf:{tmp_path / 'pq'}", tmp_path / "pq" / "run")
    check_outside(f"hf:{tmp_path / 'pq'}", tmp_path / "pq2")


def test_an_arrayrecord_shard_cut_after_opening_fails_each_read_by_name_until_restored(tmp_path):
    """array_record opens a file cut at a block boundary (half of a small shard: 64 KiB of 128) as one of
    fewer records and reads b"" past its end; each read of the cut shard is refused, named, and once the
    shard is restored the same source reads it again (its reader opened anew)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from vit_common.data.arrayrecord import open_arrayrecord

    images = _images(2)
    writer = ArrayRecordWriter(str(tmp_path / "train.array_record"), "group_size:1")
    for data, label in images:
        writer.write(encode_record(data, label))
    writer.close()
    shard = tmp_path / "train.array_record"
    source = open_arrayrecord(str(shard)).train
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) // 2])
    for k in (0, 3):
        with pytest.raises(
            ValueError,
            match=rf"^{shard}: record {k}: a damaged ArrayRecord file \(it holds 0 records, 6 when the dataset was "
            r"opened: truncated or rewritten since\)$",
        ):
            source[k]
    shard.write_bytes(whole)
    assert [source[k]["image"] for k in range(6)] == [d for d, _ in images]
