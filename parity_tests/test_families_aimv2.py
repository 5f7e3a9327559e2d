"""AIMv2 in both twins against the libraries that define it, tiny models built here (timm 1.0.31
``aimv2_*``, transformers 5.24 ``Aimv2VisionModel``): RMSNorm, the norm after the patch embedding, the
bias-free projections, the split SwiGLU, the attention probe and the native sin-cos table, each equal to
its library within ``vit_common.tolerance`` (float32 1e-5 relative, float64 1e-10), round trips bit-exact.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import vit_jax
import vit_torch
from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.timm_state import timm_load_call
from vit_common.config import ViTConfig
from vit_common.posemb import sincos2d
from vit_common.state import random_state
from vit_common.tolerance import compare
from vit_torch.formats import READERS
from vit_torch.timm_models import canonical_from_timm, timm_config

_HF = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, patch_size=14)


def _normal(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter N(0, 0.3), norm weights included (a missing or swapped RMSNorm then shows)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def _twins(cfg: ViTConfig, state: dict, x: np.ndarray) -> list[tuple[np.ndarray, dict]]:
    """(output, intermediates) of both twins for images ``x`` [B, C, H, W], as numpy."""
    import jax.numpy as jnp

    lj, oj = vit_jax.from_numpy(cfg, state).forward_intermediates(jnp.asarray(x.transpose(0, 2, 3, 1)))
    with torch.no_grad():
        lt, ot = vit_torch.from_numpy(cfg, state).eval().forward_intermediates(torch.from_numpy(x))
    return [
        (np.asarray(lj), {k: np.asarray(v) for k, v in oj.items()}),
        (lt.numpy(), {k: v.numpy() for k, v in ot.items()}),
    ]


def _assert_close(name: str, ours: np.ndarray, ref: np.ndarray, dtype: str = "float32") -> None:
    c = compare(name, ours, ref, "tensor", dtype)
    assert c.ok, c


@pytest.fixture(scope="module")
def timm_aimv2():
    import timm

    torch.manual_seed(0)
    model = timm.create_model(
        "aimv2_large_patch14_224", pretrained=False, embed_dim=64, depth=2, num_heads=4, img_size=56
    )
    return _normal(model)


@pytest.mark.slow
def test_timm_aimv2_in_both_twins(timm_aimv2, images, tmp_path):
    cfg = timm_config(timm_aimv2, "aimv2")
    assert (cfg.norm, cfg.patch_norm, cfg.proj_bias, cfg.mlp_bias, cfg.qkv_bias) == (
        "rmsnorm",
        True,
        False,
        False,
        False,
    )
    assert (cfg.mlp_type, cfg.mlp_dim, cfg.ln_eps, cfg.pool) == ("swiglu", 176, 1e-5, "gap")
    assert cfg.param_count() == sum(p.numel() for p in timm_aimv2.parameters())
    state = canonical_from_timm(timm_aimv2, cfg)
    x = images(2, (56, 56))
    with torch.no_grad():
        tokens = timm_aimv2.forward_features(torch.from_numpy(x)).numpy()
        pooled = timm_aimv2(torch.from_numpy(x)).numpy()
    for out, inter in _twins(cfg, state, x):
        _assert_close("norm", inter["norm"], tokens)
        _assert_close("pooled", out, pooled)
    # a timm file of ours: timm's model for the config loads it strictly and computes the same
    save_checkpoint(tmp_path / "a.safetensors", cfg, state, "timm")
    scope: dict = {}
    exec(timm_load_call(tmp_path / "a.safetensors", cfg), scope)
    with torch.no_grad():
        _assert_close("timm reload", scope["model"].eval()(torch.from_numpy(x)).numpy(), pooled)


@pytest.mark.slow
def test_timm_aimv2_float64(timm_aimv2, images, x64):
    cfg = timm_config(timm_aimv2, "aimv2").replace(dtype="float64", param_dtype="float64")
    state = {k: v.astype(np.float64) for k, v in canonical_from_timm(timm_aimv2, cfg).items()}
    x = images(2, (56, 56), dtype=np.float64)
    with torch.no_grad():
        ref = timm_aimv2.double()(torch.from_numpy(x)).numpy()
    timm_aimv2.float()
    for out, _ in _twins(cfg, state, x):
        _assert_close("pooled", out, ref, "float64")


def _hf(tmp_path, name: str, **config):
    import transformers

    torch.manual_seed(0)
    model = _normal(transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**_HF, **config)))
    model.save_pretrained(tmp_path / name)
    return model


@pytest.mark.slow
def test_transformers_probe_head_round_trip(tmp_path, images):
    import transformers

    model = _hf(tmp_path, "hf", image_size=56, use_head=True, qkv_bias=True, mlp_bias=True)
    x = images(2, (56, 56))
    with torch.no_grad():
        out = model(torch.from_numpy(x))
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    assert ckpt.cfg.pool == "probe" and ckpt.report.assumed == []
    for pooled, inter in _twins(ckpt.cfg, ckpt.state, x):
        _assert_close("pooler_output", pooled, out.pooler_output.numpy())
        _assert_close("last_hidden_state", inter["norm"], out.last_hidden_state.numpy())
        assert inter["attn_pool"].shape == (2, 4, 1, 16)
    (_, a), (_, b) = _twins(ckpt.cfg, ckpt.state, x)
    assert compare("attn_pool", a["attn_pool"], b["attn_pool"], "attention", "float32").ok
    save_checkpoint(tmp_path / "out", ckpt.cfg, ckpt.state, "hf_family")
    again, info = transformers.Aimv2VisionModel.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not any(info.values()), info
    from safetensors.numpy import load_file

    read, written = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert read.keys() == written.keys() and all(np.array_equal(read[k], written[k]) for k in read)


@pytest.mark.slow
def test_transformers_native_at_other_sizes(tmp_path, images):
    model = _hf(tmp_path, "hf", image_size=56, use_head=False, is_native=True)
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    assert (ckpt.cfg.posemb, ckpt.cfg.pool, ckpt.cfg.dynamic_img_size) == ("sincos2d_mae", "none", True)
    for size in ((56, 56), (42, 70)):
        x = images(1, size)
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).last_hidden_state.numpy()
        for out, _ in _twins(ckpt.cfg, ckpt.state, x):
            _assert_close(f"tokens at {size}", out, ref)


def test_sincos2d_mae_is_transformers_table():
    from transformers.models.aimv2.modeling_aimv2 import build_2d_sinusoidal_position_embedding

    table = build_2d_sinusoidal_position_embedding(3, 5, embed_dim=64, dtype=torch.float64).numpy()
    half = table.shape[-1] // 2  # transformers rotates its h-first table to AIMv2's x-first one
    ref = np.concatenate([table[..., half:], table[..., :half]], axis=-1)
    np.testing.assert_allclose(sincos2d((3, 5), 64, convention="mae"), ref, rtol=0, atol=1e-12)
    assert np.abs(sincos2d((3, 5), 64) - ref).max() > 0.05  # big_vision's frequencies differ


def test_timm_to_transformers(timm_aimv2, images, tmp_path):
    """timm's aimv2 as transformers' Aimv2VisionModel (every token: transformers has no mean pooling)."""
    import transformers

    cfg = timm_config(timm_aimv2, "aimv2")
    save_checkpoint(tmp_path / "hf", cfg.replace(pool="none"), canonical_from_timm(timm_aimv2, cfg), "hf_family")
    model, info = transformers.Aimv2VisionModel.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not any(info.values()), info
    x = torch.from_numpy(images(2, (56, 56)))
    with torch.no_grad():
        _assert_close("tokens", model.eval()(x).last_hidden_state.numpy(), timm_aimv2.forward_features(x).numpy())
    with pytest.raises(ValueError, match="cannot hold this model"):
        save_checkpoint(tmp_path / "gap", cfg, canonical_from_timm(timm_aimv2, cfg), "hf_family")


@pytest.mark.slow
def test_rmsnorm_twins_against_torch_and_float64():
    import jax.numpy as jnp

    cfg = ViTConfig.from_name("mu/8", image_size=16, norm="rmsnorm", patch_norm=True, num_classes=0)
    w = random_state(cfg, seed=3)["patch_embed.norm.weight"]
    x = 10 * np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    ref64 = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + cfg.ln_eps) * w
    tm = vit_torch.from_numpy(cfg, random_state(cfg)).patch_embed.norm
    jm = vit_jax.from_numpy(cfg, random_state(cfg)).patch_embed.norm
    tm.weight.data = torch.from_numpy(w)
    jm.scale[...] = jnp.asarray(w)
    with torch.no_grad():
        ours_t = tm(torch.from_numpy(x)).numpy()
        lib = torch.nn.functional.rms_norm(torch.from_numpy(x), (32,), torch.from_numpy(w), cfg.ln_eps).numpy()
    ours_j = np.asarray(jm(jnp.asarray(x)))
    for name, ours in (("torch", ours_t), ("jax", ours_j)):
        _assert_close(f"{name} vs float64", ours, ref64)
        _assert_close(f"{name} vs F.rms_norm", ours, lib)


def test_writers_without_rmsnorm_refuse_it(tmp_path):
    vit = ViTConfig.from_name("mu/8", image_size=16, norm="rmsnorm", num_classes=3)
    siglip = vit.replace(class_token=False, pool="map", num_classes=0)  # a SigLIP but for its norms
    for fmt, path, cfg in (("hf", "hf", vit), ("big_vision", "b.npz", vit), ("hf_family", "f", siglip)):
        with pytest.raises(ValueError, match="norm='rmsnorm'"):
            save_checkpoint(tmp_path / path, cfg, random_state(cfg), fmt)
    assert not list(tmp_path.iterdir())


def test_timm_file_reads_rmsnorm_with_eps_warned(timm_aimv2, tmp_path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in timm_aimv2.state_dict().items()}, tmp_path / "t.safetensors")
    ckpt = load_checkpoint(tmp_path / "t.safetensors", readers=READERS)
    assert (ckpt.cfg.norm, ckpt.cfg.patch_norm, ckpt.cfg.proj_bias, ckpt.cfg.mlp_bias) == (
        "rmsnorm",
        True,
        False,
        False,
    )
    assert "ln_eps" in ckpt.report.assumed and ckpt.report.provenance["norm"].kind == "derived"


def test_bad_aimv2_folders_are_refused_naming_what(tmp_path):
    import json

    _hf(tmp_path, "hf", image_size=28, use_head=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    for edit, words in (
        ({"hidden_act": "gelu"}, "hidden_act='gelu': AIMv2's SwiGLU takes silu only"),
        # transformers would add an untrained head: the declared probe is more than the file holds
        ({"use_head": True}, "declares 151,104 parameters besides the head, but the file holds 138,688"),
    ):
        (tmp_path / "hf" / "config.json").write_text(json.dumps(config | edit))
        with pytest.raises(ValueError, match=re.escape(words)):
            load_checkpoint(tmp_path / "hf")


@pytest.mark.slow
def test_aimv2_folder_without_use_head_or_head_tensors_gives_every_token(tmp_path, images):
    """config.json without ``use_head`` and no ``head.*`` tensors: pool 'none' (derived from the tensors),
    equal to transformers' every token; the probe with a q/v-only bias is refused (its kv bias is qkv_bias)."""
    import json

    model = _hf(tmp_path, "hf", image_size=28, use_head=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["use_head"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    assert ckpt.cfg.pool == "none" and ckpt.report.provenance["pool"].kind == "derived"
    x = images(1, (28, 28))
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).last_hidden_state.numpy()
    for out, _ in _twins(ckpt.cfg, ckpt.state, x):
        _assert_close("every token", out, ref)
    with pytest.raises(ValueError, match="pool='probe' with qkv_bias=True, k_bias=False"):
        ckpt.cfg.replace(pool="probe", qkv_bias=True, k_bias=False)


@pytest.mark.slow  # ~35 s on 2 busy cores, JAX's compilation of the train step
def test_aimv2_style_training_steps_agree_in_both_twins(x64, tiny_cfg, tiny_dataset):
    """Three optimizer steps of both twins on an AIMv2-style model (RMSNorm, a patch norm, no projection
    biases, SwiGLU, the probe) agree in every parameter and Adam moment to float64's 1e-10."""
    from vit_common.training.train_config import TrainConfig
    from vit_compare.training import compare_training

    cfg = tiny_cfg.replace(
        in_chans=1, depth=2, dtype="float64", param_dtype="float64", norm="rmsnorm", patch_norm=True,
        proj_bias=False, mlp_bias=False, qkv_bias=False, mlp_type="swiglu", class_token=False, pool="probe",
    )  # fmt: skip
    r = compare_training(cfg, TrainConfig(batch_size=8, epochs=2, lr=1e-2, weight_decay=0.05), tiny_dataset(), 3)
    assert r.dtype == "float64" and r.ok and len(r.rows) == 3, r.rows
