"""The PyTorch twin's building blocks: dtypes, Linear, the norms (LayerNorm, RMSNorm), dropout with given
masks, LayerScale, stochastic depth and the masked pools of NaFlex batches. Each computes in ``dtype``
whatever ``param_dtype`` is (flax's semantics); the JAX twin's are in ``vit_jax/layers.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vit_common.config import ViTConfig


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for softmax and norm statistics: at least float32."""
    return torch.promote_types(dtype, torch.float32)


class Linear(nn.Linear):
    """nn.Linear that computes in ``dtype``; parameters stay in ``param_dtype``.

    Initialised as timm: weight trunc-normal(std 0.02), bias zero.
    """

    def __init__(self, d_in: int, d_out: int, bias: bool = True, *, dtype: str, param_dtype: str):
        super().__init__(d_in, d_out, bias=bias, dtype=torch_dtype(param_dtype))
        self.compute_dtype = torch_dtype(dtype)
        if not self.weight.is_meta:
            nn.init.trunc_normal_(self.weight, std=0.02)
            if self.bias is not None:
                nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cd = self.compute_dtype
        return F.linear(x.to(cd), self.weight.to(cd), None if self.bias is None else self.bias.to(cd))


class LayerNorm(nn.LayerNorm):
    """LayerNorm with statistics in at least float32 and output in ``dtype``; eps always explicit."""

    def __init__(self, dim: int, *, eps: float, dtype: str, param_dtype: str):
        super().__init__(dim, eps=eps, dtype=torch_dtype(param_dtype))
        self.compute_dtype = torch_dtype(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = acc_dtype(self.compute_dtype)
        y = F.layer_norm(x.to(acc), self.normalized_shape, self.weight.to(acc), self.bias.to(acc), self.eps)
        return y.to(self.compute_dtype)


class RMSNorm(nn.Module):
    """RMSNorm (cfg.norm='rmsnorm'): x / sqrt(mean(x^2) + eps) * weight, no bias, statistics in at least
    float32 and output in ``dtype`` (timm ``RmsNorm``, HF ``Aimv2RMSNorm``: equal in float32)."""

    def __init__(self, dim: int, *, eps: float, dtype: str, param_dtype: str):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch_dtype(param_dtype)))
        self.eps, self.compute_dtype = eps, torch_dtype(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = acc_dtype(self.compute_dtype)
        return F.rms_norm(x.to(acc), self.weight.shape, self.weight.to(acc), self.eps).to(self.compute_dtype)


def norm_layer(cfg: ViTConfig, dim: int) -> LayerNorm | RMSNorm:
    """The norm of kind cfg.norm over the last ``dim`` channels, eps cfg.ln_eps."""
    kind = RMSNorm if cfg.norm == "rmsnorm" else LayerNorm
    return kind(dim, eps=cfg.ln_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype)


def sub_masks(masks: dict | None, prefix: str) -> dict | None:
    """The entries of a flat ``dropout_masks`` dict under module path ``prefix``, the prefix removed."""
    if masks is None:
        return None
    return {k[len(prefix) + 1 :]: v for k, v in masks.items() if k.startswith(prefix + ".")}


def masked_drop(drop: nn.Dropout, x: torch.Tensor, masks: dict | None, name: str) -> torch.Tensor:
    """``drop(x)``; in training with ``masks`` (the parity mode) the keep mask ``masks[name]`` (x's shape,
    1 keep, 0 drop) instead of a draw, with nn.Dropout's scaling: kept values / (1 - p).

    Raises:
        KeyError: a live dropout whose mask ``masks`` lacks.
    """
    if masks is None or drop.p == 0 or not drop.training:
        return drop(x)
    return torch.where(masks[name].bool(), x / (1.0 - drop.p), torch.zeros_like(x))


def linear_layer(cfg: ViTConfig, d_in: int, d_out: int, bias: bool = True) -> Linear:
    return Linear(d_in, d_out, bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype)


class LayerScale(nn.Module):
    """Per-channel scale ``gamma`` [D] initialised to cfg.layer_scale (Touvron et al. 2021, CaiT)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((cfg.width,), cfg.layer_scale, dtype=torch_dtype(cfg.param_dtype)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma.to(x.dtype)


class DropPath(nn.Module):
    """Stochastic depth: zero a sample's residual branch with probability ``rate`` in training."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, ...]; ``mask`` [B] (1 keep, 0 drop) given from outside (the twins' parity mode), else drawn."""
        if self.rate == 0 or not self.training:
            return x
        keep = 1.0 - self.rate
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        mask = torch.empty(shape, device=x.device).bernoulli_(keep) if mask is None else mask.reshape(shape)
        return torch.where(mask.bool(), x / keep, torch.zeros_like(x))


def masked_mean(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Mean over the tokens [B, L', D] -> [B, D]; with ``keep`` [B, L'] bool, over the kept ones only."""
    if keep is None:
        return x.mean(dim=1)
    k = keep[..., None].to(x.dtype)
    return (x * k).sum(dim=1) / k.sum(dim=1)


def masked_max(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Per-channel max over the tokens [B, L', D] -> [B, D]; with ``keep`` [B, L'], over the kept ones only."""
    return x.amax(dim=1) if keep is None else x.masked_fill(~keep[..., None], float("-inf")).amax(dim=1)


def condition_input(cfg: ViTConfig, x: torch.Tensor, flat: bool) -> torch.Tensor:
    """RADIO's input conditioner (transformers ``RadioInputConditioner``): images [B, C, H, W], or with
    ``flat`` NaFlex patches [B, N, P*P*C] (channels last), normalised per channel with cfg.input_mean and
    cfg.input_std in float32 and returned in x's dtype; x itself where the config has no normalisation."""
    if cfg.input_mean is None:
        return x
    mean, std = (torch.tensor(v, dtype=torch.float32, device=x.device) for v in (cfg.input_mean, cfg.input_std))
    if flat:
        return ((x.float().unflatten(-1, (-1, cfg.in_chans)) - mean) / std).flatten(-2).to(x.dtype)
    return ((x.float() - mean[:, None, None]) / std[:, None, None]).to(x.dtype)
