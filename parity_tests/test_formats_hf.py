"""Hugging Face transformers ViT folders into both twins and back (transformers as the oracle)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from conftest import images_nchw
from format_oracles import assert_twins_match, perturb_, twin_logits
from safetensors.torch import save_file

from vit_common.convert import load_checkpoint
from vit_common.tolerance import compare
from vit_torch.oracles import hf_model

HF_SMALL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    image_size=32,
    patch_size=8,
)


def _hf_out(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.from_numpy(x))
    return (out.logits if hasattr(out, "logits") else out.pooler_output).numpy()


@pytest.mark.parametrize(
    "arch, act, spelling",
    [
        ("classify", "gelu", "v4"),
        ("classify", "gelu_pytorch_tanh", "v5"),
        ("pooler", "gelu", "v4"),
        ("pooler", "gelu_pytorch_tanh", "v5"),
    ],
)
def test_hf_both_ways(tmp_path, arch, act, spelling):
    """A transformers folder (published v4 key names, or transformers-5 module names) loads into both
    twins with transformers' outputs; our export loads with from_pretrained (no missing, unexpected or
    mismatched key) and gives the same outputs."""
    cfg = transformers.ViTConfig(**HF_SMALL, hidden_act=act, num_labels=7, pooler_output_size=48)
    torch.manual_seed(0)
    model = perturb_(transformers.ViTForImageClassification(cfg) if arch == "classify" else transformers.ViTModel(cfg))
    folder = tmp_path / "hf"
    if spelling == "v4":
        model.save_pretrained(folder)  # transformers 5 writes the v4 names to disk
    else:
        folder.mkdir()
        cfg.to_json_file(folder / "config.json")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    x = images_nchw(2, (32, 32))
    ref = _hf_out(model, x)
    ckpt = load_checkpoint(folder)
    assert f"{spelling} key names" in ckpt.report.layout
    assert ckpt.cfg.ln_eps == 1e-12 and ckpt.cfg.gelu == ("exact" if act == "gelu" else "tanh")
    assert (ckpt.cfg.num_classes, ckpt.cfg.rep_size) == ((7, 0) if arch == "classify" else (0, 48))
    assert_twins_match(folder, x, ref)
    for out_spelling in ("v4", "v5"):
        back = hf_model(ckpt.cfg, ckpt.state, spelling=out_spelling)  # raises unless loaded strictly
        theirs = model.state_dict()
        assert back.state_dict().keys() == theirs.keys()
        assert all(torch.equal(v, theirs[k]) for k, v in back.state_dict().items())
        c = compare("hf export", _hf_out(back, x), ref, "tensor", "float32")  # eager vs sdpa attention
        assert c.ok, c


def test_hf_folder_resampled_at_load_time(tmp_path):
    """image_size at load time resamples like transformers' own interpolate_pos_encoding (bicubic, no
    antialias, align_corners=False: the default method for HF folders)."""
    cfg = transformers.ViTConfig(**HF_SMALL, num_labels=5)
    model = perturb_(transformers.ViTForImageClassification(cfg))
    model.save_pretrained(tmp_path / "hf")
    x = images_nchw(2, (48, 48))
    with torch.no_grad():
        ref = model(torch.from_numpy(x), interpolate_pos_encoding=True).logits.numpy()
    lj, lt = twin_logits(tmp_path / "hf", x, image_size=48)
    for got in (lj, lt):
        assert compare("resampled", got, ref, "tensor", "float32").ok
    meta = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert meta["image_size"] == 32  # the folder itself is untouched
