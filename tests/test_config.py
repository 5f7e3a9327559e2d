"""ViTConfig, the variant table, parameter and FLOP accounting (vit_common only)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from vit_common.config import VARIANTS, ViTConfig
from vit_common.state import StateMismatchError, canonical_shapes, check_state, random_state


def test_every_variant_row_has_a_golden_count(golden_params):
    tested = {name.split("/")[0] for name in golden_params}
    assert tested == set(VARIANTS), f"untested VARIANTS rows: {set(VARIANTS) - tested}"


def test_param_count_golden(golden_params):
    for name, count in golden_params.items():
        cfg = ViTConfig.from_name(name)
        assert cfg.param_count() == count, name
        assert sum(math.prod(s) for s in canonical_shapes(cfg).values()) == count, name


def test_variant_rows_match_vit_paper_table1():
    # Dosovitskiy et al. 2021, Table 1: layers, hidden size D, MLP size, heads.
    assert VARIANTS["B"] == dict(width=768, depth=12, mlp_dim=3072, num_heads=12)
    assert VARIANTS["L"] == dict(width=1024, depth=24, mlp_dim=4096, num_heads=16)
    assert VARIANTS["H"] == dict(width=1280, depth=32, mlp_dim=5120, num_heads=16)


def test_from_name_and_derived_properties():
    cfg = ViTConfig.from_name("S/16", num_classes=10, image_size=(224, 320))
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim, cfg.num_classes) == (384, 12, 6, 1536, 10)
    assert cfg.image_size == (224, 320) and cfg.patch_size == (16, 16)
    assert cfg.grid == (14, 20) and cfg.num_patches == 280 and cfg.seq_len == 281
    assert cfg.head_dim == 64 and cfg.variant == "S"
    reg = cfg.replace(reg_tokens=4, posemb_prefix=False)
    assert reg.num_prefix_tokens == 5 and reg.seq_len == 285 and reg.posemb_len == 280


def test_prefix_tokens_and_new_fields_in_param_count():
    """Distillation token, its head, norm_pre and a bias-free patch embedding change the count as timm's
    (deit_tiny_distilled_patch16_224: 5,910,800 parameters in timm)."""
    deit = ViTConfig.from_name("Ti/16", dist_token=True, head_dist=True)
    assert deit.num_prefix_tokens == 2 and deit.seq_len == 198 and deit.param_count() == 5_910_800
    clip = ViTConfig.from_name("B/16", norm_pre=True, patch_bias=False)
    assert clip.param_count() == ViTConfig.from_name("B/16").param_count() + 2 * 768 - 768
    # without RoPE, a MAP head or RADIO's summary, the RoPE, MAP-head and summary fields are inert too
    no_rope = {f.name for f in dataclasses.fields(ViTConfig) if f.name.startswith(("rope_", "map_", "summary_"))}
    assert ViTConfig.from_name("Ti/16", pool="gap", reg_tokens=4).inert_fields() == no_rope
    assert ViTConfig.from_name("Ti/16").inert_fields() == {"pool_include_prefix"} | no_rope


def test_gated_mlp_token_gap_and_bias_free_head_in_param_count():
    """timm's vit_giant_patch14_dinov2 (SwiGLUPacked, gated width 4096, LayerScale, 518 px, no head) has
    1,136,479,232 parameters in timm 1.0.31; DINOv2's classifier reads [class token, mean] (2D inputs);
    CLIP's projection has no bias."""
    g = ViTConfig(
        image_size=518,
        patch_size=14,
        width=1536,
        depth=40,
        num_heads=24,
        mlp_dim=4096,
        mlp_type="swiglu",
        layer_scale=1e-5,
        num_classes=0,
    )
    assert g.param_count() == 1_136_479_232
    plain = g.replace(mlp_type="plain")
    assert g.param_count() - plain.param_count() == 40 * (1536 * 4096 + 4096)  # one more D x F matrix and bias
    assert g.flops() - plain.flops() == 40 * 2 * g.seq_len * 1536 * 4096
    assert "gelu" in g.inert_fields() and "gelu" not in plain.inert_fields()
    dino = ViTConfig.from_name("S/14", pool="token_gap", num_classes=1000)
    assert dino.features_dim == 768
    assert dino.param_count() == ViTConfig.from_name("S/14", num_classes=1000).param_count() + 384 * 1000
    clip = ViTConfig.from_name("B/16", num_classes=512, head_bias=False)
    assert clip.param_count() == ViTConfig.from_name("B/16", num_classes=512).param_count() - 512
    assert "head_bias" in clip.replace(num_classes=0).inert_fields()


