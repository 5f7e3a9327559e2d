"""Rotary position embeddings (RoPE) of the patch tokens: the one numpy definition both twins use.

Only the patch tokens of q and k are rotated; class and register tokens and v never are. A rotation
turns channel pairs of each head by an angle per token: ``y = x * cos + rot(x) * sin`` with tables
[Np, hd] (hd = head_dim, Np = h * w patches, row-major) and ``rot`` the layout's pair swap:

- ``interleaved`` (EVA-02, Perception Encoder, RoPE-ViT; timm's default): pairs (2p, 2p+1), table
  channels 2p and 2p+1 both carry angle p, ``rot(x) = [-x1, x0, -x3, x2, ...]``;
- ``half`` (DINOv3; timm ``rope_rotate_half=True``): pairs (p, p + hd/2), table ``[theta, theta]``,
  ``rot(x) = [-x[hd/2:], x[:hd/2]]``.

The angle vector theta [hd/2] of a token is axial: ``[c0 * w_0 .. c0 * w_{hd/4-1}, c1 * w_0 ..]`` with
(c0, c1) its coordinates (row then column for ``ij`` indexing, column then row for ``xy``) and w the
frequencies of the parameterisation (timm ``timm/layers/pos_embed_sincos.py`` is the reference):

- ``dinov3`` (``RotaryEmbeddingDinoV3``; Meta DINOv3, transformers ``dinov3_vit``): periods
  ``P_k = T^(k / (hd/4))`` in float32, w_k = 2 pi / P_k, coordinates centred in (-1, 1):
  ``2 (idx + 0.5 + offset) / den - 1`` with den the axis' size (``separate``), min or max of (h, w);
- ``cat`` (``RotaryEmbeddingCat`` with ``in_pixels=False``): bands ``w_k = T^(-k / (hd/4))`` in
  float32, coordinates ``idx + offset``, rescaled to a reference grid r as ``t * r / s`` when one is set;
- ``mixed`` (``RotaryEmbeddingMixed``, Heo et al. 2024 RoPE-Mixed): learned frequencies ``rope.freqs``
  [2, depth, N, hd/2] (x then y), angle ``t_x * fx + t_y * fy`` with integer positions; computed in the
  twins' graphs from the parameter, from ``mixed_positions`` here.

Numerics (measured against timm 1.0.31): frequencies and coordinates are rounded to float32 as timm
stores them, then angles, sin and cos are computed in float64; the twins cast the tables to the compute
dtype (at least float32) only at the multiply. Training-time coordinate augmentation (DINOv3's shift,
jitter, rescale) is not implemented: eval numbers never depend on it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

TYPES = ("none", "dinov3", "cat", "mixed")
LAYOUTS = ("interleaved", "half")
INDEXING = ("ij", "xy")
NORMALIZE = ("separate", "min", "max")
PERIODS = ("computed", "stored")


def check_config(cfg: Any) -> None:
    """Raise ValueError naming the values for a RoPE setting that no reference defines (``ViTConfig``
    calls it on construction; ``cfg`` is a ``ViTConfig``)."""
    if cfg.rope == "none":
        return
    if cfg.head_dim % 4:
        raise ValueError(
            f"rope={cfg.rope!r} needs head_dim divisible by 4 (two axes x rotated pairs), got head_dim="
            f"{cfg.head_dim} (width={cfg.width}, num_heads={cfg.num_heads})"
        )
    if cfg.posemb == "sincos2d":
        raise ValueError(f"rope={cfg.rope!r} with posemb='sincos2d': no reference model has both")
    if cfg.rope == "mixed" and (cfg.rope_layout != "interleaved" or cfg.rope_grid_offset or cfg.rope_ref_grid):
        raise ValueError(
            f"rope='mixed' takes rope_layout='interleaved', rope_grid_offset=0 and no rope_ref_grid (timm "
            f"RotaryEmbeddingMixed has no other); got rope_layout={cfg.rope_layout!r}, rope_grid_offset="
            f"{cfg.rope_grid_offset}, rope_ref_grid={cfg.rope_ref_grid}"
        )
    if cfg.rope_ref_grid is not None and cfg.rope != "cat":
        raise ValueError(f"rope_ref_grid={cfg.rope_ref_grid} applies to rope='cat' only, got rope={cfg.rope!r}")
    if cfg.rope_periods == "stored" and cfg.rope != "dinov3":
        raise ValueError(f"rope_periods='stored' applies to rope='dinov3' only, got rope={cfg.rope!r}")


def dinov3_periods(head_dim: int, temperature: float) -> np.ndarray:
    """float32 [hd/4]: ``T^(k / (hd/4))``, computed in float32 as timm ``RotaryEmbeddingDinoV3`` and Meta's
    ``RopePositionEmbedding`` do (``2k / (hd/2)`` exponents)."""
    d = head_dim // 4
    exponent = (2 * np.arange(d, dtype=np.float32) / np.float32(head_dim // 2)).astype(np.float32)
    return (np.float32(temperature) ** exponent).astype(np.float32)


def cat_bands(head_dim: int, temperature: float) -> np.ndarray:
    """float32 [hd/4]: ``T^(-k / (hd/4))`` as timm ``freq_bands(step=1)`` computes it (float32)."""
    d = head_dim // 4
    exponent = (np.arange(d, dtype=np.float32) / np.float32(d)).astype(np.float32)
    return (np.float32(1.0) / (np.float32(temperature) ** exponent)).astype(np.float32)


def _axes(cfg: Any, grid: tuple[int, int]) -> list[np.ndarray]:
    """Per-axis float32 coordinates [(h,), (w,)] of the parameterisation (before indexing swaps)."""
    h, w = grid
    off = np.float32(cfg.rope_grid_offset)
    if cfg.rope == "dinov3":
        den = {"separate": (h, w), "min": (min(h, w),) * 2, "max": (max(h, w),) * 2}[cfg.rope_normalize]
        out = []
        for s, d in zip((h, w), den, strict=True):
            c = ((np.arange(s, dtype=np.float32) + np.float32(0.5) + off) / np.float32(d)).astype(np.float32)
            out.append((np.float32(2.0) * c - np.float32(1.0)).astype(np.float32))
        return out
    out = [(np.arange(s, dtype=np.float32) + off).astype(np.float32) for s in (h, w)]
    if cfg.rope == "cat" and cfg.rope_ref_grid is not None:
        out = [
            (t / np.float32(s) * np.float32(r)).astype(np.float32)
            for t, s, r in zip(out, (h, w), cfg.rope_ref_grid, strict=True)
        ]
    return out


def coords(cfg: Any, grid: tuple[int, int]) -> np.ndarray:
    """float32 [Np, 2]: each patch's (c0, c1) in row-major token order; c0 is the row coordinate for
    ``ij`` indexing and the column coordinate for ``xy`` (timm ``rope_grid_indexing``)."""
    rows, cols = _axes(cfg, grid)
    r, c = np.meshgrid(rows, cols, indexing="ij")  # [h, w] each
    pair = (r, c) if cfg.rope_grid_indexing == "ij" else (c, r)
    return np.stack([p.reshape(-1) for p in pair], axis=-1)


def mixed_positions(cfg: Any, grid: tuple[int, int]) -> np.ndarray:
    """float32 [Np, 2]: (t_x, t_y) of ``mixed``, integer positions: (column, row) for ``xy`` indexing (the
    RoPE-Mixed default), (row, column) for ``ij`` (timm ``get_mixed_grid``): ``coords`` itself."""
    return coords(cfg, grid)


def angles(cfg: Any, grid: tuple[int, int], periods: np.ndarray | None = None) -> np.ndarray:
    """float64 [Np, hd/2]: the axial angle vector of each patch token for ``dinov3`` (periods computed
    from rope_temperature, or ``periods`` [hd/4] when given) and ``cat``.

    Raises:
        ValueError: rope 'none' or 'mixed' (whose angles come from the learned ``rope.freqs``).
    """
    c = coords(cfg, grid).astype(np.float64)  # [Np, 2]
    if cfg.rope == "dinov3":
        p = dinov3_periods(cfg.head_dim, cfg.rope_temperature) if periods is None else np.asarray(periods)
        w = 2 * math.pi / p.astype(np.float64)
    elif cfg.rope == "cat":
        w = cat_bands(cfg.head_dim, cfg.rope_temperature).astype(np.float64)
    else:
        raise ValueError(f"rope={cfg.rope!r} has no fixed angle table (expected 'dinov3' or 'cat')")
    return (c[:, :, None] * w[None, None, :]).reshape(c.shape[0], -1)  # [Np, 2, hd/4] -> [Np, hd/2]


def expand(theta: np.ndarray, layout: str) -> np.ndarray:
    """[..., hd/2] angles -> [..., hd] per channel: ``interleaved`` repeats each pairwise, ``half`` tiles."""
    return np.repeat(theta, 2, axis=-1) if layout == "interleaved" else np.concatenate([theta, theta], axis=-1)


def tables(cfg: Any, grid: tuple[int, int], periods: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(sin, cos), float64 [Np, hd] each, for a fixed parameterisation (``angles``) in cfg.rope_layout."""
    theta = expand(angles(cfg, grid, periods), cfg.rope_layout)
    return np.sin(theta), np.cos(theta)


