"""Hostile datasets: what `vit train --dataset` reads (labels that wrap or were never trained on, Hugging
Face sets without labels or with text labels, unreadable, truncated, bomb and FIFO images, odd class
folders, images of height 0, --out inside the dataset, --resume after the data changed) and where
`vit data convert` writes."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from vit_cli.main import main
from vit_common.data.tfds import import_tfds

from .harness import TRAIN, Case, bomb_png, cached, check_case, npz_dataset, params, write_png


def labels(name: str, y, y_test=None) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        data = npz_dataset(tmp / "d.npz", y, y_test)
        return [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run")]

    build.__name__ = name
    return build


def _folder(root: Path, n: int = 3, suffix: str = ".png") -> Path:
    """An image folder of classes a and b, ``n`` 8x8 images each."""
    from PIL import Image

    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(root / c / f"{i}{suffix}")
    return root


def _train_on(spec: str, tmp: Path, *extra: str) -> list[str]:
    return [*TRAIN, "--dataset", spec, "--out", str(tmp / "run"), *extra]


def _hf_rows(tmp: Path, name: str, label) -> Path:
    """A save_to_disk dataset of 6 PNGs with the column ``label`` as given (None: no label column)."""
    import io as bytes_io

    import datasets
    from PIL import Image

    def png(i: int) -> bytes:
        buf = bytes_io.BytesIO()
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(buf, "PNG")
        return buf.getvalue()

    rows = {"image": [{"bytes": png(i), "path": None} for i in range(6)]} | ({"label": label} if label else {})
    ds = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    ds.save_to_disk(str(tmp / name))
    return tmp / name


def hf_without_labels(tmp: Path) -> list[str]:
    return _train_on(f"hf:{_hf_rows(tmp, 'hf', None)}", tmp)


def hf_classlabel_of_5_names(tmp: Path) -> list[str]:
    """A ClassLabel naming 5 classes for rows labelled a and b."""
    import datasets

    ds = datasets.load_from_disk(str(_hf_rows(tmp, "rows", [0, 1] * 3)))
    ds.cast_column("label", datasets.ClassLabel(names=["a", "b", "c", "d", "e"])).save_to_disk(str(tmp / "hf"))
    return _train_on(f"hf:{tmp / 'hf'}", tmp)


def hf_label_beyond_the_limit(tmp: Path) -> list[str]:
    return _train_on(f"hf:{_hf_rows(tmp, 'hf', [0, 1, 0, 2**20, 0, 1])}", tmp)


def hf_text_labels(tmp: Path) -> list[str]:
    return _train_on(f"hf:{_hf_rows(tmp, 'hf', ['cat', 'dog'] * 3)}", tmp)


def parquet_unreadable_image(tmp: Path) -> list[str]:
    import datasets

    good = (write_png(tmp / "x.png", (8, 8))).read_bytes()
    (tmp / "x.png").unlink()
    rows = {"image": [{"bytes": good, "path": None}] * 5 + [{"bytes": b"\x89PNG not one", "path": None}]}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    (tmp / "pq").mkdir()
    datasets.Dataset.from_dict(rows | {"label": [0, 1] * 3}, features=features).to_parquet(
        str(tmp / "pq" / "train.parquet")
    )
    return _train_on(f"hf:{tmp / 'pq'}", tmp)


def _parquet(path: Path, n: int) -> Path:
    """A Parquet file of ``n`` rows (8x8 PNGs, ClassLabel a/b) as ``datasets`` writes it: uncompressed
    image pages first, then the snappy label page."""
    import datasets

    good = write_png(path.with_suffix(".png"), (8, 8)).read_bytes()
    path.with_suffix(".png").unlink()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    rows = {"image": [{"bytes": good, "path": None}] * n, "label": [0, 1] * (n // 2)}
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    return path


def damaged_parquet(column: str):
    """A Parquet folder whose ``column`` chunk has 30 bytes overwritten (its page header, or data)."""

    def build(tmp: Path) -> list[str]:
        import pyarrow.parquet as pq

        (tmp / "pq").mkdir()
        path = _parquet(tmp / "pq" / "train.parquet", 6)
        meta = pq.ParquetFile(path).metadata.row_group(0)
        chunk = next(meta.column(c) for c in range(meta.num_columns) if meta.column(c).path_in_schema == column)
        data = bytearray(path.read_bytes())
        start = chunk.data_page_offset + (8 if column != "label" else 20)
        data[start : start + 30] = b"\xff" * 30
        path.write_bytes(bytes(data))
        return _train_on(f"hf:{tmp / 'pq'}", tmp)

    build.__name__ = f"parquet {column} pages damaged"
    return build


def parquet_empty_test_split(tmp: Path) -> list[str]:
    (tmp / "pq").mkdir()
    _parquet(tmp / "pq" / "train.parquet", 6)
    _parquet(tmp / "pq" / "test.parquet", 0)
    return _train_on(f"hf:{tmp / 'pq'}", tmp)


def hf_saved_with_0_rows(tmp: Path) -> list[str]:
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    datasets.Dataset.from_dict({"image": [], "label": []}, features=features).save_to_disk(str(tmp / "hf"))
    return _train_on(f"hf:{tmp / 'hf'}", tmp)


def hf_arrow_truncated(tmp: Path) -> list[str]:
    root = _hf_rows(tmp, "hf", [0, 1] * 3)
    arrow = next(root.glob("*.arrow"))
    data = arrow.read_bytes()
    arrow.write_bytes(data[: len(data) // 2])
    return _train_on(f"hf:{root}", tmp)


def damaged_tfds(what: str, damage: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """A tfds dataset (6 PNGs of classes a/b, one train shard) prepared by tfds's own builder as
    ArrayRecord, without TensorFlow, then ``damage(version folder)``, then training on it."""

    def build(tmp: Path) -> list[str]:
        version = _tfds_dataset(_folder(tmp / "imgs"), tmp / "tfds")
        damage(version)
        return _train_on(f"tfds:{version}", tmp)

    build.__name__ = f"tfds {what}"
    return build


def _tfds_dataset(imgs: Path, data_dir: Path) -> Path:
    """The version folder of a tfds dataset of the image folder ``imgs`` (classes a/b, its images in the
    image folder's order: unshuffled), prepared by tfds's own builder as ArrayRecord, one train shard."""
    tfds = import_tfds()  # the collector paused (its docstring says why)

    files = sorted(imgs.rglob("*.png"))

    class Tiny(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {"image": tfds.features.Image(), "label": tfds.features.ClassLabel(names=["a", "b"])}
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict(features), disable_shuffling=True
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i, f in enumerate(files):
                yield i, {"image": str(f), "label": f.parent.name}

    Tiny.__module__ = "__main__"  # tfds looks for files beside a package's builder (tests.hostile is one)
    builder = Tiny(data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare()
    return Path(builder.data_dir)


def _claim_more(version: Path) -> None:
    info = json.loads((version / "dataset_info.json").read_text())
    info["splits"][0]["shardLengths"] = ["9"]
    (version / "dataset_info.json").write_text(json.dumps(info))


def _third_class_name(version: Path) -> None:
    """A class name 'c' added to the label feature (its names file and its class count)."""
    (version / "label.labels.txt").write_text("a\nb\nc\n")
    features = (version / "features.json").read_text()
    (version / "features.json").write_text(features.replace('"numClasses": "2"', '"numClasses": "3"'))


def _tfds_shard(version: Path) -> Path:
    return next(version.glob("*train.array_record*"))


def arrayrecord_matching_nothing(tmp: Path) -> list[str]:
    return _train_on(f"arrayrecord:{tmp / 'shards' / 'train-*.array_record'}", tmp)


def damaged_records(what: str, damage: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """``vit data convert`` of an image folder (3 classes of 6 images) into 3 shards of 6 records, then
    ``damage(folder)``, then training on it."""

    def build(tmp: Path) -> list[str]:
        _folder(tmp / "imgs", n=6)
        (tmp / "imgs" / "c").mkdir()
        for i in range(6):
            write_png(tmp / "imgs" / "c" / f"{i}.png", (8, 8))
        assert main(["data", "convert", str(tmp / "imgs"), str(tmp / "rec"), "--shard-size", "6"]) == 0
        damage(tmp / "rec")
        return _train_on(f"arrayrecord:{tmp / 'rec'}", tmp)

    build.__name__ = f"arrayrecord {what}"
    return build


SHARD = "train-00001-of-00003.array_record"


def _overwrite_records(rec: Path) -> None:
    data = bytearray((rec / SHARD).read_bytes())
    data[300:600] = np.random.default_rng(0).integers(0, 256, 300, np.uint8).tobytes()
    (rec / SHARD).write_bytes(bytes(data))


def _truncate(rec: Path) -> None:
    data = (rec / SHARD).read_bytes()
    (rec / SHARD).write_bytes(data[: len(data) // 2])


def _to_dev_zero(rec: Path) -> None:
    (rec / SHARD).unlink()
    os.symlink("/dev/zero", rec / SHARD)


def _declare(**changes) -> Callable[[Path], None]:
    def damage(rec: Path) -> None:
        info = json.loads((rec / "dataset.json").read_text())
        (rec / "dataset.json").write_text(json.dumps(info | changes))

    return damage


def fifo_in_image_folder(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    os.mkfifo(tmp / "imgs" / "b" / "9.png")
    return _train_on(f"imagefolder:{tmp / 'imgs'}", tmp)


def class_name_not_utf8(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    os.rename(tmp / "imgs" / "b", os.fsencode(tmp / "imgs") + b"/b\xff")
    return _train_on(f"imagefolder:{tmp / 'imgs'}", tmp)


def classes_equal_after_normalisation(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    os.rename(tmp / "imgs" / "a", tmp / "imgs" / "caf\u00e9")  # é composed
    os.rename(tmp / "imgs" / "b", tmp / "imgs" / "cafe\u0301")  # e + combining acute
    return _train_on(f"imagefolder:{tmp / 'imgs'}", tmp)


def out_inside_the_dataset(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    return [*TRAIN, "--dataset", f"imagefolder:{tmp / 'imgs'}", "--out", str(tmp / "imgs" / "runs" / "r1")]


def npz_images_of_height_0(tmp: Path) -> list[str]:
    np.savez(tmp / "d.npz", x=np.zeros((8, 0, 8), np.uint8), y=np.array([0, 1] * 4))
    return _train_on(f"npz:{tmp / 'd.npz'}", tmp)


def truncated_jpeg_in_image_folder(tmp: Path) -> list[str]:
    """A 64x64 JPEG of noise cut to 60%: its header is whole, so Pillow opens and verify()s it; only
    decoding finds the end missing."""
    from PIL import Image

    _folder(tmp / "imgs", suffix=".jpg")
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp / "imgs" / "a" / "1.jpg", quality=90)
    whole = (tmp / "imgs" / "a" / "1.jpg").read_bytes()
    (tmp / "imgs" / "a" / "1.jpg").write_bytes(whole[: len(whole) * 6 // 10])
    with Image.open(tmp / "imgs" / "a" / "1.jpg") as im:
        im.verify()  # what the up-front check did before: it passes
    return _train_on(f"imagefolder:{tmp / 'imgs'}", tmp)


def convert_into_the_source(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    return ["data", "convert", str(tmp / "imgs"), str(tmp / "imgs" / "records")]


def convert_into_a_user_folder(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("mine\n")
    return ["data", "convert", str(tmp / "imgs"), str(tmp / "mine")]


def resume_on_changed_data(tmp: Path) -> list[str]:
    """A finished run on an image folder, then an image added and a class folder renamed."""
    _folder(tmp / "imgs")
    argv = _train_on(f"imagefolder:{tmp / 'imgs'}", tmp, *cached(tmp.parents[1]))
    assert main(argv) == 0
    write_png(tmp / "imgs" / "a" / "9.png", (8, 8))
    os.rename(tmp / "imgs" / "b", tmp / "imgs" / "c")
    return [*argv, "--resume"]


def bomb_in_image_folder(tmp: Path) -> list[str]:
    for c in ("a", "b"):
        (tmp / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            write_png(tmp / "imgs" / c / f"{i}.png", (8, 8))
    bomb_png(tmp / "imgs" / "b" / "3.png")
    return [*TRAIN, "--dataset", f"imagefolder:{tmp / 'imgs'}", "--out", str(tmp / "run")]


CASES = [
    # silent wrong results
    Case(labels("label 2**32", [0, 1, 0, 2**32, 0, 1, 1, 0]), r"{tmp}/d.npz: label 4294967296 in x/y: expected"),
    Case(labels("label 10**9", [0, 1, 0, 10**9, 0, 1, 1, 0]), r"{tmp}/d.npz: label 1000000000 in x/y"),
    Case(labels("uint64 label", np.array([0, 1, 0, 2**63 + 5, 0, 1, 1, 0], np.uint64)), r"label 9223372036854775813"),
    Case(labels("unseen test labels", [0, 1] * 4, [0, 1, 7, 9]), r"{tmp}/d.npz: y_test holds label\(s\) \[7, 9\]"),
    Case(hf_without_labels, r"{tmp}/hf \(split 'train'\): no label column \(a ClassLabel, or an integer"),
    Case(hf_text_labels, r"{tmp}/hf \(split 'train'\): label column 'label' holds string; expected integers"),
    Case(parquet_unreadable_image, r"{tmp}/pq/train.parquet: row 5: unreadable image"),
    Case(arrayrecord_matching_nothing, r"arrayrecord:{tmp}/shards/train-\*.array_record: no files match"),
    Case(npz_images_of_height_0, r"{tmp}/d.npz: x/y images are 0x8 pixels; expected at least 1x1"),
    Case(truncated_jpeg_in_image_folder, r"{tmp}/imgs/a/1.jpg: unreadable image \(image file is truncated"),
    Case(class_name_not_utf8, r"{tmp}/imgs: class folder b'b\\xff' is not valid UTF-8"),
    Case(classes_equal_after_normalisation, r"{tmp}/imgs: class folders .* have the same name in Unicode normal form"),
    Case(out_inside_the_dataset, r"--out {tmp}/imgs/runs/r1 lies inside the dataset {tmp}/imgs"),
    Case(convert_into_the_source, r"DST {tmp}/imgs/records lies inside the dataset {tmp}/imgs"),
    Case(convert_into_a_user_folder, r"{tmp}/mine: a folder holding things vit did not write .*notes.txt"),
    Case(
        resume_on_changed_data,
        r"{tmp}/run: the dataset changed since the run started \(classes: the run has \['a', 'b'\], the data now "
        r"\['a', 'c'\]; train images: the run has 4, the data now 5; files added \(4\): a/9.png, c/0.png, .*; "
        r"files removed \(3\): b/0.png",
    ),
    # damaged datasets: one line naming the file and the damage
    Case(
        damaged_records("shard overwritten", _overwrite_records),
        rf"{{tmp}}/rec/{SHARD}: a damaged ArrayRecord file \(at record 0 of 6: Corrupted Riegeli",
    ),
    Case(damaged_records("shard truncated", _truncate), rf"{{tmp}}/rec/{SHARD}: a damaged ArrayRecord file"),
    Case(damaged_records("shard a link to /dev/zero", _to_dev_zero), rf"{{tmp}}/rec/{SHARD}: a device, expected"),
    Case(
        damaged_records("shard deleted", lambda rec: (rec / SHARD).unlink()),
        r"{tmp}/rec/dataset.json: declares 18 train records; the files hold 12 \(train-00000-of-00003.array_record: 6",
    ),
    Case(
        damaged_records("5 classes named for 3", _declare(classes=["a", "b", "c", "d", "e"])),
        r"{tmp}/rec/dataset.json: names 5 classes, but no record is labelled 'd', 'e' \(the records hold 3 classes\)",
    ),
    # what a dataset declares about its classes, against its labels
    Case(
        damaged_records("2 names for 3 classes", _declare(classes=["a", "b"])),
        r"{tmp}/rec/train-00002-of-00003.array_record: record 0: label 2: {tmp}/rec/dataset.json names 2 "
        r"classes; expected labels in \[0, 1\]",
    ),
    Case(
        damaged_records("a class named twice", _declare(classes=["a", "b", "a"])),
        r"{tmp}/rec/dataset.json: names class 'a' twice; expected distinct class names",
    ),
    Case(
        damaged_records("an empty class name", _declare(classes=["a", " ", "c"])),
        r"{tmp}/rec/dataset.json: class name ' ': expected a non-empty name for every class",
    ),
    Case(
        hf_classlabel_of_5_names,
        r"{tmp}/hf \(the ClassLabel of split 'train'\): names 5 classes, but no record is labelled 'c', 'd', 'e'",
    ),
    Case(hf_label_beyond_the_limit, r"{tmp}/hf/data-00000-of-00001.arrow: row 3: label 1048576: expected labels in"),
    Case(
        labels("labels 0 and 2", [0, 2] * 4),
        r"{tmp}/d.npz \(integer labels: a class per value 0..2\): names 3 classes, but no record is labelled '1'",
    ),
    Case(
        damaged_tfds("a class name no record has", _third_class_name),
        r"{tmp}/tfds/tiny/1.0.0/dataset_info.json \(the ClassLabel 'label'\): names 3 classes, but no record is "
        r"labelled 'c'",
    ),
    Case(hf_saved_with_0_rows, r"{tmp}/hf: 0 rows; expected labelled images"),
    Case(parquet_empty_test_split, r"{tmp}/pq \(split 'test'\): 0 rows; expected labelled images"),
    Case(damaged_parquet("label"), r"{tmp}/pq/train.parquet: a damaged Parquet file \("),
    Case(damaged_parquet("image.bytes"), r"{tmp}/pq/train.parquet: a damaged Parquet file \(row group 0, rows 0..5\)"),
    Case(hf_arrow_truncated, r"{tmp}/hf: not a dataset saved with save_to_disk \(Expected to read \d+ metadata bytes"),
    Case(
        damaged_tfds("dataset_info claims 9 of 6 records", _claim_more),
        r"{tmp}/tfds/tiny/1.0.0/dataset_info.json: declares 9 records in tiny-train.array_record-00000-of-00001; "
        r"the file holds 6",
    ),
    Case(
        damaged_tfds("shard deleted", lambda v: _tfds_shard(v).unlink()),
        r"{tmp}/tfds/tiny/1.0.0/tiny-train.array_record-00000-of-00001: no such shard of split 'train'",
    ),
    Case(
        damaged_tfds("shard truncated", lambda v: _tfds_shard(v).write_bytes(_tfds_shard(v).read_bytes()[:70000])),
        r"{tmp}/tfds/tiny/1.0.0/tiny-train.array_record-00000-of-00001: a damaged ArrayRecord shard",
    ),
    # tracebacks instead of named errors
    Case(bomb_in_image_folder, r"{tmp}/imgs/b/3.png: unreadable image \(Image size \(400000000 pixels\) exceeds limit"),
    Case(fifo_in_image_folder, r"{tmp}/imgs/b/9.png: a FIFO, expected a regular dataset file", child=True),
]


# The cases the fast loop leaves to the full suite (docs/contributors.md): those that train or run long.
SLOW = {
    "resume_on_changed_data",
}


@pytest.mark.parametrize("case", params(CASES, slow=SLOW))
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)


# ------------------------------------------------------------------ damage found in the middle of a run

BATCH = 4  # TRAIN's --batch-size: 10 training images of _folder(n=6) (2 go to the test split), so 3 steps


def _first_of_step(data, step: int) -> int:
    """The training example read first for ``step`` (1-based) of a run seeded 0 (TRAIN's seed)."""
    from vit_common.data.batches import TrainPlan

    return TrainPlan(len(data.train), BATCH, 1, 0)[(step - 1) * BATCH]["index"]


def _garble_file(source, i: int) -> tuple[Path, str]:
    """Example ``i`` of ``source`` (a split) with its image file overwritten; (the file, what the line names)."""
    path = Path(source.name(i))
    path.write_bytes(b"not an image any more")
    return path, rf"{re.escape(str(path))}: unreadable image"


def _garble_record(source, i: int) -> tuple[Path, str]:
    """Example ``i`` of ``source`` (a split) with its shard rewritten, that record's image bytes no image
    (the layout kept); (the shard, what the line names)."""
    from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

    from vit_common.data.arrayrecord import decode_record, encode_record

    shard, _, k = source.name(i).rpartition(": record ")
    reader = ArrayRecordReader(shard)
    records = reader.read(list(range(reader.num_records())))
    reader.close()
    records[int(k)] = encode_record(b"not an image any more", decode_record(records[int(k)], shard)[0])
    writer = ArrayRecordWriter(shard, "group_size:1")
    for record in records:
        writer.write(record)
    writer.close()
    return Path(shard), rf"{re.escape(shard)}: record {k}: unreadable image"


def _garble_arrow_row(source, i: int) -> tuple[Path, str]:
    """Example ``i`` of ``source`` (a split of a save_to_disk set) with its image bytes zeroed in the Arrow
    file, in place (the memory-mapped layout kept); (the file, what the line names)."""
    import pyarrow as pa

    file, _, k = source.name(i).rpartition(": row ")
    with pa.memory_map(file) as mapped:
        base = mapped.read_buffer().address
        mapped.seek(0)
        column = pa.ipc.open_stream(mapped).read_all().column("image")
        assert column.num_chunks == 1, column.num_chunks
        images = column.chunk(0).field("bytes")
        offsets = np.frombuffer(images.buffers()[1], np.int32)[images.offset + int(k) :][:2]
        start = images.buffers()[2].address - base + int(offsets[0])
    with open(file, "r+b") as f:
        f.seek(start)
        f.write(bytes(int(offsets[1] - offsets[0])))
    return Path(file), rf"{re.escape(file)}: row {k}: unreadable image"


def _garble_parquet_row(source, i: int) -> tuple[Path, str]:
    """Example ``i`` of ``source`` (a split of a Parquet set of one row a row group) with the page header of
    its row group's image column overwritten in place; (the file, what the line names)."""
    import pyarrow.parquet as pq

    file, _, k = source.name(i).rpartition(": row ")
    meta = pq.ParquetFile(file).metadata.row_group(int(k))
    chunk = next(meta.column(c) for c in range(meta.num_columns) if meta.column(c).path_in_schema == "image.bytes")
    with open(file, "r+b") as f:
        f.seek(chunk.data_page_offset + 8)
        f.write(b"\xff" * 30)
    return Path(file), rf"{re.escape(file)}: row {k}: a damaged Parquet file \(row group {k}, rows {k}..{k}\)"


def _garble_tfds_record(source, i: int) -> tuple[Path, str]:
    """Example ``i`` of ``source`` (a split of a tfds set, one record a chunk) with bytes of its record's
    chunk overwritten in place (the layout kept: a reader opened before reads the other records as
    they were); (the shard, what the line names)."""
    from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

    shard, _, k = source.name(i).rpartition(": record ")
    reader = ArrayRecordReader(shard)
    records = reader.read(list(range(reader.num_records())))
    reader.close()
    records[int(k)] = b"another record"
    writer = ArrayRecordWriter(f"{shard}.other", "group_size:1")  # as tfds writes its shards
    for r in records:
        writer.write(r)
    writer.close()
    data, other = Path(shard).read_bytes(), Path(f"{shard}.other").read_bytes()
    os.remove(f"{shard}.other")
    chunk = next(j for j, (a, b) in enumerate(zip(data, other, strict=False)) if a != b)  # record k's, the first
    with open(shard, "r+b") as f:
        f.seek(chunk + 48)  # past its 40-byte header: its data
        f.write(b"\xff" * 8)
    return Path(shard), rf"{re.escape(shard)}: record {k}: Corrupted Riegeli"


def _image_rows(imgs: Path):
    """The image folder ``imgs`` (classes a/b) as ``datasets`` rows in the image folder's order: (rows,
    features)."""
    import datasets

    files = sorted(imgs.rglob("*.png"))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    rows = {
        "image": [{"bytes": f.read_bytes(), "path": None} for f in files],
        "label": [features["label"].str2int(f.parent.name) for f in files],
    }
    return rows, features


def _stored_as(kind: str, imgs: Path, tmp: Path) -> str:
    """The ``--dataset`` of the images of ``imgs`` in the same order (the same split and batches) as
    ``kind``: an ArrayRecord folder (``vit data convert``), a save_to_disk set, a Parquet folder of one
    row a row group, a tfds dataset."""
    import datasets

    if kind == "imagefolder":
        return f"imagefolder:{imgs}"
    if kind == "arrayrecord":
        assert main(["data", "convert", str(imgs), str(tmp / "rec"), "--shard-size", "4"]) == 0
        return f"arrayrecord:{tmp / 'rec'}"
    if kind == "tfds":
        return f"tfds:{_tfds_dataset(imgs, tmp / 'tfds')}"
    ds = datasets.Dataset.from_dict(*_image_rows(imgs))
    if kind == "hf-arrow":
        ds.save_to_disk(str(tmp / "hf"))
    else:
        (tmp / "hf").mkdir()
        ds.to_parquet(str(tmp / "hf" / "train.parquet"), batch_size=1)
    return f"hf:{tmp / 'hf'}"


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> list[str]:
    """The flags of the compilation cache of the session's training runs: the same step compiles once."""
    return ["--data-workers", "0", *cached(tmp_path_factory.getbasetemp())]


@pytest.fixture(scope="module")
def undamaged_run(tmp_path_factory, compile_cache) -> dict:
    """The exported weights of a run on the image folder undamaged, what a repaired run must end with."""
    from safetensors.numpy import load_file

    tmp = tmp_path_factory.mktemp("undamaged")
    _folder(tmp / "imgs", n=6)
    assert main([*_train_on(f"imagefolder:{tmp / 'imgs'}", tmp), *compile_cache]) == 0
    return load_file(tmp / "run" / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "garble"),
    [
        ("imagefolder", _garble_file),
        ("arrayrecord", _garble_record),
        ("hf-arrow", _garble_arrow_row),
        ("hf-parquet", _garble_parquet_row),
        ("tfds", _garble_tfds_record),
    ],
    ids=["file", "record", "arrow-row", "parquet-row-group", "tfds-record"],
)
def test_damage_found_mid_run_stops_with_a_checkpoint_and_resumes(
    kind, garble, undamaged_run, compile_cache, tmp_path, capsys, monkeypatch
):
    """The example first read at step 3 breaks after the up-front check passed (as a failing disk or a
    copy still being written would break it in the middle of a run): the run stops after step 2 with its
    checkpoint, one line naming the step, the file (and the record or row), exit 2, no export; the file
    restored, --resume ends with the undamaged run's weights, bit for bit."""
    from safetensors.numpy import load_file

    import vit_common.data.datasets as datasets
    from vit_jax.checkpointing import saved_steps

    _folder(tmp_path / "imgs", n=6)
    spec = _stored_as(kind, tmp_path / "imgs", tmp_path)  # the same images in the same order
    argv = [*_train_on(spec, tmp_path), *compile_cache]
    read, damaged = datasets.read_dataset, {}

    def read_then_damage(*args, **kwargs):
        data = read(*args, **kwargs)
        i = _first_of_step(data, 3)
        path = Path(data.train.name(i).rpartition(": ")[0] or data.train.name(i))
        damaged["original"] = (path, path.read_bytes())
        damaged["names"] = garble(data.train, i)[1]
        return data

    monkeypatch.setattr(datasets, "read_dataset", read_then_damage)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("vit train: error: ")]
    assert len(errors) == 1, err
    assert re.search(rf"step 3's batch: {damaged['names']}", errors[0]), errors[0]
    assert errors[0].endswith(
        "once the data is repaired, the same command with --resume continues from the checkpoint of step 2"
    )
    assert saved_steps(tmp_path / "run" / "checkpoints") == [2]
    assert not (tmp_path / "run" / "model.safetensors").exists()

    monkeypatch.setattr(datasets, "read_dataset", read)
    path, original = damaged["original"]
    path.write_bytes(original)  # repaired: the same bytes (a restored copy)
    assert main([*argv, "--resume"]) == 0
    resumed = load_file(tmp_path / "run" / "model.safetensors")
    assert resumed.keys() == undamaged_run.keys()
    for k, v in undamaged_run.items():
        np.testing.assert_array_equal(resumed[k], v, err_msg=k)