def test_json_round_trip_is_exact():
    cfg = ViTConfig.from_name("B/16", image_size=(384, 256), reg_tokens=4, layer_scale=1e-5, gelu="tanh")
    assert ViTConfig.from_json(cfg.to_json()) == cfg
    assert hash(ViTConfig.from_json(cfg.to_json())) == hash(cfg)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(pool="avg"), "pool='avg'"),
        (dict(gelu="fast"), "gelu='fast'"),
        (dict(width=100, num_heads=3), "width=100 is not divisible by num_heads=3"),
        (dict(class_token=False), "pool='token' needs class_token=True"),
        (dict(image_size=225), "image_size=(225, 225) is not a multiple of patch_size=(16, 16)"),
        (dict(posemb="sincos2d"), "posemb_prefix=False"),
        (dict(dropout=1.0), "dropout=1.0"),
        (dict(ln_eps=0.0), "ln_eps=0.0"),
        (dict(layer_scale=0.0), "layer_scale=0.0"),
        (dict(reg_tokens=-1), "reg_tokens=-1"),
        (dict(posemb_resample="nearest"), "posemb_resample='nearest'"),
        (dict(attn_backend="flash"), "attn_backend='flash'"),
        (dict(image_size=(224, 224, 3)), "image_size=(224, 224, 3)"),
        (dict(dist_token=True, class_token=False, pool="gap"), "dist_token=True needs class_token=True"),
        (dict(head_dist=True), "head_dist=True (DeiT's distilled head) needs dist_token=True"),
        (dict(dist_token=True, head_dist=True, pool="gap"), "got pool='gap'"),
        (dict(dist_token=True, head_dist=True, rep_size=8), "got rep_size=8"),
        (dict(qkv_bias=1), "qkv_bias=1: expected True or False"),
        (dict(mlp_type="geglu"), "mlp_type='geglu'"),
        (dict(mlp_type="swiglu", pool="map"), "mlp_type='swiglu' with pool='map'"),
        (dict(pool="token_gap", class_token=False), "pool='token_gap' needs class_token=True"),
        (dict(pool="token_gap", fc_norm=True), "got fc_norm=True, rep_size=0"),
        (dict(pool="token_gap", rep_size=8), "got fc_norm=False, rep_size=8"),
        (dict(head_bias=0), "head_bias=0: expected True or False"),
    ],
)
def test_invalid_configs_name_the_values(kwargs, message):
    with pytest.raises(ValueError) as e:
        ViTConfig.from_name("Ti/16", **kwargs)
    assert message in str(e.value)


@pytest.mark.parametrize("name", ["B", "B/", "X/16", "B/16/2", "ViT-B/16"])
def test_bad_variant_strings(name):
    with pytest.raises(ValueError, match="variant"):
        ViTConfig.from_name(name)


def test_unknown_override_is_named():
    with pytest.raises(ValueError, match="embed_dim"):
        ViTConfig.from_name("B/16", embed_dim=768)


def test_grid_for_sizes():
    cfg = ViTConfig.from_name("Ti/14")  # 224 = 16 x 14
    with pytest.raises(ValueError, match=r"\(384, 384\).*not a multiple of patch_size \(14, 14\)"):
        cfg.grid_for((384, 384))
    dyn = cfg.replace(dynamic_img_size=True)
    assert dyn.grid_for((384, 384)) == (27, 27)  # VALID floor: 729 tokens, never SAME's 28x28
    pad = cfg.replace(dynamic_img_pad=True, dynamic_img_size=True)
    assert pad.grid_for((384, 384)) == (28, 28)
    p16 = ViTConfig.from_name("Ti/16")
    with pytest.raises(ValueError, match=r"\(225, 230\)"):
        p16.grid_for((225, 230))


def test_flops_formula_b16():
    cfg = ViTConfig.from_name("B/16")
    n, l, d, f, p = 196, 197, 768, 3072, 16
    expected = 2 * n * 3 * p * p * d + 12 * (2 * l * (4 * d * d + 2 * d * f) + 4 * l * l * d) + 2 * d * 1000
    assert cfg.flops() == expected == 35_127_656_448
    assert cfg.flops(384) > 3 * cfg.flops()


def test_check_state_lists_everything_together(small_cfg):
    cfg = small_cfg.replace(depth=1)
    shapes = canonical_shapes(cfg)
    state = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    del state["blocks.0.mlp.fc2.bias"]
    state["blocks.0.extra"] = np.zeros(1)
    state["head.weight"] = np.zeros((11, 32))
    with pytest.raises(StateMismatchError) as e:
        check_state(shapes, state)
    msg = str(e.value)
    assert "missing: blocks.0.mlp.fc2.bias" in msg
    assert "unexpected: blocks.0.extra" in msg
    assert "shape: head.weight has (11, 32), expected (10, 32)" in msg


def test_random_state_is_seeded_normal_in_canonical_order(small_cfg):
    """numpy's default_rng(0) standard normals, scaled in float64 then cast, drawn in canonical order."""
    import ml_dtypes

    cfg = small_cfg.replace(depth=1)
    state = random_state(cfg)
    assert list(state) == list(canonical_shapes(cfg)) and all(v.dtype == np.float32 for v in state.values())
    assert {k: v.shape for k, v in state.items()} == canonical_shapes(cfg)
    assert state["cls_token"].ravel()[:3].tolist() == [np.float32(x) for x in (0.12573022, -0.13210486, 0.64042265)]
    assert state["head.bias"][-2:].tolist() == [np.float32(1.7028193), np.float32(-0.86570704)]  # the last draws
    same_shape = [(a, b) for a in state for b in state if a < b and state[a].shape == state[b].shape]
    assert same_shape and not any(np.array_equal(state[a], state[b]) for a, b in same_shape)
    low = random_state(cfg, seed=1, scale=0.2, dtype=ml_dtypes.bfloat16)["cls_token"].ravel()[:3]
    assert low.dtype == ml_dtypes.bfloat16 and low.tolist() == [0.0693359375, 0.1640625, 0.06591796875]
