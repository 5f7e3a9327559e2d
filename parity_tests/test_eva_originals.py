"""EVA-02 and Perception Encoder original ``.pt`` files (BAAI's and Meta's keys), made by inverting timm's own
converters on tiny timm models: timm's converter (``checkpoint_filter_fn``, ``_convert_pe``) gives the
model's state back (so the files are what timm reads), the reader gives the same canonical state bit for
bit, the same config as timm's model (what the family fixes assumed, the head count given) and the
torch twin equals timm's model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vit_common.checkpoints.convert import convert, load_checkpoint
from vit_common.checkpoints.formats.timm_eva import eva_to_canonical
from vit_common.tolerance import compare
from vit_torch import from_numpy
from vit_torch.formats import READERS, WRITERS
from vit_torch.timm_eva import eva_config
from vit_torch.weights import tensor_to_numpy

timm = pytest.importorskip("timm")
from timm.models.eva import _convert_pe, checkpoint_filter_fn  # noqa: E402


def _timm(name: str, size: int, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False, embed_dim=32, depth=2, num_heads=2, img_size=size, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


def eva02_original(sd: dict) -> dict:
    """timm's EVA-02 state dict in BAAI's keys (the inverse of ``checkpoint_filter_fn``), with the
    fixed RoPE tables BAAI's files hold."""
    swiglu = (
        any(".mlp.fc1_g." in k for k in sd)
        or sd["blocks.0.mlp.fc1.weight"].shape[0] == 2 * sd["blocks.0.mlp.fc2.weight"].shape[1]
    )
    out = {}
    for k, v in sd.items():
        k = k.replace("attn.q_proj.bias", "attn.q_bias").replace("attn.v_proj.bias", "attn.v_bias")
        k = k.replace("mlp.norm", "mlp.ffn_ln").replace("attn.norm", "attn.inner_attn_ln")
        k = k.replace("mlp.fc1_g", "mlp.w1").replace("mlp.fc1_x", "mlp.w2")
        if swiglu:
            k = k.replace("mlp.fc1.", "mlp.w12.").replace("mlp.fc2", "mlp.w3")
        out[k] = v
    return out | {"rope.freqs_cos": torch.ones(4, 16), "rope.freqs_sin": torch.zeros(4, 16)}


def pe_original(sd: dict) -> dict:
    """timm's PE state dict in perception_models' keys (the inverse of ``_convert_pe``), under
    ``visual.``, beside a text tower's tensor."""
    swaps = (
        ("patch_embed.proj", "conv1"),
        ("norm_pre", "ln_pre"),
        ("blocks.", "transformer.resblocks."),
        ("norm1", "ln_1"),
        ("norm2", "ln_2"),
        ("gamma_1", "ls_1.gamma"),
        ("gamma_2", "ls_2.gamma"),
        ("attn.qkv.", "attn.in_proj_"),
        ("attn.proj", "attn.out_proj"),
        ("mlp.fc1", "mlp.c_fc"),
        ("mlp.fc2", "mlp.c_proj"),
    )
    out = {"text.token_embedding.weight": torch.zeros(8, 4)}
    for k, v in sd.items():
        if k == "head.bias":
            continue
        if k == "head.weight":
            out["visual.proj"] = v.T.contiguous()
            continue
        if k.startswith("attn_pool."):
            leaf = k.rsplit(".", 1)[1]
            if k.startswith(("attn_pool.q.", "attn_pool.kv.")):
                if k.startswith("attn_pool.q."):
                    qkv = torch.cat([v, sd[f"attn_pool.kv.{leaf}"]])
                    out[f"visual.attn_pool.attn.in_proj_{leaf}"] = qkv
                continue
            k = k.replace("attn_pool.proj", "attn_pool.attn.out_proj").replace("attn_pool.norm", "attn_pool.layernorm")
            k = (
                k.replace("attn_pool.latent", "attn_pool.probe")
                .replace("mlp.fc1", "mlp.c_fc")
                .replace("mlp.fc2", "mlp.c_proj")
            )
        elif k == "norm.weight" or k == "norm.bias":
            k = k.replace("norm", "ln_post")
        elif k == "cls_token":
            k, v = "class_embedding", v.reshape(-1)
        elif k == "pos_embed":
            k, v = "positional_embedding", v[0]
        else:
            for a, b in swaps:
                k = k.replace(a, b)
        out[f"visual.{k}"] = v
    return out


CASES = {
    "eva02_tiny_patch14_224": (28, {}),  # fused qkv, packed SwiGLU (mlp.w12)
    "eva02_base_patch14_224": (28, {}),  # split q/k/v, split SwiGLU (w1/w2/w3) with ffn_ln
    "eva02_large_patch14_clip_224": (28, {}),  # plus attn.inner_attn_ln
    "vit_pe_core_tiny_patch16_384": (32, dict(ref_feat_shape=(2, 2), num_classes=6)),  # MAP head, visual proj
    "vit_pe_spatial_tiny_patch16_512": (32, dict(ref_feat_shape=(2, 2), num_classes=0)),  # no pool, no final norm
}


@pytest.mark.parametrize("name", list(CASES))
def test_an_original_file_reads_as_timms_converter_reads_it(tmp_path, name):
    size, kw = CASES[name]
    m = _timm(name, size, **({"num_classes": 5} | kw))
    pe = name.startswith("vit_pe")
    if pe and m.num_classes:
        with torch.no_grad():
            m.head.bias.zero_()  # PE's visual proj has no bias: timm's converter writes zeros
    sd = m.state_dict()
    original = pe_original(sd) if pe else eva02_original(sd)
    back = _convert_pe(original, m) if pe else checkpoint_filter_fn(original, m)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)  # the inversion is exact
    torch.save({"model": original} if pe else original, tmp_path / "orig.pt")

    ckpt = load_checkpoint(tmp_path / "orig.pt", readers=READERS, num_heads=2)
    assert ckpt.report.format == "eva_original"
    want = eva_to_canonical({k: tensor_to_numpy(v) for k, v in sd.items()})
    assert set(ckpt.state) == set(want)
    assert all(np.asarray(ckpt.state[k]).tobytes() == np.asarray(want[k]).tobytes() for k in want)
    cfg = eva_config(m, name)
    assert ckpt.cfg == cfg.replace(layer_scale=ckpt.cfg.layer_scale), (ckpt.cfg, cfg)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, ref = from_numpy(ckpt.cfg, ckpt.state)(x).numpy(), m(x).numpy()
    c = compare(name, got, ref, "tensor", "float32")
    assert c.ok, c
    dropped = {k for k, _ in ckpt.report.dropped}
    assert dropped >= ({"text.token_embedding.weight"} if pe else {"rope.freqs_cos", "rope.freqs_sin"})
    report = convert(
        tmp_path / "orig.pt", tmp_path / "t.safetensors", to_fmt="timm", readers=READERS, writers=WRITERS, num_heads=2
    )
    scope: dict = {}
    exec(report.load_call, scope)  # the original, written for timm, loads strictly and computes timm's numbers
    with torch.no_grad():
        assert np.array_equal(scope["model"].eval()(x).numpy(), ref)
