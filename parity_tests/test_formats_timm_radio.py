"""timm's RADIO backbones (``vit_*_patch16_radio_*``: timm's VisionTransformer with one class token, the
other teachers' class tokens as registers, LayerScale, a patch-only position table and no final norm)
into both twins and back into timm, timm 1.0.31 as the oracle: tiny random models at two sizes, as a
state-dict file and as a timm hub folder."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models._hub import save_for_hf

from vit_common.checkpoints.convert import convert, load_checkpoint, save_checkpoint
from vit_common.tolerance import compare
from vit_torch.formats import READERS

TINY = dict(patch_size=8, embed_dim=64, depth=2, num_heads=2)


def _logits(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("size", [32, pytest.param(48, marks=pytest.mark.slow)])
def test_timm_radio_file_and_hub_folder_equal_timm_and_write_back(tmp_path, size, perturb, images, twin_logits):
    """``vit_base_patch16_radio_v3`` at ``size`` px: the state-dict file (heads and size given) and the
    hub folder read as timm builds it (final_norm False, 7 registers, no class row in the table), both
    twins equal timm's pooled features to 1e-5; written back as a timm file and a hub folder, timm loads
    each strictly with the same output bit for bit."""
    tm = perturb(timm.create_model("vit_base_patch16_radio_v3", pretrained=False, img_size=size, **TINY))
    path = tmp_path / "timm.safetensors"
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, path)
    save_for_hf(tm, tmp_path / "hub")
    x = images(2, (size, size))
    ref = _logits(tm, x)
    given = dict(num_heads=2, gelu="exact", ln_eps=1e-6, pool="token")
    for source, options in ((path, dict(source_image_size=size, **given)), (tmp_path / "hub", {})):
        ckpt = load_checkpoint(source, strict=True, readers=READERS, **options)
        cfg = ckpt.cfg
        assert (cfg.final_norm, cfg.fc_norm, cfg.reg_tokens, cfg.posemb_prefix) == (False, False, 7, False)
        for name, got in zip(("jax", "torch"), twin_logits(source, x, **options), strict=True):
            assert compare(f"{name} {source.name}", got, ref, "tensor", "float32").ok
    report = save_checkpoint(tmp_path / "ours.safetensors", ckpt.cfg, ckpt.state, "timm")
    assert "final_norm=False" in report.load_call
    scope: dict = {}
    exec(report.load_call, scope)  # timm.create_model(...) + load_state_dict(strict=True)
    assert np.array_equal(_logits(scope["model"].eval(), x), ref)
    convert(tmp_path / "hub", tmp_path / "out", to_fmt="timm", readers=READERS)
    back = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()  # strict load
    assert np.array_equal(_logits(back, x), ref)
    assert load_checkpoint(tmp_path / "out", readers={}, strict=True).cfg == cfg  # read without timm
