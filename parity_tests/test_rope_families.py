"""The RoPE backbones (DINOv3, Perception Encoder, EVA-02, RoPE-ViT, timm's SBB RoPE ViTs) in both twins
against timm's own ``Eva`` models, built tiny in-process: tables, forwards at the native and a non-square
size, the DINOv3 periods choice, and the Eva state-dict names both ways."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

from vit_common import rope as rope_np
from vit_common.checkpoints.formats.timm_eva import canonical_to_eva, eva_to_canonical, layout_of
from vit_common.state import canonical_shapes, check_state, random_state
from vit_common.tolerance import compare
from vit_jax.weights import from_numpy as jax_from_numpy
from vit_torch.timm_eva import eva_config
from vit_torch.weights import from_numpy as torch_from_numpy
from vit_torch.weights import tensor_to_numpy

timm = pytest.importorskip("timm")

TINY = dict(embed_dim=64, depth=2, num_heads=4, num_classes=10)
# timm name -> (native image size, a non-square size): one per family and block layout. Each takes ~10 s
# (two JAX compilations a size), so the suite runs one per RoPE parameterisation and the rest are slow.
FAST = {
    "vit_base_patch16_dinov3_qkvb",
    "vit_pe_core_tiny_patch16_384",
    "eva02_base_patch14_224",
    "vit_base_patch16_rope_mixed_224",
}
FAMILIES = {
    "vit_base_patch16_dinov3": (64, (48, 80)),
    "vit_base_patch16_dinov3_qkvb": (64, (48, 80)),
    "vit_small_plus_patch16_dinov3": (64, (48, 80)),
    "vit_pe_core_tiny_patch16_384": (64, (48, 80)),
    "vit_pe_core_gigantic_patch14_448": (56, (42, 70)),
    "vit_pe_spatial_tiny_patch16_512": (64, (48, 80)),
    "eva02_tiny_patch14_224": (56, (42, 70)),
    "eva02_base_patch14_224": (56, (42, 70)),
    "eva02_large_patch14_clip_224": (56, (42, 70)),
    "vit_base_patch16_rope_224": (64, (48, 80)),
    "vit_base_patch16_rope_ape_224": (64, (48, 80)),
    "vit_base_patch16_rope_mixed_224": (64, (48, 80)),
    "vit_base_patch16_rope_mixed_ape_224": (64, (48, 80)),
    "vit_base_patch16_rope_reg1_gap_256": (64, (48, 80)),
}


def _timm(name: str, size: int, **kw) -> torch.nn.Module:
    """A tiny timm model with weights moved off timm's init (LayerScale 1e-5 would hide the attention)."""
    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False, img_size=size, dynamic_img_size=True, **TINY, **kw).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def _state(m: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: tensor_to_numpy(v) for k, v in m.state_dict().items()}


def _twins(cfg, state, images: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        t = torch_from_numpy(cfg, state)(images).numpy()
    j = jax_from_numpy(cfg, state)(jnp.asarray(images.permute(0, 2, 3, 1).numpy()))
    return t, np.asarray(j)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in FAMILIES])
def test_family_equals_timm_in_both_twins(name):
    native, other = FAMILIES[name]
    m = _timm(name, native)
    cfg = eva_config(m, name)
    sd = _state(m)
    state = eva_to_canonical(sd)
    check_state(canonical_shapes(cfg), state)
    back = canonical_to_eva(cfg, state, layout_of(sd))  # the file's own spelling, bit for bit
    assert set(back) == set(sd) and all(np.array_equal(back[k], sd[k]) for k in sd)
    for hw in ((native, native), other):
        images = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = m(images).numpy()
        for twin, out in zip(("torch", "jax"), _twins(cfg, state, images), strict=True):
            c = compare(f"{name} {hw} {twin}", out, ref, "tensor", "float32")
            assert c.ok, str(c)


GRIDS = ((2, 3), (14, 14), (5, 7))


