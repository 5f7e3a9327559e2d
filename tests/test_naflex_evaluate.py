"""NaFlex evaluation (``vit_common.naflex.NaFlexEvalBatches``, ``vit evaluate`` on a NaFlex model): images
of different sizes and aspect ratios in one batch with masks give what each image gives run alone, in the
torch twin."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.numpy import save_file

import vit_torch
from vit_common.checkpoints.formats.canonical import FORMAT_TAG
from vit_common.config import ViTConfig
from vit_common.data.datasets import read_dataset
from vit_common.data.images import Preprocess
from vit_common.naflex import NaFlexEvalBatches, preprocess
from vit_common.state import random_state
from vit_common.tolerance import compare
from vit_torch.runner import logits

CFG = ViTConfig(
    image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3, class_token=False,
    pool="map", gelu="tanh", posemb_resample="bilinear_aa",
)  # fmt: skip
PP = Preprocess(interpolation="bicubic", max_patches=16)
# (H, W) of the images: aspect ratios from 1:6 to 4:1, smaller and larger than the budget
SIZES = ((20, 120), (64, 16), (33, 33), (90, 50), (8, 8), (41, 77), (100, 25))


def _folder(tmp_path):
    """A NaFlex model (its stored preprocessing a budget of 16 patches) and an image folder of 3 classes."""
    meta = {"format": FORMAT_TAG, "vit_config": CFG.to_json(), "preprocess": json.dumps(PP.to_dict())}
    state = random_state(CFG, seed=3, scale=0.3)
    save_file(state, str(tmp_path / "n.safetensors"), meta)
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(SIZES):
        for split in ("train", "val"):
            (tmp_path / "d" / split / "abc"[i % 3]).mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), np.uint8)).save(
                tmp_path / "d" / split / "abc"[i % 3] / f"{i}.png"
            )
    return tmp_path / "n.safetensors", state


def _alone_and_batched(tmp_path):
    """(model path, labels, logits of batches of 3, logits of each image run alone unpadded)."""
    path, state = _folder(tmp_path)
    model = vit_torch.from_numpy(CFG, state).eval()
    source = read_dataset(f"imagefolder:{tmp_path / 'd'}").test
    batches = NaFlexEvalBatches(source, 3, 8, 3, PP)
    assert len(batches) == 3 and batches[2]["image"][0].shape == (1, 16, 192)
    together = np.concatenate(list(logits(model, (b["image"] for b in batches))))
    labels = np.concatenate([b["label"] for b in batches])
    alone = []
    for i in range(len(source)):
        patches, (h, w) = preprocess(Image.open(source[i]["image"]), 8, 16, 3, PP)
        with torch.no_grad():
            alone.append(model(torch.from_numpy(patches[None]), patch_mask=torch.ones(1, h * w, dtype=torch.bool),
                               spatial_shapes=torch.tensor([[h, w]]))[0].numpy())  # fmt: skip
    return path, labels, together, np.stack(alone)


def test_naflex_batches_equal_each_image_alone(tmp_path):
    """Batches of 3 images of other sizes (padding in each) give each image's logits run alone unpadded,
    within the float32 tolerance."""
    _, _, together, alone = _alone_and_batched(tmp_path)
    c = compare("logits", together, alone, "tensor", "float32")
    assert c.ok, c


@pytest.mark.slow
def test_vit_evaluate_on_a_naflex_model_counts_what_each_image_alone_predicts(tmp_path, capsys):
    """``vit evaluate`` (torch twin, batches of 3) counts the classes the single runs predict."""
    from vit_cli.main import main

    path, labels, _, alone = _alone_and_batched(tmp_path)
    capsys.readouterr()
    argv = ["evaluate", str(path), "--dataset", f"imagefolder:{tmp_path / 'd'}", "--batch-size", "3", "--json"]
    assert main([*argv, "--framework", "torch"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[0])
    want = np.zeros((3, 3), np.int64)
    np.add.at(want, (labels, alone.argmax(-1)), 1)
    assert result["images"] == len(SIZES) and np.array_equal(result["confusion_matrix"], want)
    assert result["preprocess"]["max_patches"] == 16


@pytest.mark.slow
def test_vit_attention_on_a_naflex_model_maps_each_image_s_own_patches(tmp_path, capsys):
    """``vit attention`` (torch twin, every block) runs each image of a NaFlex model at its own aspect
    ratio: its arrays are on its own patch grid, and each block's map (the mean over patch queries) and
    the MAP probe's equal the model's attention in a padded batch of 16 patches restricted to the image's
    real patches, within the float32 attention tolerance: no padding reaches them."""
    from vit_cli.main import main
    from vit_common.naflex import stack_patches
    from vit_common.tolerance import TOLERANCES

    path, state = _folder(tmp_path)
    images = [tmp_path / "d" / "val" / "abc"[i % 3] / f"{i}.png" for i in (0, 1, 3)]  # 1:6, 4:1, 9:5
    capsys.readouterr()
    argv = ["attention", *map(str, images), "--checkpoint", str(path), "--framework", "torch"]
    assert main([*argv, "--layer", "all", "--out", str(tmp_path / "a"), "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    items = [preprocess(Image.open(p), 8, 16, 3, PP) for p in images]
    patches, mask, shapes = stack_patches(items, 16)
    with torch.no_grad():
        _, inter = (
            vit_torch.from_numpy(CFG.replace(attn_impl="explicit"), state)
            .eval()
            .forward_intermediates(
                torch.from_numpy(patches), patch_mask=torch.from_numpy(mask), spatial_shapes=torch.from_numpy(shapes)
            )
        )
    for b, (report, (h, w)) in enumerate(zip(reports, shapes.tolist(), strict=True)):
        n = h * w
        raw, probe = (np.load(tmp_path / "a" / f"{images[b].stem}_{k}.npy") for k in ("raw", "probe"))
        assert report["config"]["grid"] == [h, w] and raw.shape == (2, 2, h, w) and probe.shape == (2, h, w)
        want = np.stack([inter[f"attn{i:02d}"][b, :, :n, :n].mean(1).numpy() for i in range(2)]).reshape(2, 2, h, w)
        np.testing.assert_allclose(raw, want, rtol=0, atol=TOLERANCES[("attention", "float32")][1])
        pool = inter["attn_pool"][b, :, 0, :n].numpy().reshape(2, h, w)  # [heads, 1 probe query, L]
        np.testing.assert_allclose(probe, pool, rtol=0, atol=TOLERANCES[("attention", "float32")][1])


def test_vit_predict_takes_a_patch_budget_for_a_timm_naflexvit_state_dict(tmp_path, capsys):
    """``vit predict --max-patches 16`` of a bare timm NaFlexVit state dict (whose preprocessing, timm's
    assumed ImageNet one, has no budget) runs it as a NaFlex model, as ``vit train --init`` does: the
    probabilities equal the torch twin's on the image resized to at most 16 patches within float32."""
    from vit_cli.main import main
    from vit_common.checkpoints.formats.timm_naflex import canonical_to_naflex
    from vit_common.data.images import PRESETS

    state = random_state(CFG, seed=3, scale=0.3)
    tensors = {k: np.ascontiguousarray(v) for k, v in canonical_to_naflex(CFG, state).items()}
    save_file(tensors, str(tmp_path / "t.safetensors"))
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (41, 77, 3), np.uint8)).save(tmp_path / "i.png")
    sets = ["--set", "num_heads=2", "--set", "gelu=tanh", "--set", "posemb_resample=bilinear_aa"]
    argv = ["predict", str(tmp_path / "t.safetensors"), str(tmp_path / "i.png"), "--max-patches", "16", "--json"]
    capsys.readouterr()
    assert main([*argv, "--framework", "torch", "--top-k", "3", *sets]) == 0, capsys.readouterr().err
    got = {t["index"]: t["probability"] for t in json.loads(capsys.readouterr().out)["top"]}
    pp = PRESETS["imagenet"]
    pp = Preprocess(mean=pp.mean, std=pp.std, interpolation=pp.interpolation, max_patches=16)
    patches, (h, w) = preprocess(Image.open(tmp_path / "i.png"), 8, 16, 3, pp)
    with torch.no_grad():
        out = vit_torch.from_numpy(CFG.replace(dynamic_img_size=True, posemb_prefix=False), state)(
            torch.from_numpy(patches[None]), patch_mask=torch.ones(1, h * w, dtype=torch.bool),
            spatial_shapes=torch.tensor([[h, w]]),
        )[0].softmax(-1).numpy()  # fmt: skip
    c = compare("probabilities", np.array([got[i] for i in range(3)]), out, "tensor", "float32")
    assert c.ok, c
