"""Rotary position embeddings in the PyTorch twin: the tables of ``vit_common.rope`` and the rotation.

The JAX twin is ``vit_jax/rope.py``: the same class and function names, the same numbers. Shape
alphabet as ``vit_torch/model.py``; Np patch tokens, hd head dim.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from vit_common import rope as rope_np
from vit_common.config import ViTConfig


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class RotaryEmbedding(nn.Module):
    """The sin/cos tables of cfg.rope for a patch grid: ``rope(grid)`` -> (sin, cos), each [Np, hd]
    (``dinov3``, ``cat``) or [depth, N, Np, hd] (``mixed``), in at least float32.

    ``freqs`` [2, depth, N, hd/2] (``mixed``: learned, x then y) is a parameter; ``periods`` [hd/4]
    (``dinov3`` with rope_periods='stored': the checkpoint's values) a persistent buffer. Tables of fixed
    parameterisations come from numpy (float64, cast here); learned or stored ones are computed in the
    graph in float32 (or float64 for a float64 model), as timm does.
    """

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        pd, hd = getattr(torch, cfg.param_dtype), cfg.head_dim
        self.freqs = (
            nn.Parameter(torch.empty(2, cfg.depth, cfg.num_heads, hd // 2, dtype=pd)) if cfg.rope == "mixed" else None
        )
        if self.freqs is not None and not self.freqs.is_meta:
            with torch.no_grad():
                self.freqs.copy_(torch.from_numpy(rope_np.mixed_init(cfg, np.random.default_rng(0))))
        stored = cfg.rope == "dinov3" and cfg.rope_periods == "stored"
        self.register_buffer("periods", torch.empty(hd // 4, dtype=pd) if stored else None, persistent=True)
        if stored and not self.periods.is_meta:
            self.periods.copy_(torch.from_numpy(rope_np.dinov3_periods(hd, cfg.rope_temperature)))

    def forward(self, grid: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        acc = _acc(getattr(torch, cfg.dtype))
        pos = torch.as_tensor(rope_np.coords(cfg, grid), device=device)  # [Np, 2] float32
        if self.freqs is not None:  # theta[l, n, h] = t_x fx[l, h] + t_y fy[l, h]
            f = self.freqs.to(acc)
            theta = pos[:, 0, None, None, None].to(acc) * f[0] + pos[:, 1, None, None, None].to(acc) * f[1]
            theta = theta.permute(1, 2, 0, 3)  # [Np, depth, N, hd/2] -> [depth, N, Np, hd/2]
        elif self.periods is not None:  # theta = 2 pi c / P, axis-major: [Np, 2, hd/4] -> [Np, hd/2]
            theta = (2 * math.pi * pos.to(acc)[:, :, None] / self.periods.to(acc)).flatten(1)
        else:
            sin, cos = rope_np.tables(cfg, grid)
            return torch.as_tensor(sin, dtype=acc, device=device), torch.as_tensor(cos, dtype=acc, device=device)
        theta = theta.repeat_interleave(2, -1) if cfg.rope_layout == "interleaved" else torch.cat([theta, theta], -1)
        return theta.sin(), theta.cos()


def rotate(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The layout's pair swap of the last axis: interleaved [-x1, x0, -x3, x2, ...], half [-x_b, x_a]."""
    if layout == "interleaved":
        return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(
    x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, num_prefix_tokens: int, layout: str
) -> torch.Tensor:
    """Rotate the patch tokens of q or k, x [B, L, N, hd]; tables [Np, hd] or per head [N, Np, hd]; the
    first ``num_prefix_tokens`` tokens pass unchanged. Computed in the tables' dtype, cast back to x's."""
    if sin.ndim == 3:  # [N, Np, hd] -> [Np, N, hd]
        sin, cos = sin.transpose(0, 1), cos.transpose(0, 1)
    else:  # [Np, hd] -> [Np, 1, hd]
        sin, cos = sin[:, None], cos[:, None]
    prefix, patches = x[:, :num_prefix_tokens], x[:, num_prefix_tokens:].to(sin.dtype)  # [B, Np, N, hd]
    rotated = patches * cos + rotate(patches, layout) * sin
    return torch.cat([prefix, rotated.to(x.dtype)], dim=1)
