"""Helpers to build the two twins from one canonical state and run them side by side."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

import vit_jax
import vit_torch
from vit_common.config import ViTConfig
from vit_common.tolerance import Comparison, compare

TWINS = ("jax", "torch")


def init_state(twin: str, cfg: ViTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Initialise ``twin`` and return its canonical state with every tensor randomised.

    Fresh LayerNorm weights are 1 and biases 0, which would hide swapped or untransposed tensors, so
    every tensor is perturbed around its init (norm weights 1 + 0.1 N(0,1), the rest + 0.02 N(0,1)).
    """
    if twin == "jax":
        state = vit_jax.to_numpy(vit_jax.VisionTransformer(cfg, rngs=nnx.Rngs(seed)))
    else:
        torch.manual_seed(seed)
        state = vit_torch.to_numpy(vit_torch.VisionTransformer(cfg))
    rng = np.random.default_rng(seed + 1)
    return {
        k: (v + (0.1 if v.ndim == 1 and "norm" in k else 0.02) * rng.standard_normal(v.shape)).astype(v.dtype)
        for k, v in state.items()
    }


def convert(src: str, cfg: ViTConfig, state: dict[str, np.ndarray]):
    """Build twin ``src`` from ``state`` (cast to cfg.param_dtype), then the other twin from its to_numpy.

    Returns (jax model, torch model), both in eval mode.
    """
    if src == "jax":
        jm = vit_jax.from_numpy(cfg, state)
        tm = vit_torch.from_numpy(cfg, vit_jax.to_numpy(jm))
    else:
        tm = vit_torch.from_numpy(cfg, state)
        jm = vit_jax.from_numpy(cfg, vit_torch.to_numpy(tm))
    return jm, tm


def images(cfg: ViTConfig, batch: int = 2, hw: tuple[int, int] | None = None, seed: int = 0) -> np.ndarray:
    """Deterministic standard-normal images [B, C, H, W] in cfg.dtype's float width (bf16 -> float32)."""
    h, w = hw or cfg.image_size
    dt = np.float64 if cfg.dtype == "float64" else np.float32
    return np.random.default_rng(seed).standard_normal((batch, cfg.in_chans, h, w)).astype(dt)


def run_both(jm, tm, x_nchw: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """forward_intermediates of both twins on the same images, as float64-able numpy dicts."""
    _, out_j = jm.forward_intermediates(jnp.asarray(x_nchw.transpose(0, 2, 3, 1)))
    with torch.no_grad():
        _, out_t = tm.forward_intermediates(torch.from_numpy(x_nchw))
    to_np = lambda v: np.asarray(jax.device_get(v)).astype(np.float64)  # noqa: E731
    return (
        {k: to_np(v) for k, v in out_j.items()},
        {k: v.detach().to(torch.float64).numpy() for k, v in out_t.items()},
    )


def compare_outputs(out_a: dict, out_b: dict, dtype: str) -> list[Comparison]:
    """Compare every intermediate (attention maps with the attention bound) under the table."""
    assert out_a.keys() == out_b.keys(), (sorted(out_a), sorted(out_b))
    return [compare(k, out_a[k], out_b[k], "attention" if k.startswith("attn") else "tensor", dtype) for k in out_b]