@pytest.mark.slow
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize(
    "kind", ["dinov3", "dinov3_min", "cat_ij", "cat_xy_offset", "cat_ref", "cat_half", "mixed_xy", "mixed_ij"]
)
def test_tables_equal_timm(kind, grid):
    """Each parameterisation and layout, both twins' tables against timm's module: <= 1e-6 abs (float32)."""
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed

    from vit_common.config import ViTConfig
    from vit_jax.rope import RotaryEmbedding as JaxRope
    from vit_torch.rope import RotaryEmbedding as TorchRope

    hd, base = 16, dict(width=32, num_heads=2, depth=2, image_size=32, patch_size=16, posemb="none")
    if kind.startswith("dinov3"):
        norm = "min" if kind == "dinov3_min" else "separate"
        cfg = ViTConfig(**base, rope="dinov3", rope_temperature=100.0, rope_layout="half", rope_normalize=norm)
        ref = RotaryEmbeddingDinoV3(hd, temperature=100, normalize_coords=norm).get_embed(grid)
    elif kind.startswith("cat"):
        kw = {
            "cat_ij": {},
            "cat_xy_offset": dict(rope_grid_indexing="xy", rope_grid_offset=1.0),
            "cat_ref": dict(rope_ref_grid=(4, 4)),
            "cat_half": dict(rope_layout="half"),
        }[kind]
        cfg = ViTConfig(**base, rope="cat", **kw)
        ref = RotaryEmbeddingCat(
            hd,
            temperature=cfg.rope_temperature,
            in_pixels=False,
            feat_shape=list(grid),
            grid_offset=cfg.rope_grid_offset,
            grid_indexing=cfg.rope_grid_indexing,
            ref_feat_shape=cfg.rope_ref_grid,
            rotate_half=cfg.rope_layout == "half",
        ).get_embed()
    else:
        indexing = kind[-2:]
        cfg = ViTConfig(**base, rope="mixed", rope_grid_indexing=indexing)
        module = RotaryEmbeddingMixed(hd * 2, depth=2, num_heads=2, feat_shape=list(grid), grid_indexing=indexing)
        torch.manual_seed(0)
        with torch.no_grad():
            module.freqs.normal_()
        ref = module.get_embed()  # [depth, N, Np, 2 hd]
        state = {"freqs": tensor_to_numpy(module.freqs)}
    ref = ref.detach().numpy()
    sin_ref, cos_ref = ref[..., :hd], ref[..., hd:]  # timm: [sin | cos]
    tm, jm = TorchRope(cfg), JaxRope(cfg)
    if cfg.rope == "mixed":
        tm.freqs.data = torch.as_tensor(state["freqs"])
        jm.freqs.set_value(jnp.asarray(state["freqs"]))
    with torch.no_grad():
        sin_t, cos_t = (t.numpy() for t in tm(grid, torch.device("cpu")))
    sin_j, cos_j = (np.asarray(t) for t in jm(grid))
    for got in (sin_t, sin_j):
        assert np.abs(got - sin_ref).max() <= 1e-6
    for got in (cos_t, cos_j):
        assert np.abs(got - cos_ref).max() <= 1e-6


@pytest.mark.slow
def test_dinov3_periods_choice_stored_or_computed():
    """Meta's DINOv3 files hold the periods rounded to bfloat16; timm and transformers recompute them in
    float32. With peaked attention (weights N(0, 0.25)) the two choices differ visibly: the twins follow
    the file's periods in 'stored' mode (timm given those periods: Meta's numbers) and timm in 'computed'."""
    m = timm.create_model(
        "vit_base_patch16_dinov3",
        pretrained=False,
        embed_dim=64,
        depth=1,
        num_heads=1,
        img_size=224,
        num_classes=0,
        global_pool="",  # every token (pool 'none'): averaging would hide part of the difference
    ).eval()
    computed = eva_config(m)
    stored = computed.replace(rope_periods="stored")
    state = random_state(stored, scale=0.5)
    bf16 = state["rope.periods"].astype(ml_dtypes.bfloat16).astype(np.float32)
    state["rope.periods"] = bf16
    assert not np.array_equal(bf16, rope_np.dinov3_periods(64, 100.0))
    plain = {k: v for k, v in state.items() if k != "rope.periods"}
    sd = canonical_to_eva(computed, plain, layout_of(m.state_dict()))
    m.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in sd.items()}, strict=True)
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        timm_numbers = m(images).numpy()
        m.rope.periods.copy_(torch.as_tensor(bf16))
        meta_numbers = m(images).numpy()
    gap = compare("bf16 vs float32 periods", meta_numbers, timm_numbers, "tensor", "float32")
    assert gap.rel >= 100 * gap.bound, str(gap)  # measured 4.0e-3
    for cfg, st, ref in ((stored, state, meta_numbers), (computed, plain, timm_numbers)):
        for twin, out in zip(("torch", "jax"), _twins(cfg, st, images), strict=True):
            c = compare(f"{cfg.rope_periods} {twin}", out, ref, "tensor", "float32")
            assert c.ok, str(c)