@pytest.mark.slow  # two training runs: beyond the fast loop's budget
def test_damage_found_at_a_mid_run_evaluation_stops_with_a_checkpoint_and_resumes(
    undamaged_run, compile_cache, tmp_path, capsys, monkeypatch
):
    """A test image breaks after the up-front check passed, found by the evaluation after step 2 (of 3):
    the run stops with the checkpoint of step 2 (before: the latest checkpoint, here none, so --resume
    began again at step 0), one line naming the evaluation's step and the file, exit 2; the file
    restored, --resume takes step 2's evaluation first and ends with the undamaged run's weights, bit for
    bit."""
    from safetensors.numpy import load_file

    import vit_common.data.datasets as datasets
    from vit_jax.checkpointing import saved_steps

    _folder(tmp_path / "imgs", n=6)
    argv = [*_train_on(f"imagefolder:{tmp_path / 'imgs'}", tmp_path, "--eval-every", "2steps"), *compile_cache]
    read, damaged = datasets.read_dataset, {}

    def read_then_damage(*args, **kwargs):
        data = read(*args, **kwargs)
        path = Path(data.test.name(0))
        damaged["original"] = (path, path.read_bytes())
        damaged["names"] = _garble_file(data.test, 0)[1]
        return data

    monkeypatch.setattr(datasets, "read_dataset", read_then_damage)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("vit train: error: ")]
    assert "Traceback" not in err and len(errors) == 1, err
    assert re.search(rf"error: step 2's evaluation: {damaged['names']}", errors[0]), errors[0]
    assert errors[0].endswith(
        "once the data is repaired, the same command with --resume continues from the checkpoint of step 2"
    )
    assert saved_steps(tmp_path / "run" / "checkpoints") == [2]

    monkeypatch.setattr(datasets, "read_dataset", read)
    path, original = damaged["original"]
    path.write_bytes(original)
    assert main([*argv, "--resume"]) == 0
    lines = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "test_loss" in r] == [2, 3]  # step 2's evaluation, taken on resuming
    resumed = load_file(tmp_path / "run" / "model.safetensors")
    assert resumed.keys() == undamaged_run.keys()
    for k, v in undamaged_run.items():
        np.testing.assert_array_equal(resumed[k], v, err_msg=k)