def mixed_init(cfg: Any, rng: np.random.Generator) -> np.ndarray:
    """float32 [2, depth, N, hd/2]: RoPE-Mixed's initial frequencies (Heo et al. 2024; timm
    ``init_random_2d_freqs`` with temperature 10): magnitudes ``10^(-4k/hd)``, k < hd/4, at a random angle
    phi per block and head, fx = [m cos phi, m cos(phi + pi/2)], fy = [m sin phi, m sin(phi + pi/2)].
    An initialisation only: a checkpoint's ``rope.freqs`` are read, never regenerated."""
    mag = 1.0 / 10.0 ** (np.arange(0, cfg.head_dim, 4)[: cfg.head_dim // 4] / cfg.head_dim)  # [hd/4]
    phi = rng.uniform(0, 2 * np.pi, (cfg.depth, cfg.num_heads, 1))
    fx = np.concatenate([mag * np.cos(phi), mag * np.cos(phi + np.pi / 2)], axis=-1)
    fy = np.concatenate([mag * np.sin(phi), mag * np.sin(phi + np.pi / 2)], axis=-1)
    return np.stack([fx, fy]).astype(np.float32)


def check_periods(cfg: Any, periods: np.ndarray) -> None:
    """Raise ValueError unless ``periods`` is a positive finite [hd/4] vector (a stored ``rope.periods``)."""
    p = np.asarray(periods, dtype=np.float64)
    if p.shape != (cfg.head_dim // 4,) or not (np.isfinite(p).all() and (p > 0).all()):
        raise ValueError(
            f"rope.periods of shape {tuple(p.shape)}: expected positive finite values of shape ({cfg.head_dim // 4},) "
            f"(head_dim {cfg.head_dim} / 4)"
        )
