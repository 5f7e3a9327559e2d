"""`vit attention` from both twins on one checkpoint, and the parity report on real twin differences."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data

import vit_jax
import vit_torch
from vit_cli.attention import PANEL_PX, panel_grid
from vit_cli.main import main
from vit_common.checkpoints.formats.canonical import save_canonical
from vit_common.config import ViTConfig
from vit_common.tolerance import compare
from vit_compare.report import diff_row, write_parity_report

CASES = {
    "token+registers": dict(reg_tokens=2),
    "gap": dict(pool="gap", class_token=False),
    "map": dict(pool="map", class_token=False),
}


def _state(cfg: ViTConfig) -> dict[str, np.ndarray]:
    """Random canonical state with attention far from uniform: qkv and probe weights x8 (max prob ~0.4)."""
    torch.manual_seed(0)
    state = vit_torch.to_numpy(vit_torch.VisionTransformer(cfg))
    for k in state:
        if k.endswith("qkv.weight") or k.startswith("attn_pool.q.") or k.startswith("attn_pool.kv."):
            state[k] = state[k] * 8
    return state


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "chelsea.png"
    Image.fromarray(data.chelsea()).save(path)  # 300x451 RGB photo shipped with scikit-image
    return path


def _run(capsys, *argv) -> list[dict]:
    assert main(["attention", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _pixels(path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), np.float64)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_attention_command_same_maps_from_both_twins(case, photo, tmp_path, capsys, small_cfg):
    cfg = small_cfg.replace(**CASES[case])
    ckpt = tmp_path / "tiny.safetensors"
    save_canonical(ckpt, cfg, _state(cfg))
    reports = {
        fw: _run(capsys, photo, "--checkpoint", ckpt, "--framework", fw, "--out", tmp_path / fw)[0]
        for fw in ("jax", "torch")
    }
    arrays = ["raw", "rollout"] + (["probe"] if cfg.pool == "map" else [])
    for name in arrays:
        a, b = (np.load(tmp_path / fw / f"chelsea_{name}.npy", allow_pickle=False) for fw in ("jax", "torch"))
        assert a.shape == {"raw": (1, 2, 4, 4), "rollout": (4, 4), "probe": (2, 4, 4)}[name]
        assert compare(name, a, b, "attention", "float32").ok, compare(name, a, b, "attention", "float32")
        assert a.std() > 1e-4  # a map, not a constant (patch-query means are flat: std ~6e-4 for MAP)
    r = reports["jax"]
    panels = 1 + (2 + 1) + (2 + 1) * (cfg.pool == "map") + 1  # input, block heads + mean, probe, rollout
    rows, cols = panel_grid(panels)
    figure = _pixels(tmp_path / "jax" / "chelsea_attention.png")
    assert figure.shape == (rows * PANEL_PX[1], cols * PANEL_PX[0], 3) and figure.var() > 0
    overlays = sorted((tmp_path / "jax").glob("chelsea_overlay_*.png"))
    assert [p.name for p in overlays] == sorted(
        f"chelsea_overlay_{k}.png" for k in ["block01", "rollout"] + ["probe"] * (cfg.pool == "map")
    )
    for p in overlays:
        px = _pixels(p)
        assert px.shape == (32, 32, 3) and px.var() > 0
    for share in [r["shares"]["rollout"], r["shares"]["block01"]["mean"], *r["shares"]["block01"]["heads"]]:
        total = share["patches"] + share.get("cls", 0) + sum(share.get("registers", []))
        assert total == pytest.approx(1, abs=1e-6)  # float32 softmax rows
    shows = r["shows"]
    if case == "token+registers":
        assert "class token" in shows["raw"] and "2 register tokens" in shows["prefix"]
        assert len(r["shares"]["rollout"]["registers"]) == 2
    else:
        assert "mean over all patch-token queries" in shows["raw"] and f"pool='{cfg.pool}'" in shows["raw"]
        assert "cls" not in r["shares"]["rollout"] and "prefix" not in shows
    if cfg.pool == "map":
        assert "probe" in shows["probe"] and "MAP probe" in shows["rollout"]
    assert r["prediction"]["index"] in range(10) and r["prediction"]["class"] == str(r["prediction"]["index"])


def test_attention_command_all_layers_one_head_and_errors(photo, tmp_path, capsys, small_cfg):
    cfg = small_cfg.replace(reg_tokens=1)
    ckpt = tmp_path / "tiny.safetensors"
    save_canonical(ckpt, cfg, _state(cfg))
    r = _run(
        capsys,
        photo,
        "--checkpoint",
        ckpt,
        "--framework",
        "torch",
        "--layer",
        "all",
        "--head",
        "1",
        "--method",
        "raw",
        "--out",
        tmp_path / "out",
    )[0]
    assert r["layers"] == [0, 1] and set(r["shares"]) == {"block00", "block01"}
    assert np.load(tmp_path / "out" / "chelsea_raw.npy").shape == (2, 2, 4, 4)
    assert not (tmp_path / "out" / "chelsea_rollout.npy").exists()
    assert _pixels(tmp_path / "out" / "chelsea_attention.png").shape == (PANEL_PX[1], 3 * PANEL_PX[0], 3)
    bad = tmp_path / "bad"
    assert main(["attention", str(photo), "--checkpoint", str(ckpt), "--layer", "2", "--out", str(bad)]) == 2
    assert "blocks 0..1" in capsys.readouterr().err
    for image in (tmp_path / "missing.png", ckpt):  # no such file; not an image
        assert main(["attention", str(image), "--checkpoint", str(ckpt), "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "missing.png: no such image file" in err and "tiny.safetensors: unreadable image" in err
    assert not bad.exists()


@pytest.mark.slow
def test_parity_report_from_twins(tmp_path, small_cfg, images):
    cfg = small_cfg.replace(reg_tokens=2)
    state = _state(cfg)
    x = images(2, (32, 32))
    _, out_j = vit_jax.from_numpy(cfg, state).forward_intermediates(x.transpose(0, 2, 3, 1))
    with torch.no_grad():
        _, out_t = vit_torch.from_numpy(cfg, state).forward_intermediates(torch.from_numpy(x))
    what = {k: "attention" if k.startswith("attn") else "tensor" for k in out_t}
    rows = [diff_row(k, np.asarray(out_j[k]), out_t[k].numpy(), what[k], "float32") for k in out_t]
    assert [r["name"] for r in rows][:4] == ["patch_embed", "pos_embed", "block00", "attn00"]
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    maps = {
        "title": "attn01, image 0, head 0",
        "jax": np.asarray(out_j["attn01"][0, 0]),
        "torch": out_t["attn01"][0, 0].numpy(),
        "bound": 1e-6,
    }
    paths = write_parity_report(tmp_path, rows, maps, meta={"config": cfg.to_json()})
    page = paths["index"].read_text()
    assert f"{len(rows)} of {len(rows)} within tolerance" in page and "FAIL" not in page
    for p in (paths["diffs"], paths["maps"]):
        assert _pixels(p).var() > 0
