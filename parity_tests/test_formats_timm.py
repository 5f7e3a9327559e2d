"""timm files into both twins and back into timm (timm as the oracle), random weights: each family people
port (ViT with every pooling, DeiT distilled, CLIP-style, DINOv2-style, SigLIP-style), timm model names
as a source, and the timm call our exports print."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.tolerance import compare
from vit_torch.formats import READERS, WRITERS
from vit_torch.timm_models import timm_config


def _logits(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize(
    "name, variant",
    [
        ("vit_tiny_patch16_224", "Ti/16"),
        pytest.param("vit_small_patch16_224", "S/16", marks=pytest.mark.slow),
        pytest.param("vit_base_patch16_224", "B/16", marks=pytest.mark.slow),  # 15 and 37 s: the fast loop runs Ti
    ],
)
def test_timm_variants_both_ways(tmp_path, name, variant, images, perturb, assert_twins_match):
    """A timm file loads into both twins with timm's logits (1e-5 relative), and our export loads into
    timm.create_model(name) with strict=True and gives timm's logits exactly."""
    tm = perturb(timm.create_model(name, pretrained=False))
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, tmp_path / "timm.safetensors")
    x = images(1, (224, 224))
    ref = _logits(tm, x)
    assert_twins_match(tmp_path / "timm.safetensors", x, ref)
    ckpt = load_checkpoint(tmp_path / "timm.safetensors")
    assert ckpt.report.variant == variant
    save_checkpoint(tmp_path / "ours.pth", ckpt.cfg, ckpt.state, writers=WRITERS)
    fresh = timm.create_model(name, pretrained=False, weight_init="skip")  # every weight is loaded next
    fresh.load_state_dict(torch.load(tmp_path / "ours.pth", weights_only=True), strict=True)
    assert np.array_equal(_logits(fresh.eval(), x), ref)


# Each family: timm's constructor arguments, and whether it is DeiT's distilled model.
FAMILIES = {
    "vit_token": dict(),
    "vit_avg_fc_norm": dict(global_pool="avg"),
    "vit_avg_no_fc_norm": dict(global_pool="avg", fc_norm=False),
    "vit_max": dict(global_pool="max", reg_tokens=1),
    "vit_avgmax_with_prefix": dict(global_pool="avgmax", reg_tokens=2, pool_include_prefix=True),
    "vit_map_with_class_token": dict(global_pool="map"),
    "vit_none": dict(global_pool="", class_token=False),
    "deit_distilled": dict(distilled=True),
    "deit3_layer_scale": dict(init_values=1e-6, no_embed_class=True),
    "clip_style": dict(pre_norm=True, act_layer="quick_gelu"),
    "dinov2_style": dict(init_values=1e-5, reg_tokens=4, no_embed_class=True),
    "siglip_style": dict(global_pool="map", class_token=False, act_layer="gelu_tanh", qk_norm=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_timm_family_loads_exactly_and_exports_load_strictly_in_timm(tmp_path, family, timm_vit, images, twin_logits):
    """The family's timm file: read with what timm files do not store (the heads, pooling, GELU, size; the
    model object says them), both twins give timm's logits. Our export of it carries the config, reads back
    with nothing assumed, and the timm code its report prints builds the model and loads it strictly."""
    tm = timm_vit(**FAMILIES[family])
    truth = timm_config(tm)
    path = tmp_path / "timm.safetensors"
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, path)
    x = images(2, (32, 32))
    ref = _logits(tm, x)
    given = {k: getattr(truth, k) for k in ("num_heads", "gelu", "ln_eps", "pool", "pool_include_prefix")}
    ckpt = load_checkpoint(path, source_image_size=32, strict=True, **given)
    assert ckpt.cfg.replace(layer_scale=truth.layer_scale) == truth
    for name, got in zip(("jax", "torch"), twin_logits(path, x, source_image_size=32, **given), strict=True):
        assert compare(name, got, ref, "tensor", "float32").ok
    report = save_checkpoint(tmp_path / "ours.safetensors", ckpt.cfg, ckpt.state, "timm")
    back = load_checkpoint(tmp_path / "ours.safetensors", strict=True)
    assert back.cfg == ckpt.cfg and back.report.assumed == []
    scope: dict = {}
    exec(report.load_call, scope)  # timm.create_model(...) + load_state_dict(strict=True)
    assert type(scope["model"]) is type(tm)
    assert np.array_equal(_logits(scope["model"].eval(), x), ref)


@pytest.mark.slow
def test_deit_distilled_gives_the_mean_of_both_heads_and_each_head(tmp_path, timm_vit, images, twin_logits):
    """DeiT's distilled model: the distillation token is the second prefix token, head_dist reads it, the
    output is the mean of both heads (timm in eval mode); both heads' logits come out of
    forward_intermediates, equal to timm's own heads."""
    import vit_torch

    tm = timm_vit(distilled=True)
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, tmp_path / "deit.safetensors")
    x = images(2, (32, 32))
    lj, lt = twin_logits(tmp_path / "deit.safetensors", x, num_heads=4)
    ref = _logits(tm, x)
    assert compare("jax", lj, ref, "tensor", "float32").ok and compare("torch", lt, ref, "tensor", "float32").ok
    ckpt = load_checkpoint(tmp_path / "deit.safetensors", num_heads=4)
    assert ckpt.cfg.dist_token and ckpt.cfg.head_dist and ckpt.cfg.num_prefix_tokens == 2
    assert "pool" not in ckpt.report.assumed  # a distilled model always reads the two tokens
    with torch.no_grad():
        feats = tm.forward_features(torch.from_numpy(x))
        heads = tm.head(feats[:, 0]).numpy(), tm.head_dist(feats[:, 1]).numpy()
        _, out = vit_torch.from_numpy(ckpt.cfg, ckpt.state).forward_intermediates(torch.from_numpy(x))
    for name, want in zip(("head", "head_dist"), heads, strict=True):
        assert compare(name, out[name].numpy(), want, "tensor", "float32").ok
    assert np.allclose((out["head"] + out["head_dist"]).numpy() / 2, out["logits"].numpy(), rtol=0, atol=1e-6)


