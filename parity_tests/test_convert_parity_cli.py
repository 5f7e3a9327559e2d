"""`vit convert` and `vit parity`, and round trips through every container, the framework ones included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit_torch
from vit_cli.main import main
from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_compare.inference import run_parity
from vit_compare.report import ROW_KEYS
from vit_jax.formats import READERS as JAX_READERS
from vit_jax.formats import WRITERS as JAX_WRITERS
from vit_torch.formats import READERS as TORCH_READERS
from vit_torch.formats import WRITERS as TORCH_WRITERS

READERS, WRITERS = {**TORCH_READERS, **JAX_READERS}, {**TORCH_WRITERS, **JAX_WRITERS}
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_round_trips_between_every_pair_including_pth_and_orbax(tmp_path, small_cfg, random_state):
    targets = [
        ("canonical", "a.safetensors"),
        ("timm", "b.pth"),
        ("timm", "c.safetensors"),
        ("hf", "d"),
        ("original_vit", "e.npz"),
        ("big_vision", "f.npz"),
        ("orbax", "g"),
    ]
    state = random_state(small_cfg, scale=0.2)
    for fa, na in targets:
        save_checkpoint(tmp_path / na, small_cfg, state, fa, writers=WRITERS)
        first = load_checkpoint(tmp_path / na, readers=READERS)
        for fb, nb in targets:
            save_checkpoint(tmp_path / f"{na}-{nb}", first.cfg, first.state, fb, writers=WRITERS)
            back = load_checkpoint(tmp_path / f"{na}-{nb}", readers=READERS).state
            assert back.keys() == state.keys() and all(back[k].tobytes() == state[k].tobytes() for k in state), (fa, fb)


def test_convert_cli_prints_the_report_and_exit_codes(tmp_path, capsys, small_cfg, random_state):
    save_checkpoint(
        tmp_path / "m.pth", small_cfg.replace(num_heads=8), random_state(small_cfg, scale=0.2), writers=TORCH_WRITERS
    )
    rc = main(
        [
            "convert",
            str(tmp_path / "m.pth"),
            str(tmp_path / "hf"),
            "--to",
            "hf",
            "--image-size",
            "48",
            "--num-classes",
            "3",
            "--set",
            "num_heads=8",
            "--accept-assumed",  # a .pth states no GELU, eps, pooling: HF's config.json would
            "all",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    for needle in (
        "format   timm",
        "custom (width 32",
        "params   ",
        "config   num_heads            = 8                        given",
        "resampled pos_embed grid 4x4 -> 6x6 with bicubic_aa",
        "dropped  head.weight: --num-classes 3",
        "wrote    ",
    ):
        assert needle in out, needle
    cfg = load_checkpoint(tmp_path / "hf").cfg
    assert (cfg.image_size, cfg.num_classes, cfg.num_heads) == ((48, 48), 3, 8)
    rc = main(["convert", str(tmp_path / "hf"), str(tmp_path / "x.npz"), "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["written_format"] == "big_vision"
    (tmp_path / "junk.bin").write_bytes(b"junk")
    assert main(["convert", str(tmp_path / "junk.bin"), str(tmp_path / "y.npz")]) == 2
    assert "not a checkpoint format" in capsys.readouterr().err and not (tmp_path / "y.npz").exists()
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "folder")]) == 2
    assert "--to" in capsys.readouterr().err


@pytest.mark.slow
def test_convert_imports_a_framework_only_when_the_format_needs_it(tmp_path, small_cfg, random_state):
    save_checkpoint(tmp_path / "m.safetensors", small_cfg, random_state(small_cfg, scale=0.2))
    code = (
        "import sys; from vit_cli.main import main; "
        f"rc = main(['convert', {str(tmp_path / 'm.safetensors')!r}, {str(tmp_path / 'm.npz')!r}]); "
        f"rc += main(['convert', {str(tmp_path / 'm.npz')!r}, {str(tmp_path / 'hf')!r}, '--to', 'hf', "
        "'--accept-assumed', 'all']); "
        "print(rc, 'jax' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 False False"


@pytest.mark.slow
def test_run_parity_result_structure_float64(tmp_path, small_cfg, random_state):
    """float64 run (float32 runs in the CLI tests below): every intermediate, the float64 bounds."""
    cfg = small_cfg.replace(pool="map", class_token=False)
    save_checkpoint(tmp_path / "m.safetensors", cfg, random_state(cfg, scale=0.2))
    res = run_parity(tmp_path / "m.safetensors", dtype="float64", num_generated=2, keep_outputs=True)
    assert res.ok and res.agreement == 1.0 and res.dtype == "float64" and res.images == ["generated-0", "generated-1"]
    names = [r.name for r in res.rows]
    assert names == [
        "patch_embed",
        "pos_embed",
        "block00",
        "attn00",
        "block01",
        "attn01",
        "norm",
        "attn_pool",
        "pre_logits",
        "logits",
    ]
    attn, logits = res.rows[3], res.rows[-1]
    assert (attn.what, attn.twins.kind, attn.twins.bound) == ("attention", "abs", 1e-12)
    assert (logits.twins.kind, logits.twins.bound) == ("rel", 1e-10) and logits.twins.rel < 1e-12
    assert res.outputs["jax"]["attn01"].shape == res.outputs["torch"]["attn01"].shape == (2, 2, 16, 16)  # no cls
    assert res.outputs["jax"]["logits"].dtype == np.float64
    row = json.loads(json.dumps(res.to_dict()))["rows"][-1]
    assert set(ROW_KEYS) < set(row)  # rows feed vit_compare.report.write_parity_report as they are


@pytest.mark.slow
@pytest.mark.parametrize("against, kw", [("timm", dict(pool="map", class_token=False)), ("transformers", {})])
def test_parity_cli_against_a_library_with_images(tmp_path, capsys, against, kw, small_cfg, random_state):
    cfg = small_cfg.replace(**kw)
    save_checkpoint(tmp_path / "m.safetensors", cfg, random_state(cfg, scale=0.2))
    (tmp_path / "img").mkdir()
    rng = np.random.default_rng(0)
    for i, size in enumerate([(40, 50), (32, 32), (64, 20)]):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(tmp_path / "img" / f"{i}.png")
    rc = main(
        [
            "parity",
            str(tmp_path / "m.safetensors"),
            "--images",
            str(tmp_path / "img"),
            "--against",
            against,
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "PASS" in out and f"{against} max abs" in out
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["images"] == ["0.png", "1.png", "2.png"] and res["against"] == against
    logits = next(r for r in res["rows"] if r["name"] == "logits")
    assert logits["against"]["ok"] and logits["ok"] and res["against_agreement"] == 1.0
    blocks = [r for r in res["rows"] if r["name"].startswith("block")]
    assert len(blocks) == 2 and all(r["against"] is not None for r in blocks)


@pytest.mark.slow
def test_parity_exits_1_beyond_tolerance(tmp_path, monkeypatch, capsys, small_cfg, random_state):
    """A twin that loaded one weight slightly wrong is caught, with the first failing tensor named."""
    save_checkpoint(tmp_path / "m.safetensors", small_cfg, random_state(small_cfg, scale=0.2))
    real = vit_torch.from_numpy

    def off_by_a_little(cfg, state, **kw):
        state = dict(state)
        state["blocks.1.mlp.fc2.bias"] = state["blocks.1.mlp.fc2.bias"] + 1e-3
        return real(cfg, state, **kw)

    monkeypatch.setattr(vit_torch, "from_numpy", off_by_a_little)
    assert main(["parity", str(tmp_path / "m.safetensors")]) == 1
    out = capsys.readouterr().out
    assert "FAIL: block01" in out and "beyond tolerance" in out
    assert torch.backends.cuda.matmul.allow_tf32 is False


@pytest.mark.slow
def test_parity_report_pictures(tmp_path, capsys, small_cfg, random_state):
    """`vit parity --report DIR`: per-layer differences and one attention map from each twin, as PNG + html."""
    from PIL import Image

    save_checkpoint(tmp_path / "m.safetensors", small_cfg, random_state(small_cfg, scale=0.2))
    rc = main(
        ["parity", str(tmp_path / "m.safetensors"), "--report", str(tmp_path / "rep"), "--layer", "1", "--head", "1"]
    )
    assert rc == 0 and f"report: {tmp_path / 'rep' / 'index.html'}" in capsys.readouterr().out
    for name in ("diffs.png", "maps.png"):
        with Image.open(tmp_path / "rep" / name) as im:
            pixels = np.asarray(im.convert("L"), np.float64)
        assert min(pixels.shape) > 100 and pixels.var() > 0
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "block01" in page and "attn01" in page and "m.safetensors" in page
    assert main(["parity", str(tmp_path / "m.safetensors"), "--report", str(tmp_path / "bad"), "--head", "2"]) == 2
    assert not (tmp_path / "bad").exists()
    assert main(["parity", str(tmp_path / "m.safetensors"), "--layer", "1"]) == 2  # nothing to draw it in
    assert "pass --report DIR too" in capsys.readouterr().err


@pytest.mark.slow
def test_parity_images_take_the_folder_layouts_of_training(tmp_path, capsys, small_cfg, random_state):
    """--images reads a folder of class folders (or train/ + val/) as training does, in sorted order,
    the first --max-images of them, with the checkpoint's preprocessing (here declared in the file)."""
    from vit_common.data.images import PRESETS

    save_checkpoint(
        tmp_path / "m.safetensors", small_cfg, random_state(small_cfg, scale=0.2), preprocess=PRESETS["imagenet"]
    )
    rng = np.random.default_rng(0)
    for rel in ("train/cat/0.png", "train/dog/1.png", "val/cat/2.jpg"):
        (tmp_path / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (40, 36, 3), dtype=np.uint8)).save(tmp_path / "data" / rel)
    args = ["parity", str(tmp_path / "m.safetensors"), "--images", str(tmp_path / "data"), "--json"]
    assert main([*args, str(tmp_path / "r.json"), "--max-images", "2"]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["images"] == ["train/cat/0.png", "train/dog/1.png"]
    capsys.readouterr()
    image = tmp_path / "data" / "train" / "cat" / "0.png"  # a file is refused: --images takes a folder
    assert main(["parity", str(tmp_path / "m.safetensors"), "--images", str(image)]) == 2
    assert capsys.readouterr().err.endswith(f"{image}: a file, not a folder; expected a folder of images\n")


@pytest.mark.slow
def test_parity_names_a_zero_head_and_the_rows_that_carry_no_information(tmp_path, capsys, small_cfg, random_state):
    """After `vit convert --num-classes 5` the head is zeros and every logit 0: the verdict says the logits
    (and their top-1 agreement) prove nothing, and which rows do."""
    save_checkpoint(tmp_path / "m.safetensors", small_cfg, random_state(small_cfg, scale=0.2))
    assert (
        main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "z.safetensors"), "--num-classes", "5"]) == 0
    )
    capsys.readouterr()
    assert main(["parity", str(tmp_path / "z.safetensors")]) == 0
    out = capsys.readouterr().out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("PASS: every tensor within its tolerance; informative rows: patch_embed, ")
    assert verdict.endswith(
        "pre_logits; uninformative (one value throughout, proving nothing): logits (the head's weights are all "
        "zeros: each logit is its bias; the pre_logits row is the real check) (top-1 agreement too)"
    )
    assert "logits" in out and "(one value throughout: uninformative)" in out
    result = run_parity(tmp_path / "m.safetensors")
    assert result.verdict == "PASS: every tensor within its tolerance" and result.head is None
    assert all(r.to_dict()["informative"] for r in result.rows)
