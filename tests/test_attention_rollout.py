"""vit_common.attention_maps: rollout against hand computations, maps as distributions, what each pooling shows."""

from __future__ import annotations

import numpy as np
import pytest

from vit_common.attention_maps import (
    attention_maps,
    fuse_heads,
    fused_rows,
    query_weights,
    rollout,
    split_tokens,
    upsample,
)
from vit_common.config import ViTConfig


def test_rollout_two_layers_by_hand():
    # Layer 1, heads h0 and h1 with mean A1 = [[0.6, 0.4], [0.2, 0.8]].
    # Â1 = 0.5 A1 + 0.5 I = [[0.8, 0.2], [0.1, 0.9]] (rows already sum to 1).
    a1 = np.array([[[[0.7, 0.3], [0.4, 0.6]], [[0.5, 0.5], [0.0, 1.0]]]])  # [B=1, N=2, L=2, L=2]
    # Layer 2, one head: A2 = [[0.5, 0.5], [1.0, 0.0]] -> Â2 = [[0.75, 0.25], [0.5, 0.5]].
    a2 = np.array([[[[0.5, 0.5], [1.0, 0.0]]]]).repeat(2, axis=1)
    # R = Â2 @ Â1 = [[0.75*0.8 + 0.25*0.1, 0.75*0.2 + 0.25*0.9], [0.5*0.8 + 0.5*0.1, 0.5*0.2 + 0.5*0.9]]
    #             = [[0.625, 0.375], [0.45, 0.55]].
    # (The other order, Â1 @ Â2, would give a first row [0.7, 0.3].)
    np.testing.assert_allclose(rollout([a1, a2])[0], [[0.625, 0.375], [0.45, 0.55]], rtol=0, atol=1e-15)


def test_rollout_max_fusion_renormalises_rows():
    # heads [[0.6, 0.4], [0.2, 0.8]] and [[0.2, 0.8], [0.6, 0.4]]: max = [[0.6, 0.8], [0.6, 0.8]];
    # 0.5 max + 0.5 I = [[0.8, 0.4], [0.3, 0.9]]; rows / [1.2, 1.2] = [[2/3, 1/3], [1/4, 3/4]].
    a = np.array([[[[0.6, 0.4], [0.2, 0.8]], [[0.2, 0.8], [0.6, 0.4]]]])
    np.testing.assert_allclose(rollout([a], head="max")[0], [[2 / 3, 1 / 3], [0.25, 0.75]], atol=1e-15)
    # a single head of the same layer: 0.5 h1 + 0.5 I = [[0.6, 0.4], [0.3, 0.7]]
    np.testing.assert_allclose(rollout([a], head=1)[0], [[0.6, 0.4], [0.3, 0.7]], atol=1e-15)
    # residual 0 is the plain product of the attention matrices
    np.testing.assert_allclose(rollout([a, a], residual=0.0)[0], fuse_heads(a)[0] @ fuse_heads(a)[0])


