"""What the Hugging Face and timm model families need beyond a plain ViT, against the library that defines
each piece: the gated (SwiGLU) MLP against timm's ``SwiGLUPacked`` ViT and transformers'
``Dinov2SwiGLUFFN``, DINOv2's [class token, mean of patches] classifier input, CLIP's bias-free
projection head. Tiny random models (width 32, depth 2), float32 bounds from vit_common.tolerance.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from timm.layers import LayerNorm, SwiGLUPacked
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vit_jax
import vit_torch
from vit_common.checkpoints.formats.timm_state import timm_load_call
from vit_common.state import canonical_shapes
from vit_common.tolerance import compare
from vit_torch.oracles import timm_model
from vit_torch.weights import tensor_to_numpy


def _perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``model`` with every parameter moved off its init (norms around 1, the rest by 0.05 N(0, 1))."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.1 if "norm" in name else 0.05))
    return model.eval()


def _twin_logits(cfg, state, x_nchw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    jm, tm = vit_jax.from_numpy(cfg, state), vit_torch.from_numpy(cfg, state)
    with torch.no_grad():
        lt = tm(torch.from_numpy(x_nchw)).numpy()
    return np.asarray(jm(jnp.asarray(x_nchw.transpose(0, 2, 3, 1)))), lt


def _timm_swiglu(small_cfg, f: int) -> TimmViT:
    """timm's ViT with ``vit_giant_patch14_dinov2``'s MLP (SwiGLUPacked, SiLU) at test size."""
    torch.manual_seed(0)
    d = small_cfg.width
    model = TimmViT(
        img_size=small_cfg.image_size,
        patch_size=small_cfg.patch_size,
        num_classes=small_cfg.num_classes,
        embed_dim=d,
        depth=small_cfg.depth,
        num_heads=small_cfg.num_heads,
        mlp_ratio=2 * f / d,  # timm's SwiGLUPacked width is the packed fc1's: 2F
        mlp_layer=SwiGLUPacked,
        act_layer=torch.nn.SiLU,
        init_values=1e-5,
        norm_layer=partial(LayerNorm, eps=small_cfg.ln_eps),
    )
    return _perturbed(model)


@pytest.mark.slow
def test_swiglu_equals_timm_swiglu_packed_in_both_twins(small_cfg):
    """timm's SwiGLUPacked ViT (gate rows first in mlp.fc1) is our mlp_type='swiglu' tensor for tensor:
    its state_dict is the canonical state, and both twins give its logits within 1e-5 relative; the
    same weights with the gate rows last give other logits (the order is not a free choice)."""
    f = 40
    cfg = small_cfg.replace(mlp_type="swiglu", mlp_dim=f, layer_scale=1e-5)
    reference = _timm_swiglu(small_cfg, f)
    state = {k: tensor_to_numpy(v) for k, v in reference.state_dict().items()}
    assert {k: v.shape for k, v in state.items()} == canonical_shapes(cfg)
    assert cfg.param_count() == sum(p.numel() for p in reference.parameters())
    x = np.random.default_rng(0).standard_normal((2, 3, *cfg.image_size)).astype(np.float32)
    with torch.no_grad():
        ref = reference(torch.from_numpy(x)).numpy()
    lj, lt = _twin_logits(cfg, state, x)
    assert compare("jax logits", lj, ref, "tensor", "float32").ok
    assert compare("torch logits", lt, ref, "tensor", "float32").ok
    swapped = {
        k: np.concatenate([v[f:], v[:f]]) if k.endswith("mlp.fc1.weight") or k.endswith("mlp.fc1.bias") else v
        for k, v in state.items()
    }
    _, lt_swapped = _twin_logits(cfg, swapped, x)
    assert not compare("gate last", lt_swapped, ref, "tensor", "float32").ok
    rebuilt = timm_model(cfg, state)  # timm_kwargs: mlp_layer=SwiGLUPacked, act_layer='silu', loaded strictly
    with torch.no_grad():
        assert np.array_equal(rebuilt(torch.from_numpy(x)).numpy(), ref)
    assert "mlp_layer=SwiGLUPacked" in timm_load_call("m.safetensors", cfg)


@pytest.mark.slow
def test_swiglu_equals_transformers_dinov2_swiglu_ffn(small_cfg):
    """transformers' Dinov2SwiGLUFFN (gate_proj, up_proj, down_proj) is our GluMlp with
    fc1 = [gate_proj; up_proj], fc2 = down_proj, in both twins; its hidden width is DINOv2's rounding
    (int(D * mlp_ratio * 2 / 3) + 7) // 8 * 8."""
    from transformers import Dinov2Config
    from transformers.models.dinov2.modeling_dinov2 import Dinov2SwiGLUFFN

    from vit_jax.model import GluMlp as JaxGluMlp
    from vit_torch.model import GluMlp as TorchGluMlp

    torch.manual_seed(0)
    hf = _perturbed(Dinov2SwiGLUFFN(Dinov2Config(hidden_size=32, mlp_ratio=4, use_swiglu_ffn=True)))
    f = hf.gate_proj.out_features
    assert f == (int(32 * 4 * 2 / 3) + 7) // 8 * 8 == 88
    cfg = small_cfg.replace(mlp_type="swiglu", mlp_dim=f)
    fc1_w = torch.cat([hf.gate_proj.weight, hf.up_proj.weight]).detach()
    fc1_b = torch.cat([hf.gate_proj.bias, hf.up_proj.bias]).detach()
    x = np.random.default_rng(1).standard_normal((2, 5, 32)).astype(np.float32)
    with torch.no_grad():
        ref = hf(torch.from_numpy(x)).numpy()
        tm = TorchGluMlp(cfg)
        tm.load_state_dict(
            {"fc1.weight": fc1_w, "fc1.bias": fc1_b, "fc2.weight": hf.down_proj.weight, "fc2.bias": hf.down_proj.bias}
        )
        out_t = tm(torch.from_numpy(x)).numpy()
    from flax import nnx

    jm = JaxGluMlp(cfg, rngs=nnx.Rngs(0))
    jm.fc1.kernel[...] = jnp.asarray(fc1_w.numpy().T)
    jm.fc1.bias[...] = jnp.asarray(fc1_b.numpy())
    jm.fc2.kernel[...] = jnp.asarray(hf.down_proj.weight.detach().numpy().T)
    jm.fc2.bias[...] = jnp.asarray(hf.down_proj.bias.detach().numpy())
    out_j = np.asarray(jm(jnp.asarray(x)))
    assert compare("torch GluMlp", out_t, ref, "tensor", "float32").ok
    assert compare("jax GluMlp", out_j, ref, "tensor", "float32").ok


