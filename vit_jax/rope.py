"""Rotary position embeddings in the JAX twin: the tables of ``vit_common.rope`` and the rotation.

The PyTorch twin is ``vit_torch/rope.py``: the same class and function names, the same numbers. Shape
alphabet as ``vit_jax/model.py``; Np patch tokens, hd head dim.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_common import rope as rope_np
from vit_common.config import ViTConfig


class RopePeriods(nnx.Variable):
    """A checkpoint's DINOv3 periods [hd/4] (rope_periods='stored'): state the model holds and the
    canonical state names ``rope.periods``, never trained (Meta's persistent buffer)."""


class RotaryEmbedding(nnx.Module):
    """The sin/cos tables of cfg.rope for a patch grid: ``rope(grid)`` -> (sin, cos), each [Np, hd]
    (``dinov3``, ``cat``) or [depth, N, Np, hd] (``mixed``), in at least float32.

    ``freqs`` [2, depth, N, hd/2] (``mixed``: learned, x then y) is a parameter; ``periods`` [hd/4]
    (``dinov3`` with rope_periods='stored') a ``RopePeriods`` variable. Tables of fixed
    parameterisations are numpy constants (float64, cast here); learned or stored ones are computed in
    the traced function in float32 (or float64 for a float64 model), as timm does.
    """

    def __init__(self, cfg: ViTConfig):
        self.cfg = cfg
        pd = jnp.dtype(cfg.param_dtype)
        self.freqs = (
            nnx.Param(jnp.asarray(rope_np.mixed_init(cfg, np.random.default_rng(0)), pd))
            if cfg.rope == "mixed"
            else None
        )
        stored = cfg.rope == "dinov3" and cfg.rope_periods == "stored"
        self.periods = (
            RopePeriods(jnp.asarray(rope_np.dinov3_periods(cfg.head_dim, cfg.rope_temperature), pd)) if stored else None
        )

    def __call__(self, grid: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
        cfg = self.cfg
        acc = jnp.promote_types(cfg.dtype, jnp.float32)
        pos = jnp.asarray(rope_np.coords(cfg, grid), acc)  # [Np, 2]
        if self.freqs is not None:  # theta[l, n, h] = t_x fx[l, h] + t_y fy[l, h]
            f = self.freqs[...].astype(acc)
            theta = pos[:, 0, None, None, None] * f[0] + pos[:, 1, None, None, None] * f[1]
            theta = theta.transpose(1, 2, 0, 3)  # [Np, depth, N, hd/2] -> [depth, N, Np, hd/2]
        elif self.periods is not None:  # theta = 2 pi c / P, axis-major: [Np, 2, hd/4] -> [Np, hd/2]
            theta = (2 * math.pi * pos[:, :, None] / self.periods[...].astype(acc)).reshape(pos.shape[0], -1)
        else:
            sin, cos = rope_np.tables(cfg, grid)
            return jnp.asarray(sin, acc), jnp.asarray(cos, acc)
        if cfg.rope_layout == "interleaved":
            theta = jnp.repeat(theta, 2, axis=-1)
        else:
            theta = jnp.concatenate([theta, theta], axis=-1)
        return jnp.sin(theta), jnp.cos(theta)


def rotate(x: jax.Array, layout: str) -> jax.Array:
    """The layout's pair swap of the last axis: interleaved [-x1, x0, -x3, x2, ...], half [-x_b, x_a]."""
    if layout == "interleaved":
        return jnp.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    a, b = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-b, a], axis=-1)


def apply_rope(x: jax.Array, sin: jax.Array, cos: jax.Array, num_prefix_tokens: int, layout: str) -> jax.Array:
    """Rotate the patch tokens of q or k, x [B, L, N, hd]; tables [Np, hd] or per head [N, Np, hd]; the
    first ``num_prefix_tokens`` tokens pass unchanged. Computed in the tables' dtype, cast back to x's."""
    if sin.ndim == 3:  # [N, Np, hd] -> [Np, N, hd]
        sin, cos = sin.transpose(1, 0, 2), cos.transpose(1, 0, 2)
    else:  # [Np, hd] -> [Np, 1, hd]
        sin, cos = sin[:, None], cos[:, None]
    prefix, patches = x[:, :num_prefix_tokens], x[:, num_prefix_tokens:].astype(sin.dtype)  # [B, Np, N, hd]
    rotated = patches * cos + rotate(patches, layout) * sin
    return jnp.concatenate([prefix, rotated.astype(x.dtype)], axis=1)