def _softmax_attn(rng, b: int, n: int, q: int, length: int) -> np.ndarray:
    logits = 3 * rng.standard_normal((b, n, q, length))
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _intermediates(cfg: ViTConfig, seed: int = 0, batch: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n, length = cfg.num_heads, cfg.seq_len
    out = {f"attn{i:02d}": _softmax_attn(rng, batch, n, length, length) for i in range(cfg.depth)}
    if cfg.pool == "map":
        out["attn_pool"] = _softmax_attn(rng, batch, cfg.num_heads, 1, cfg.seq_len)
    return out


CASES = {
    "token": dict(),
    "token+registers": dict(reg_tokens=4),
    "gap": dict(pool="gap", class_token=False),
    "map": dict(pool="map", class_token=False),
    "map+cls+registers": dict(pool="map", reg_tokens=2),
    "none": dict(pool="none", class_token=False),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("head", ["mean", "max", "min", 1])
def test_every_map_is_a_distribution(case, head, small_cfg):
    cfg = small_cfg.replace(**CASES[case])
    inter = _intermediates(cfg)
    m = attention_maps(cfg, inter, layers=[0, 1], head=head)
    assert m.raw.shape == (2, 2, cfg.num_heads, cfg.seq_len)
    assert m.rollout.shape == (2, cfg.seq_len)
    np.testing.assert_allclose(m.raw.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(m.rollout.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(rollout([inter["attn00"], inter["attn01"]], head).sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(fused_rows(m.raw, head).sum(-1), 1.0, atol=1e-12)
    assert (m.rollout >= 0).all() and (m.raw >= 0).all()
    if cfg.pool == "map":
        assert m.probe.shape == (2, cfg.num_heads, cfg.seq_len)
        np.testing.assert_allclose(m.probe.sum(-1), 1.0, atol=1e-12)
    else:
        assert m.probe is None
    sp = split_tokens(m.rollout, cfg)
    total = sp.patches.sum((-2, -1)) + sp.registers.sum(-1) + (sp.cls if sp.cls is not None else 0)
    np.testing.assert_allclose(total, 1.0, atol=1e-12)
    assert sp.patches.shape == (2, *cfg.grid) and sp.registers.shape == (2, cfg.reg_tokens)


def test_what_each_pooling_reads(small_cfg):
    # class token: raw map = row 0 of the block's attention; rollout = row 0 of R
    cfg = small_cfg.replace(reg_tokens=2)
    inter = _intermediates(cfg)
    m = attention_maps(cfg, inter)
    assert m.layers == (1,)
    np.testing.assert_array_equal(m.raw[:, 0], inter["attn01"][:, :, 0])
    r = rollout([inter["attn00"], inter["attn01"]])
    np.testing.assert_array_equal(m.rollout, r[:, 0])
    assert "class token" in m.shows["raw"] and "2 register tokens" in m.shows["prefix"]
    # gap: the mean of the patch rows (prefix rows excluded)
    cfg = small_cfg.replace(pool="gap", class_token=False, reg_tokens=1)
    inter = _intermediates(cfg)
    m = attention_maps(cfg, inter, layers=[0])
    np.testing.assert_allclose(m.raw[:, 0], inter["attn00"][:, :, 1:].mean(axis=2), atol=1e-15)
    assert "mean over all patch-token queries" in m.shows["raw"] and "pool='gap'" in m.shows["raw"]
    # map: the probe's rows as given; rollout = mean-fused probe @ R
    cfg = small_cfg.replace(pool="map", class_token=False)
    inter = _intermediates(cfg)
    m = attention_maps(cfg, inter)
    np.testing.assert_array_equal(m.probe, inter["attn_pool"][:, :, 0])
    r = rollout([inter["attn00"], inter["attn01"]])
    np.testing.assert_allclose(m.rollout, np.einsum("bm,bml->bl", inter["attn_pool"][:, :, 0].mean(1), r), atol=1e-15)
    assert "probe" in m.shows["probe"] and "probe" in m.shows["rollout"]


def test_query_weights_and_split(small_cfg):
    q, what = query_weights(small_cfg.replace(reg_tokens=2))
    np.testing.assert_array_equal(q, [1.0] + [0.0] * 18)
    assert "class token" in what
    q, _ = query_weights(small_cfg.replace(pool="gap", reg_tokens=2))  # class token present, not pooled
    np.testing.assert_array_equal(q, [0.0] * 3 + [1 / 16] * 16)
    q, what = query_weights(small_cfg.replace(pool="summary", summary_idxs=(0, 2), reg_tokens=2))  # RADIO
    np.testing.assert_array_equal(q, [0.5, 0.0, 0.5] + [0.0] * 16)
    assert "summary tokens" in what
    for pool in ("probe", "token_gap"):  # each pool has its description
        assert query_weights(small_cfg.replace(pool=pool))[1].startswith("the mean over all patch-token")
    cfg = small_cfg.replace(reg_tokens=2)
    sp = split_tokens(np.arange(19.0), cfg)
    assert sp.cls == 0.0
    np.testing.assert_array_equal(sp.registers, [1.0, 2.0])
    np.testing.assert_array_equal(sp.patches, np.arange(3.0, 19.0).reshape(4, 4))  # row-major grid


def test_upsample_bilinear():
    grid = np.array([[0.0, 1.0], [2.0, 3.0]])
    up = upsample(grid, (4, 4))
    # torch bilinear, align_corners=False, x2: output x = 0..3 samples input (x + 0.5) / 2 - 0.5, clamped
    np.testing.assert_allclose(up[0], [0.0, 0.25, 0.75, 1.0], atol=1e-15)
    np.testing.assert_allclose(up[:, 0], [0.0, 0.5, 1.5, 2.0], atol=1e-15)
    np.testing.assert_allclose(upsample(np.full((3, 2, 2), 0.25), (6, 10)), 0.25, atol=1e-15)


def test_bad_input_raises(small_cfg):
    cfg = small_cfg
    inter = _intermediates(cfg)
    with pytest.raises(ValueError, match="layers=\\[2\\]"):
        attention_maps(cfg, inter, layers=[2])
    with pytest.raises(ValueError, match="head='sum'"):
        attention_maps(cfg, inter, head="sum")
    with pytest.raises(ValueError, match="head=2"):
        fuse_heads(inter["attn00"], 2)
    with pytest.raises(ValueError, match="attn01"):
        attention_maps(cfg, {"attn00": inter["attn00"], "attn01": None})
    with pytest.raises(ValueError, match="attn_pool"):
        attention_maps(small_cfg.replace(pool="map"), inter)
    with pytest.raises(ValueError, match="17 tokens"):
        split_tokens(np.zeros(17), cfg.replace(reg_tokens=1))
    with pytest.raises(ValueError, match="at least one"):
        rollout([])