def test_deit3_gamma_spelling_loads(tmp_path, timm_vit, images, assert_twins_match):
    tm = timm_vit(init_values=1e-6, no_embed_class=True)
    sd = {k.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2"): v for k, v in tm.state_dict().items()}
    assert "blocks.0.gamma_1" in sd
    torch.save({"model": sd}, tmp_path / "deit3.pth")  # DeiT III checkpoints wrap the weights in 'model'
    x = images(2, (32, 32))
    assert_twins_match(tmp_path / "deit3.pth", x, _logits(tm, x), num_heads=4)
    assert load_checkpoint(tmp_path / "deit3.pth", readers=READERS, num_heads=4).cfg.layer_scale is not None


@pytest.mark.slow
def test_a_timm_model_name_is_a_source_in_both_twins(images):
    """vit_torch.from_timm / vit_jax.from_timm go through timm.create_model (pretrained=False here: random
    weights; True downloads) and equal that model; the JAX side runs timm in a child process."""
    import jax.numpy as jnp

    import vit_jax
    import vit_torch

    kw = dict(num_classes=3, img_size=32, patch_size=8, depth=1, global_pool="avg", reg_tokens=4)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the seed from_timm draws random weights with
        ref_model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kw).eval()
    tmodel = vit_torch.from_timm("vit_tiny_patch16_224", pretrained=False, **kw)
    jmodel = vit_jax.from_timm("vit_tiny_patch16_224", pretrained=False, **kw)
    assert tmodel.cfg == jmodel.cfg and tmodel.cfg.num_heads == 3 and tmodel.cfg.fc_norm
    x = images(2, (32, 32))
    ref = _logits(ref_model, x)
    lj = np.asarray(jmodel(jnp.asarray(x.transpose(0, 2, 3, 1))))
    assert (
        compare("jax", lj, ref, "tensor", "float32").ok
        and compare("torch", _logits(tmodel, x), ref, "tensor", "float32").ok
    )
    with pytest.raises(ValueError, match="not a timm VisionTransformer|Unknown model"):
        vit_jax.from_timm("resnet18", pretrained=False)