@pytest.mark.slow
@pytest.mark.parametrize("reg_tokens", [0, 3])
def test_token_gap_is_the_class_token_then_the_mean_of_the_patches(reg_tokens, small_cfg):
    """pool='token_gap' (HF Dinov2ForImageClassification / Dinov2WithRegistersForImageClassification):
    pre-logits [B, 2D] = concat(norm[:, 0], norm[:, 1 + registers:].mean(1)) in both twins, and the head
    reads 2D features; with the class token's half alone the logits differ."""
    from parity_tests.test_twins import init_state, run_both

    cfg = small_cfg.replace(pool="token_gap", reg_tokens=reg_tokens, layer_scale=0.1)
    assert canonical_shapes(cfg)["head.weight"] == (cfg.num_classes, 2 * cfg.width)
    state = init_state("torch", cfg)
    x = np.random.default_rng(2).standard_normal((2, 3, *cfg.image_size)).astype(np.float32)
    out_j, out_t = run_both(vit_jax.from_numpy(cfg, state), vit_torch.from_numpy(cfg, state), x)
    for out in (out_j, out_t):
        norm = out["norm"]
        expected = np.concatenate([norm[:, 0], norm[:, 1 + reg_tokens :].mean(1)], axis=-1)
        assert compare("pre_logits", out["pre_logits"], expected, "tensor", "float32").ok
        logits = expected @ state["head.weight"].T.astype(np.float64) + state["head.bias"]
        assert compare("logits", out["logits"], logits, "tensor", "float32").ok
        assert not compare(
            "class half", out["logits"], norm[:, 0] @ state["head.weight"][:, : cfg.width].T, "tensor", "float32"
        ).ok


def test_clip_projection_head_has_no_bias(small_cfg):
    """head_bias=False (CLIP's visual_projection): the head is weight-only in the canonical state and in
    both twins, and its logits are pre_logits @ W^T exactly as transformers' bias-free nn.Linear."""
    from parity_tests.test_twins import init_state, run_both

    cfg = small_cfg.replace(norm_pre=True, patch_bias=False, gelu="quick", head_bias=False, ln_eps=1e-5)
    assert "head.bias" not in canonical_shapes(cfg) and "head.weight" in canonical_shapes(cfg)
    state = init_state("torch", cfg)
    x = np.random.default_rng(3).standard_normal((2, 3, *cfg.image_size)).astype(np.float32)
    proj = torch.nn.Linear(cfg.width, cfg.num_classes, bias=False)
    proj.weight.data = torch.from_numpy(state["head.weight"])
    out_j, out_t = run_both(vit_jax.from_numpy(cfg, state), vit_torch.from_numpy(cfg, state), x)
    for out in (out_j, out_t):
        with torch.no_grad():
            ref = proj(torch.from_numpy(out["pre_logits"].astype(np.float32))).numpy()
        assert compare("projection", out["logits"], ref, "tensor", "float32").ok
