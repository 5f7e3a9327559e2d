"""The input-pipeline benchmark runs end to end on a tiny folder it writes, and its records hold every field."""

from __future__ import annotations

import json

import pytest

from benchmarks import input_pipeline


@pytest.mark.slow
def test_benchmark_writes_one_record_per_run_of_each_format(tmp_path, capsys):
    out = tmp_path / "pipe.jsonl"
    args = ["--images", "12", "--image-size", "32", "--batch-size", "4", "--batches", "2", "--repeats", "1"]
    assert input_pipeline.main([*args, "--workers", "1", "--out", str(out)]) == 0
    records = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r["format"] for r in records] == ["imagefolder", "arrayrecord"]
    for r in records:
        assert set(r) == set(input_pipeline.RECORD_FIELDS)
        assert (r["workers"], r["batch_size"], r["image_size"], r["mode"]) == (1, 4, 32, "train")
        assert r["images_per_s"] > 0 and r["images"] == 8  # one image of each class is held out by the split
    text = capsys.readouterr().out
    assert "imagefolder, 1 worker(s): median" in text and "x the image folder's" in text


def test_generated_folder_holds_224_px_jpegs_of_four_classes(tmp_path):
    from PIL import Image

    input_pipeline.make_folder(tmp_path, 8)
    files = sorted(tmp_path.rglob("*.jpg"))
    assert len(files) == 8 and len({f.parent.name for f in files}) == 4
    with Image.open(files[0]) as im:
        assert im.size == (224, 224) and im.format == "JPEG"
