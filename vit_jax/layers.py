"""The JAX twin's building blocks: dtypes, Linear, the norms (LayerNorm, RMSNorm), dropout with given
masks, LayerScale, stochastic depth and the masked pools of NaFlex batches, in Flax NNX; the PyTorch
twin's are in ``vit_torch/layers.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vit_common.config import ViTConfig
from vit_jax.platforms import Platform

trunc02 = nnx.initializers.truncated_normal(stddev=0.02)


def dtypes(cfg: ViTConfig) -> dict:
    return dict(dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype))


def acc_dtype(dtype) -> jnp.dtype:
    """Accumulation dtype for softmax and norm statistics: at least float32."""
    return jnp.promote_types(dtype, jnp.float32)


def norm_layer(cfg: ViTConfig, dim: int, rngs: nnx.Rngs) -> nnx.LayerNorm | nnx.RMSNorm:
    """The norm of kind cfg.norm over the last ``dim`` channels, eps cfg.ln_eps; statistics in at least
    float32 (flax's reductions), parameter ``scale`` (the torch twin's ``weight``)."""
    # use_fast_variance=False: flax's default E[x^2]-E[x]^2 differs from torch's two-pass variance.
    kind = nnx.RMSNorm if cfg.norm == "rmsnorm" else nnx.LayerNorm
    return kind(dim, epsilon=cfg.ln_eps, use_fast_variance=False, rngs=rngs, **dtypes(cfg))


def linear_layer(cfg: ViTConfig, d_in: int, d_out: int, rngs: nnx.Rngs, bias: bool = True) -> nnx.Linear:
    linear = Platform.current().linear  # nnx.Linear, or FlatLinear on CPU: the same parameters
    return linear(d_in, d_out, use_bias=bias, kernel_init=trunc02, rngs=rngs, **dtypes(cfg))


def dropout_layer(rate: float, rngs: nnx.Rngs) -> nnx.Dropout:
    # Only a live dropout holds an RNG stream, so rate-0 models carry no RNG state.
    return nnx.Dropout(rate, rngs=rngs if rate > 0 else None)


def sub_masks(masks: dict | None, prefix: str) -> dict | None:
    """The entries of a flat ``dropout_masks`` dict under module path ``prefix``, the prefix removed."""
    if masks is None:
        return None
    return {k[len(prefix) + 1 :]: v for k, v in masks.items() if k.startswith(prefix + ".")}


def masked_drop(drop: nnx.Dropout, x: jax.Array, masks: dict | None, name: str) -> jax.Array:
    """``drop(x)``; in training with ``masks`` (the parity mode) the keep mask ``masks[name]`` (x's shape,
    1 keep, 0 drop) instead of a draw, with nnx.Dropout's scaling: kept values / (1 - rate).

    Raises:
        KeyError: a live dropout whose mask ``masks`` lacks.
    """
    if masks is None or drop.rate == 0 or drop.deterministic:
        return drop(x)
    return jnp.where(masks[name] > 0, x / (1.0 - drop.rate), jnp.zeros_like(x))


class LayerScale(nnx.Module):
    """Per-channel scale ``gamma`` [D] initialised to cfg.layer_scale (Touvron et al. 2021, CaiT)."""

    def __init__(self, cfg: ViTConfig):
        pd = jnp.dtype(cfg.param_dtype)
        self.gamma = nnx.Param(jnp.full((cfg.width,), cfg.layer_scale, pd))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.gamma[...].astype(x.dtype)


class DropPath(nnx.Module):
    """Stochastic depth: zero a sample's residual branch with probability ``rate`` in training."""

    def __init__(self, rate: float, *, rngs: nnx.Rngs):
        self.rate = rate
        self.deterministic = False
        self.rngs = rngs["dropout"].fork() if rate > 0 else None

    def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """x [B, ...]; ``mask`` [B] (1 keep, 0 drop) given from outside (the twins' parity mode), else drawn."""
        if self.rate == 0 or self.deterministic:
            return x
        keep = 1.0 - self.rate
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        mask = jax.random.bernoulli(self.rngs(), keep, shape) if mask is None else mask.reshape(shape) > 0
        return jnp.where(mask, x / keep, jnp.zeros_like(x))


def masked_mean(x: jax.Array, keep: jax.Array | None) -> jax.Array:
    """Mean over the tokens [B, L', D] -> [B, D]; with ``keep`` [B, L'] bool, over the kept ones only."""
    if keep is None:
        return x.mean(axis=1)
    k = keep[..., None].astype(x.dtype)
    return (x * k).sum(axis=1) / k.sum(axis=1)


def masked_max(x: jax.Array, keep: jax.Array | None) -> jax.Array:
    """Per-channel max over the tokens [B, L', D] -> [B, D]; with ``keep`` [B, L'], over the kept ones only.

    Taken at ``argmax``, so the gradient goes to that token. JAX's own rule for ``max`` divides by the
    count of tokens equal to the result, which is 0 (a NaN gradient) where XLA rounds the tokens in
    two fusions differently (seen on CPU at ``--xla_backend_optimization_level=0``)."""
    y = x if keep is None else jnp.where(keep[..., None], x, -jnp.inf)
    return jnp.take_along_axis(y, jnp.argmax(y, axis=1)[:, None], axis=1)[:, 0]


def condition_input(cfg: ViTConfig, x: jax.Array, flat: bool) -> jax.Array:
    """RADIO's input conditioner (transformers ``RadioInputConditioner``): images [B, H, W, C], or with
    ``flat`` NaFlex patches [B, N, P*P*C] (channels last), normalised per channel with cfg.input_mean and
    cfg.input_std in float32 and returned in x's dtype; x itself where the config has no normalisation."""
    if cfg.input_mean is None:
        return x
    mean, std = (jnp.asarray(v, jnp.float32) for v in (cfg.input_mean, cfg.input_std))
    y = x.astype(jnp.float32)
    if flat:
        return ((y.reshape(*x.shape[:-1], -1, cfg.in_chans) - mean) / std).reshape(x.shape).astype(x.dtype)
    return ((y - mean) / std).astype(x.dtype)