@pytest.mark.slow
def test_attention_maps_of_a_rope_model_agree_across_twins():
    """The explicit path rotates as the fused one: same logits, and probabilities [B, N, L, L] equal."""
    m = _timm("eva02_tiny_patch14_224", 56)
    cfg = eva_config(m)
    state = eva_to_canonical(_state(m))
    images = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        lt, ot = torch_from_numpy(cfg, state).forward_intermediates(images)
    lj, oj = jax_from_numpy(cfg, state).forward_intermediates(jnp.asarray(images.permute(0, 2, 3, 1).numpy()))
    assert compare("logits", np.asarray(lj), lt.numpy(), "tensor", "float32").ok
    for i in range(cfg.depth):
        c = compare(f"attn{i:02d}", np.asarray(oj[f"attn{i:02d}"]), ot[f"attn{i:02d}"].numpy(), "attention", "float32")
        assert c.ok, str(c)
    with torch.no_grad():
        fused = torch_from_numpy(cfg, state)(images).numpy()
    assert compare("fused vs explicit", fused, lt.numpy(), "tensor", "float32").ok


FLOAT64_CASES = {
    "dinov3_qv_bias_registers": dict(
        rope="dinov3", rope_layout="half", rope_temperature=100.0, reg_tokens=2, posemb="none", k_bias=False
    ),
    "dinov3_stored_max": dict(
        rope="dinov3", rope_periods="stored", rope_normalize="max", posemb="none", layer_scale=1.0
    ),
    "pe_map_xy_offset_ref": dict(rope="cat", rope_grid_indexing="xy", rope_grid_offset=1.0, rope_ref_grid=(3, 3))
    | dict(norm_pre=True, patch_bias=False, pool="map", pool_include_prefix=True, map_heads=4, map_mlp_dim=48),
    "eva_swiglu_inner_norms": dict(rope="cat", rope_ref_grid=(16, 16), mlp_type="swiglu", mlp_inner_norm=True)
    | dict(attn_inner_norm=True, k_bias=False, pool="gap", fc_norm=True),
    "mixed_ij": dict(rope="mixed", posemb="none", rope_grid_indexing="ij", mlp_inner_norm=True),
    "cat_half_no_final_norm": dict(rope="cat", final_norm=False, pool="gap", rope_layout="half"),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [c if c == "pe_map_xy_offset_ref" else pytest.param(c, marks=pytest.mark.slow) for c in FLOAT64_CASES]
)
def test_twins_agree_in_float64_on_every_rope_setting(case, x64):
    """Both settings of every new numerics choice, twin against twin in float64 (<= 1e-10 relative), at
    the config's size and another; the parameter count equals the tensors'."""
    from vit_common.config import ViTConfig

    base = dict(image_size=(32, 48), patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)
    base |= dict(dtype="float64", param_dtype="float64", dynamic_img_size=True)
    rng = np.random.default_rng(1)
    cfg = ViTConfig(**base, **FLOAT64_CASES[case])
    state = random_state(cfg, scale=0.3, dtype=np.float64)
    assert cfg.param_count() == sum(v.size for k, v in state.items() if k != "rope.periods")
    for hw in ((32, 48), (40, 24)):
        images = torch.as_tensor(rng.standard_normal((2, 3, *hw)))
        t, j = _twins(cfg, state, images)
        c = compare(case, j, t, "tensor", "float64")
        assert c.ok, str(c)
    assert jax.config.jax_enable_x64


@pytest.mark.parametrize(
    "name, size",
    [
        ("vit_base_patch16_dinov3", 64),
        ("vit_base_patch16_rope_224", 64),
        ("vit_pe_core_tiny_patch16_384", 64),
        ("vit_base_patch16_rope_mixed_224", 64),
    ],
)
def test_bare_timm_rope_state_dict_is_refused_not_misread(name, size, tmp_path):
    """A timm RoPE model's bare state_dict holds none of its rotary settings: once it was read as a ViT
    without position information (DINOv3, RoPE-ViT) or without RoPE (PE); now it is refused, naming how
    to load it."""
    from safetensors.torch import save_file

    from vit_common.checkpoints.convert import load_checkpoint

    m = timm.create_model(name, pretrained=False, img_size=size, embed_dim=64, depth=1, num_heads=4, num_classes=10)
    path = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, path)
    with pytest.raises(ValueError, match="rotary|RoPE") as e:
        load_checkpoint(path)
    assert "hub folder" in str(e.value) or "rope.freqs" in str(e.value)
