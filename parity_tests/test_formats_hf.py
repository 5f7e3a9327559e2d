"""Hugging Face transformers ViT and DeiT folders into both twins and back (transformers as the oracle)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.hf import HfWriteOptions
from vit_common.tolerance import compare


def _hf_out(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.from_numpy(x))
    if hasattr(out, "logits"):
        return out.logits.numpy()
    return (out.pooler_output if out.pooler_output is not None else out.last_hidden_state[:, 0]).numpy()


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch, act, spelling",
    [
        ("ViTForImageClassification", "gelu", "v4"),
        ("ViTForImageClassification", "gelu_pytorch_tanh", "v5"),
        ("ViTModel", "gelu", "v4"),
        ("ViTModel", "gelu_pytorch_tanh", "v5"),
        ("DeiTForImageClassification", "quick_gelu", "v4"),
        ("DeiTForImageClassificationWithTeacher", "gelu", "v5"),
        ("DeiTModel", "gelu_new", "v4"),
    ],
)
def test_hf_both_ways(tmp_path, arch, act, spelling, images, hf_vit, assert_twins_match):
    """A transformers folder of model_type vit or deit (published v4 key names, or transformers-5 module
    names) loads into both twins with transformers' outputs and nothing assumed; our export loads with
    the from_pretrained call its report prints (no missing, unexpected or mismatched key) and gives the
    same outputs."""
    model = hf_vit(arch, hidden_act=act, num_labels=7, pooler_output_size=48)
    folder = tmp_path / "hf"
    if spelling == "v4":
        model.save_pretrained(folder)  # transformers 5 writes the v4 names to disk
    else:
        folder.mkdir()
        model.config.to_json_file(folder / "config.json")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    x = images(2, (32, 32))
    ref = _hf_out(model, x)
    ckpt = load_checkpoint(folder, strict=True)
    assert ckpt.report.layout == f"{arch}, {spelling} key names" and ckpt.report.assumed == []
    gelu = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "quick_gelu": "quick"}[act]
    assert ckpt.cfg.ln_eps == 1e-12 and ckpt.cfg.gelu == gelu and ckpt.cfg.dist_token == arch.startswith("DeiT")
    backbone = arch.endswith("Model")
    assert (ckpt.cfg.num_classes, ckpt.cfg.rep_size) == ((0, 48) if backbone else (7, 0))
    assert ckpt.cfg.head_dist == arch.endswith("WithTeacher")
    assert_twins_match(folder, x, ref)
    out_spelling = "v5" if spelling == "v4" else "v4"  # export in the other spelling than the source's
    report = save_checkpoint(tmp_path / "export", ckpt.cfg, ckpt.state, "hf", options=HfWriteOptions(out_spelling))
    scope: dict = {}
    exec(report.load_call, scope)  # raises unless transformers loads every tensor and no other
    back, theirs = scope["model"].eval(), model.state_dict()
    assert type(back) is type(model) and back.state_dict().keys() == theirs.keys()
    assert all(torch.equal(v, theirs[k]) for k, v in back.state_dict().items())
    c = compare("hf export", _hf_out(back, x), ref, "tensor", "float32")  # eager vs sdpa attention
    assert c.ok, c


@pytest.mark.slow
def test_hf_folder_resampled_at_load_time(tmp_path, images, hf_vit, twin_logits):
    """image_size at load time resamples like transformers' own interpolate_pos_encoding (bicubic, no
    antialias, align_corners=False: the default method for HF folders)."""
    model = hf_vit("ViTForImageClassification")
    model.save_pretrained(tmp_path / "hf")
    x = images(2, (48, 48))
    with torch.no_grad():
        ref = model(torch.from_numpy(x), interpolate_pos_encoding=True).logits.numpy()
    lj, lt = twin_logits(tmp_path / "hf", x, image_size=48)
    for got in (lj, lt):
        assert compare("resampled", got, ref, "tensor", "float32").ok
    meta = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert meta["image_size"] == 32  # the folder itself is untouched


def test_sharded_export_loads_in_transformers(tmp_path, hf_vit):
    """An HF folder written with a shard size (``--shard-size``) is shards plus
    model.safetensors.index.json that transformers' from_pretrained loads whole, tensor for tensor."""
    model = hf_vit("ViTForImageClassification", hidden_act="gelu", num_labels=7)
    model.save_pretrained(tmp_path / "hf")
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    report = save_checkpoint(tmp_path / "export", ckpt.cfg, ckpt.state, "hf", options=HfWriteOptions(shard_size="8KB"))
    assert len(list((tmp_path / "export").glob("model-*-of-*.safetensors"))) > 2
    assert (tmp_path / "export" / "model.safetensors.index.json").is_file()
    scope: dict = {}
    exec(report.load_call, scope)  # raises unless transformers loads every tensor and no other
    back, theirs = scope["model"].state_dict(), model.state_dict()
    assert back.keys() == theirs.keys() and all(torch.equal(v, theirs[k]) for k, v in back.items())
