"""NaFlex fine-tuning in both twins: the twins' training steps on NaFlex batches (images of several aspect
ratios, padded to the model's patch budget) agree within the tolerance table, and ``vit train --init`` of
a timm NaFlexVit exports a NaFlexVit that timm loads strictly, declaring the budget it trained with."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

import vit_torch
from vit_common.checkpoints.formats.canonical import FORMAT_TAG
from vit_common.config import ViTConfig
from vit_common.data.datasets import read_dataset
from vit_common.data.images import Preprocess
from vit_common.data.naflex_batches import NaFlexPaddedBatches, NaFlexTransform
from vit_common.state import random_state
from vit_common.tolerance import compare

CFG = ViTConfig(
    image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3, class_token=False,
    pool="map", gelu="tanh", posemb_resample="bilinear_aa",
)  # fmt: skip
# the shared NaFlex images and one more, 1:2
SIZES = ((20, 120), (64, 16), (33, 33), (90, 50), (8, 8), (41, 77), (100, 25), (30, 60))


BOTH = (
    r"^spatial_shapes and position_weights both given: expected one: position_weights are the position table "
    r"resized to spatial_shapes' grids; pass patch_mask and position_weights$"
)


def test_position_weights_give_what_spatial_shapes_give_in_the_torch_twin():
    """The torch twin given a NaFlex batch's ``position_weights`` (the training batches' form) gives what
    it gives on its ``spatial_shapes``, bit for bit; a weights tensor of another shape, or both given, is one
    line."""
    from vit_common.naflex import pad_batch, position_weights

    rng = np.random.default_rng(1)
    images = [rng.standard_normal((h, w, 3)).astype(np.float32) for h, w in ((16, 40), (32, 24), (8, 8))]
    patches, mask, shapes = pad_batch(images, (8, 8), 16)
    model = vit_torch.from_numpy(CFG, random_state(CFG, seed=3, scale=0.3)).eval()
    weights = torch.from_numpy(position_weights(CFG.grid, shapes, 16, "bilinear_aa"))
    with torch.no_grad():
        want = model(torch.from_numpy(patches), patch_mask=mask, spatial_shapes=shapes)
        assert torch.equal(model(torch.from_numpy(patches), patch_mask=mask, position_weights=weights), want)
        with pytest.raises(
            ValueError, match=r"^position_weights of shape \(3, 16, 9\): expected \[B=3, N=16, Gh\*Gw=16\]$"
        ):
            model(torch.from_numpy(patches), patch_mask=mask, position_weights=weights[..., :9])
        with pytest.raises(ValueError, match=BOTH):
            model(torch.from_numpy(patches), patch_mask=mask, spatial_shapes=shapes, position_weights=weights)


@pytest.mark.slow
def test_vit_train_parity_on_a_naflex_model_keeps_the_twins_together(tmp_path, capsys, naflex_images):
    """``vit train-parity --init`` of a NaFlex checkpoint (budget 12 declared): two float64 steps of both
    twins on batches of 4 images of several aspect ratios (flip and a random crop), each parameter and
    moment within the table's bound."""
    from vit_cli.main import main

    spec = naflex_images(tmp_path / "d", SIZES)
    meta = {
        "format": FORMAT_TAG,
        "vit_config": CFG.to_json(),
        "preprocess": json.dumps(Preprocess(max_patches=12).to_dict()),
    }
    save_file(random_state(CFG, seed=3, scale=0.3), str(tmp_path / "n.safetensors"), meta)
    argv = ["train-parity", "--init", str(tmp_path / "n.safetensors"), "--dataset", spec, "--steps", "2"]
    argv += ["--batch-size", "4", "--lr", "0.01", "--warmup-steps", "0", "--flip", "--crop-scale", "0.5"]
    assert main([*argv, "--json", str(tmp_path / "p.json")]) == 0, capsys.readouterr()
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["ok"] and len(report["steps"]) == 2 and report["dtype"] == "float64"
    assert max(r["params"] for r in report["steps"]) < 1e-10 and max(r["update"] for r in report["steps"]) < 1e-8


