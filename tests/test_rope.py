"""vit_common.rope: golden tables printed by timm 1.0.31 (grid 2 x 3, head_dim 8) and the RoPE config rules."""

from __future__ import annotations

import numpy as np
import pytest

from vit_common import rope
from vit_common.config import ViTConfig

BASE = dict(width=16, num_heads=2, depth=1, mlp_dim=32, image_size=(32, 48), patch_size=16, posemb="none")


def _sin_cos(**kw) -> tuple[np.ndarray, np.ndarray]:
    return rope.tables(ViTConfig(**BASE, **kw), (2, 3))


def test_dinov3_golden():
    sin, cos = _sin_cos(rope="dinov3", rope_temperature=100.0, rope_layout="half")
    assert np.allclose(sin[0, :4], [0, -0.309017, 0.866025, -0.406737], atol=1e-6)
    assert np.allclose(cos[0, :4], [-1, 0.951057, -0.5, 0.913545], atol=1e-6)
    assert np.allclose(sin[5, :4], [0, 0.309017, -0.866025, 0.406737], atol=1e-6)
    assert np.array_equal(sin[:, :4], sin[:, 4:])  # half layout: [theta, theta]
    np.testing.assert_array_equal(rope.dinov3_periods(8, 100.0), np.float32([1, 10]))


def test_cat_golden_ij_xy_offset_ref():
    sin, cos = _sin_cos(rope="cat")
    assert np.allclose(sin[5, ::2], [0.841471, 0.010000, 0.909297, 0.019999], atol=1e-6)
    assert np.allclose(cos[5, ::2], [0.540302, 0.999950, -0.416147, 0.999800], atol=1e-6)
    assert np.array_equal(sin[:, ::2], sin[:, 1::2])  # interleaved: pairs share an angle
    sin, _ = _sin_cos(rope="cat", rope_grid_indexing="xy", rope_grid_offset=1.0)
    assert np.allclose(sin[2, ::2], [0.141120, 0.029995, 0.841471, 0.010000], atol=1e-6)
    sin, _ = _sin_cos(rope="cat", rope_ref_grid=(4, 4))
    assert np.allclose(sin[4, ::2], [0.909297, 0.019999, 0.971938, 0.013333], atol=1e-6)


def test_mixed_positions_follow_indexing():
    xy = rope.mixed_positions(ViTConfig(**BASE, rope="mixed", rope_grid_indexing="xy"), (2, 3))
    ij = rope.mixed_positions(ViTConfig(**BASE, rope="mixed", rope_grid_indexing="ij"), (2, 3))
    np.testing.assert_array_equal(xy[:, 0], [0, 1, 2, 0, 1, 2])  # t_x = column
    np.testing.assert_array_equal(ij[:, 0], [0, 0, 0, 1, 1, 1])  # ij swaps


def test_existing_configs_unchanged():
    """The new fields' defaults change no existing config: golden parameter counts of DESIGN's table."""
    golden = {"Ti/16": 5_717_416, "S/16": 22_050_664, "B/16": 86_567_656, "L/16": 304_326_632}
    assert {n: ViTConfig.from_name(n).param_count() for n in golden} == golden
    cfg = ViTConfig.from_name("B/16")
    assert cfg.rope == "none" and cfg.k_bias and cfg.final_norm
    assert "rope_layout" in cfg.inert_fields() and "k_bias" not in cfg.inert_fields()


def test_timm_golden_param_counts():
    """timm's counts of the RoPE families (meta-device builds): DINOv3 S/16 and S/16 qkvb, EVA-02 T."""
    dinov3 = dict(rope="dinov3", rope_temperature=100.0, rope_layout="half", posemb="none", reg_tokens=4)
    dinov3 |= dict(layer_scale=1e-5, ln_eps=1e-5, num_classes=0, pool="gap")
    s16 = ViTConfig.from_name("S/16", **dinov3, qkv_bias=False)
    assert s16.param_count() == 21_586_944
    assert s16.replace(qkv_bias=True, k_bias=False).param_count() == 21_596_160


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(rope="cat", width=40, num_heads=4), "head_dim divisible by 4"),
        (dict(rope="mixed", rope_layout="half"), "rope='mixed'"),
        (dict(rope="dinov3", rope_ref_grid=(4, 4)), "rope_ref_grid"),
        (dict(rope="cat", rope_periods="stored"), "rope_periods='stored'"),
        (dict(rope="spiral"), "rope='spiral'"),
        (dict(rope="cat", rope_layout="diagonal"), "rope_layout='diagonal'"),
        (dict(final_norm=False, fc_norm=True), "final_norm"),
        (dict(pool="map", map_heads=3), "map_heads=3"),
    ],
)
def test_bad_rope_settings_are_refused_by_name(kw, words):
    with pytest.raises(ValueError) as e:
        ViTConfig(**{**BASE, **kw})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_stored_periods_checked():
    cfg = ViTConfig(**BASE, rope="dinov3", rope_periods="stored")
    rope.check_periods(cfg, np.float32([1, 10]))
    for bad in (np.float32([1, 10, 100]), np.float32([1, -10]), np.float32([1, np.nan])):
        with pytest.raises(ValueError, match="rope.periods"):
            rope.check_periods(cfg, bad)


def test_ref_grid_round_trips_through_json():
    cfg = ViTConfig(**BASE, rope="cat", rope_ref_grid=[16, 16])
    assert cfg.rope_ref_grid == (16, 16) and ViTConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.slow
@pytest.mark.parametrize("rope_kw", [{}, dict(rope="cat"), dict(rope="dinov3", rope_layout="half")])
def test_a_key_bias_gets_a_gradient_only_with_rope(rope_kw):
    """vit_common/tolerance.py's note: softmax ignores a bias added to every key, so without RoPE the key
    third of qkv.bias has a gradient that is zero but for rounding; RoPE rotates the bias by each key's
    position, so with it the gradient is as large as the query bias's (float64, torch twin)."""
    torch = pytest.importorskip("torch")
    from vit_common.state import random_state
    from vit_torch.weights import from_numpy

    cfg = ViTConfig(image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)
    cfg = cfg.replace(param_dtype="float64", dtype="float64", **({"posemb": "none"} | rope_kw if rope_kw else {}))
    model = from_numpy(cfg, {k: np.asarray(v, np.float64) for k, v in random_state(cfg, scale=0.5).items()})
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.nn.functional.cross_entropy(model(x), torch.arange(4)).backward()
    g = dict(model.named_parameters())["blocks.0.attn.qkv.bias"].grad.abs()
    ratio = (g[32:64].max() / g[:32].max()).item()  # key third over query third
    assert ratio < 1e-12 if not rope_kw else ratio > 0.1, ratio
