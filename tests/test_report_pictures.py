"""vit_compare.report on synthetic differences: pictures written, numbers and verdicts in index.html."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from vit_compare.report import diff_row, write_parity_report


def _synthetic_rows() -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(4):
        ref = rng.standard_normal((2, 17, 32))
        rows.append(diff_row(f"block{i:02d}", ref * (1 + 1e-7 * (i + 1)), ref, "tensor", "float32"))
        p = rng.random((2, 2, 17, 17))
        rows.append(diff_row(f"attn{i:02d}", p + 4e-7 * i, p, "attention", "float32"))  # attn03: 1.2e-6, over
    rows.append(diff_row("logits", ref, ref, "tensor", "float32"))  # exactly zero
    return rows


def test_diff_row_values():
    ref = np.array([[1.0, -4.0], [2.0, 0.0]])
    r = diff_row("x", ref + np.array([[0.0, 2e-5], [0.0, -4e-5]]), ref, "tensor", "float32")
    assert r["max_abs"] == pytest.approx(4e-5) and r["mean_abs"] == pytest.approx(1.5e-5)
    assert r["scale"] == 4.0 and r["rel"] == pytest.approx(1e-5) and r["kind"] == "rel" and r["bound"] == 1e-5
    assert r["ok"]  # 1e-5 relative is on the bound
    assert not diff_row("p", np.array([0.5 + 2e-6]), np.array([0.5]), "attention", "float32")["ok"]


def _pixels(path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), np.float64)


@pytest.mark.slow
def test_report_files_and_numbers(tmp_path):
    rows = _synthetic_rows()
    rng = np.random.default_rng(1)
    a = rng.random((17, 17))
    maps = {"title": "attn01, image 0, head 0", "jax": a + 1e-7, "torch": a, "bound": 1e-6}
    paths = write_parity_report(tmp_path / "report", rows, maps, meta={"checkpoint": "tiny.safetensors"})
    assert set(paths) == {"index", "diffs", "maps"}
    diffs, pic = _pixels(paths["diffs"]), _pixels(paths["maps"])
    assert diffs.shape == (2 * 320, 600, 3)  # two groups (tensor rel, attention abs), 3.2 x 6 inches each
    assert pic.shape == (400, 1200, 3)
    assert diffs.var() > 0 and pic.var() > 0
    page = paths["index"].read_text()
    for r in rows:
        assert f"<td>{r['name']}</td>" in page
    assert "8 of 9 within tolerance; over tolerance: attn03" in page
    assert len(re.findall(r"<tr class='fail'>", page)) == 1
    assert "<td>1.200e-06</td>" in page  # attn03 max_abs
    assert "src='diffs.png'" in page and "src='maps.png'" in page and "tiny.safetensors" in page
    assert not [p for p in (tmp_path / "report").iterdir() if p.name.endswith(".tmp")]


def test_report_without_maps_and_bad_input(tmp_path):
    paths = write_parity_report(tmp_path, _synthetic_rows()[:1])
    assert set(paths) == {"index", "diffs"} and "maps.png" not in paths["index"].read_text()
    with pytest.raises(ValueError, match="no rows"):
        write_parity_report(tmp_path, [])
    with pytest.raises(ValueError, match=r"missing keys \['mean_abs'"):
        write_parity_report(tmp_path, [{"name": "x", "what": "tensor", "dtype": "float32", "max_abs": 0.0}])
    with pytest.raises(ValueError, match="two equal 2-D arrays"):  # checked before anything is written
        bad = {"jax": np.zeros((3, 3)), "torch": np.zeros((3, 4))}
        write_parity_report(tmp_path / "bad", _synthetic_rows(), bad)
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_diffs_picture_is_bounded_for_any_depth(tmp_path):
    """200 rows (a 100-block model) draw 4,000 px wide, not 5,800: the width stops growing at 40 inches."""
    ref = np.ones(3)
    rows = [diff_row(f"block{i:03d}", ref, ref, "tensor", "float32") for i in range(200)]
    paths = write_parity_report(tmp_path, rows)
    with Image.open(paths["diffs"]) as im:
        assert im.size == (4000, 320)
