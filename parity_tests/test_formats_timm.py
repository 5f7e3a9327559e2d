"""timm files into both twins and back into timm (timm as the oracle), random weights."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from conftest import images_nchw
from format_oracles import assert_twins_match, perturb_
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer

from vit_common.convert import load_checkpoint, save_checkpoint
from vit_torch.formats import READERS, WRITERS
from vit_torch.oracles import timm_model

SMALL_TIMM = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)


def _logits(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize(
    "name, variant",
    [("vit_tiny_patch16_224", "Ti/16"), ("vit_small_patch16_224", "S/16"), ("vit_base_patch16_224", "B/16")],
)
def test_timm_variants_both_ways(tmp_path, name, variant):
    """A timm file loads into both twins with timm's logits (1e-5 relative), and our export loads into
    timm.create_model(name) with strict=True and gives timm's logits exactly."""
    tm = perturb_(timm.create_model(name, pretrained=False))
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, tmp_path / "timm.safetensors")
    x = images_nchw(1, (224, 224))
    ref = _logits(tm, x)
    assert_twins_match(tmp_path / "timm.safetensors", x, ref)
    ckpt = load_checkpoint(tmp_path / "timm.safetensors")
    assert ckpt.report.variant == variant
    save_checkpoint(tmp_path / "ours.pth", ckpt.cfg, ckpt.state, writers=WRITERS)
    fresh = timm.create_model(name, pretrained=False, weight_init="skip")  # every weight is loaded next
    fresh.load_state_dict(torch.load(tmp_path / "ours.pth", weights_only=True), strict=True)
    assert np.array_equal(_logits(fresh.eval(), x), ref)


@pytest.mark.parametrize(
    "kw",
    [
        dict(reg_tokens=4, no_embed_class=True),  # register tokens (timm vit_*_reg4)
        dict(init_values=1e-5),  # LayerScale
        dict(global_pool="map", class_token=False),  # MAP head (SigLIP-style)
        dict(global_pool="avg", fc_norm=True, qk_norm=True, qkv_bias=False),
    ],
)
def test_timm_features_both_ways(tmp_path, kw):
    tm = perturb_(VisionTransformer(**SMALL_TIMM, **kw))
    torch.save(tm.state_dict(), tmp_path / "timm.pth")
    x = images_nchw(2, (32, 32))
    ref = _logits(tm, x)
    assert_twins_match(tmp_path / "timm.pth", x, ref, num_heads=4)  # heads are not stored in timm files
    ckpt = load_checkpoint(tmp_path / "timm.pth", readers=READERS, num_heads=4)
    assert np.array_equal(_logits(timm_model(ckpt.cfg, ckpt.state), x), ref)  # strict load, same logits


def test_deit3_gamma_spelling_loads(tmp_path):
    tm = perturb_(VisionTransformer(**SMALL_TIMM, init_values=1e-6, no_embed_class=True))
    sd = {k.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2"): v for k, v in tm.state_dict().items()}
    assert "blocks.0.gamma_1" in sd
    torch.save({"model": sd}, tmp_path / "deit3.pth")  # DeiT III checkpoints wrap the weights in 'model'
    x = images_nchw(2, (32, 32))
    assert_twins_match(tmp_path / "deit3.pth", x, _logits(tm, x), num_heads=4)