@pytest.mark.slow
def test_a_naflexvit_fine_tune_trains_naflex_and_exports_a_naflexvit_timm_loads(tmp_path, capsys, naflex_images):
    """``vit train --init`` of a timm NaFlexVit hub folder with ``--max-patches 12``: model.safetensors and
    the run's config.json declare the budget 12 it trained with; the timm export loads strictly in timm
    (``create_model("local-dir:...", pretrained=True)``) and gives our model.safetensors' output (torch
    twin) on a NaFlex batch of the test images within 1e-5; its weights moved from the source's. The start
    line counts an image's GFLOPs at the budget (``ViTConfig.flops(patches=12)``), as ``vit info`` does."""
    import timm
    from timm.models._hub import save_for_hf

    from vit_cli.main import main

    spec = naflex_images(tmp_path / "d", SIZES)
    name = "naflexvit_base_patch16_siglip"
    source = timm.create_model(
        name,
        pretrained=False,
        embed_dim=32,
        depth=2,
        num_heads=4,
        patch_size=8,
        pos_embed_grid_size=(4, 4),
        num_classes=3,
    )
    save_for_hf(source, tmp_path / "hub", model_config={"architecture": name})
    out = tmp_path / "run"
    argv = ["train", "--init", str(tmp_path / "hub"), "--dataset", spec, "--epochs", "1", "--batch-size", "4"]
    argv += ["--max-patches", "12", "--out", str(out), "--data-workers", "0"]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr()
    assert json.loads((out / "parity.json").read_text())["ok"]
    with safe_open(out / "model.safetensors", "np") as f:
        assert json.loads(f.metadata()["preprocess"])["max_patches"] == 12
    flops = vit_torch.load_model(out / "model.safetensors").cfg.flops(patches=12) / 1e9
    assert f"{flops:.3g} GFLOPs per image at the patch budget, 12 patches); " in printed.err
    assert json.loads((out / "config.json").read_text())["preprocess"]["max_patches"] == 12
    ours = vit_torch.load_model(out / "model.safetensors").eval()
    cfg = ours.cfg
    batch = NaFlexPaddedBatches(read_dataset(spec).test, 3, 8, NaFlexTransform(cfg, Preprocess(max_patches=12)))[0]
    patches, valid, shapes = (torch.from_numpy(batch[k]) for k in ("image", "patch_mask", "spatial_shapes"))
    coord = torch.zeros(*valid.shape, 2, dtype=torch.long)  # timm's (y, x) of each patch
    for i, (h, w) in enumerate(shapes.tolist()):
        grid = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        coord[i, : h * w] = torch.stack(grid, -1).reshape(-1, 2)
    exported = timm.create_model(f"local-dir:{out / 'model_timm'}", pretrained=True).eval()
    with torch.no_grad():
        want = ours(patches, patch_mask=valid, spatial_shapes=shapes).numpy()
        got = exported(patches, patch_coord=coord, patch_valid=valid).numpy()
    c = compare("logits", got, want, "tensor", "float32")
    assert c.ok, c
    moved = exported.state_dict()["blocks.0.attn.qkv.weight"] - source.state_dict()["blocks.0.attn.qkv.weight"]
    assert float(moved.abs().max()) > 0


@pytest.mark.slow
def test_vit_train_parity_takes_a_patch_budget_for_a_naflex_npz(tmp_path, capsys, naflex_images):
    """``vit train-parity --init`` of a big_vision NaFlex .npz (no budget declared) with ``--max-patches
    9``: two float64 steps of both twins on NaFlex batches of 9 patches an image, within the table's bound,
    the budget in the report. Without --max-patches the .npz is one line asking for it; --max-patches
    without --init, or for a fixed-size model, is refused as vit train refuses it (exit 2 each)."""
    from vit_cli.main import main
    from vit_common.checkpoints.convert import save_checkpoint
    from vit_common.checkpoints.formats.npz import NpzWriteOptions

    spec = naflex_images(tmp_path / "d", SIZES)
    npz = tmp_path / "n.npz"
    cfg = CFG.replace(dynamic_img_size=True)
    save_checkpoint(npz, cfg, random_state(cfg, seed=3, scale=0.3), "big_vision", options=NpzWriteOptions(naflex=True))
    argv = [
        "train-parity",
        "--dataset",
        spec,
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--lr",
        "0.01",
        "--warmup-steps",
        "0",
    ]
    capsys.readouterr()
    assert main([*argv, "--init", str(npz)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"vit train-parity: error: {npz}: a NaFlex model whose file declares no patch budget (a big_vision "
        "naflex_vit .npz): expected max_patches (--max-patches N), the most patches each image is resized to"
    )
    assert main([*argv, "--max-patches", "9"]) == 2
    assert capsys.readouterr().err.strip() == (
        "vit train-parity: error: --max-patches 9 without --init: NaFlex training fine-tunes a NaFlex checkpoint; "
        "a new model trains on fixed-size images"
    )
    save_checkpoint(tmp_path / "fixed.safetensors", CFG, random_state(CFG, seed=3, scale=0.3))
    assert main([*argv, "--init", str(tmp_path / "fixed.safetensors"), "--max-patches", "9"]) == 2
    assert f"error: {tmp_path / 'fixed.safetensors'}: max_patches=9 for a fixed-size model (" in capsys.readouterr().err
    assert main([*argv, "--init", str(npz), "--max-patches", "9", "--json", str(tmp_path / "p.json")]) == 0
    assert "NaFlex, 9 patches an image at most" in capsys.readouterr().out
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["ok"] and len(report["steps"]) == 2 and report["compared"]["data"]["max_patches"] == 9
    assert max(r["params"] for r in report["steps"]) < 1e-10
