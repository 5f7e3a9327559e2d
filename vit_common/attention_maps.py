"""What a ViT looks at: raw attention maps, attention rollout and the patch-grid maps shown to people.

numpy only. The inputs are the twins' ``forward_intermediates`` outputs as numpy arrays
('attnNN' [B, N, L, L] per block, 'attn_pool' [B, N, 1, L] for the MAP head), so both frameworks go
through the same code here and their maps can be compared directly.

Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", ACL, Sec. 3,
arXiv:2005.00928) estimates how much each input token feeds each output token through the whole
stack. Exactly what ``rollout`` computes, for blocks l = 1..depth in forward order:

1. head fusion: A_l = mean over heads of attnNN (the paper's choice), or the max, the min, or one
   head h (heads are not aligned across layers, so a single head is for inspection only);
2. residual identity: Â_l = 0.5 * A_l + 0.5 * I, then each row divided by its sum (rows of a
   max/min fusion do not sum to 1 before this step; for the mean the division changes nothing);
3. product from the first layer: R = Â_depth @ ... @ Â_2 @ Â_1, so R[i, j] is the share of input
   token j in output token i. Every Â_l is row-stochastic, hence so is R.

Which output token a map reads depends on the pooling (``query_weights``):

* pool='token': the class token's row (token 0). Register tokens (Darcet et al. 2024) take part in
  attention and rollout like every token; they are split off the patch map and their share reported.
* pool='gap', 'max', 'avgmax' and 'none' (no single output token, or no class token): the mean over
  the patch queries. gap pools the mean of the final patch tokens, and a row average of R is the
  rollout of that mean, so this is the rollout of the pooled vector (for max and avgmax an
  approximation); for one block it is the mean attention each token receives from the patch tokens.
* pool='map': blocks as for gap; the MAP head's probe attention ('attn_pool') is its own map, and the
  rollout is p @ R with p the probe's head-fused attention, rows renormalised (the probe reads the
  final tokens without a residual path, so no identity is added for it). A probe that reads the patch
  tokens only (pool_include_prefix=False) gives the prefix tokens weight 0.

A token distribution [..., L] is split into class token, register tokens and the patch grid [..., h, w]
(``split_tokens``); ``upsample`` takes a grid to image size with ``vit_common.posemb``'s bilinear
matrices (torch ``F.interpolate(mode="bilinear", align_corners=False)``, no antialias), which keep a
non-negative map non-negative.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vit_common.config import ViTConfig
from vit_common.posemb import resample_matrices

FUSIONS = ("mean", "max", "min")


def _check_head(head: str | int, num_heads: int) -> None:
    index = isinstance(head, int) and not isinstance(head, bool) and 0 <= head < num_heads
    if not (index or head in FUSIONS):
        raise ValueError(f"head={head!r}: expected one of {FUSIONS} or a head index in [0, {num_heads})")


def fuse_heads(attn: np.ndarray, head: str | int = "mean") -> np.ndarray:
    """Fuse the head axis of attention probabilities: [..., N, L, M] -> [..., L, M] float64.

    ``head``: 'mean', 'max', 'min' (over heads) or an int in [0, N) selecting one head. No
    renormalisation.

    Raises:
        ValueError: unknown fusion or a head index out of range.
    """
    a = np.asarray(attn, np.float64)
    if a.ndim < 3:
        raise ValueError(f"attention of shape {a.shape}: expected [..., N, L, M]")
    _check_head(head, a.shape[-3])
    if isinstance(head, int):
        return a[..., head, :, :]
    return getattr(np, head)(a, axis=-3)


def fused_rows(dist: np.ndarray, head: str | int = "mean") -> np.ndarray:
    """Fuse per-head distributions [..., N, L] -> [..., L] float64, rows renormalised to sum to 1.

    The renormalisation matters for 'max' and 'min' only. Raises ValueError as ``fuse_heads``.
    """
    fused = fuse_heads(np.asarray(dist)[..., None, :], head)[..., 0, :]  # [..., N, 1, L] -> [..., L]
    return fused / fused.sum(axis=-1, keepdims=True)


def rollout(attns: Sequence[np.ndarray], head: str | int = "mean", residual: float = 0.5) -> np.ndarray:
    """Attention rollout over blocks in forward order: list of [B, N, L, L] -> R [B, L, L] float64.

    Per block: fuse heads (``fuse_heads``), Â = (1 - residual) * A + residual * I, rows renormalised to
    sum to 1; then R = Â_last @ ... @ Â_first (Abnar & Zuidema 2020, Sec. 3, with residual 0.5 as
    there). Rows of R sum to 1.

    Raises:
        ValueError: no layers, non-square or mismatched shapes, residual outside [0, 1], bad ``head``.
    """
    if not attns:
        raise ValueError("rollout needs at least one attention layer")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual={residual!r}: expected a weight in [0, 1]")
    result = None
    for i, attn in enumerate(attns):
        a = fuse_heads(attn, head)  # [B, L, L]
        if a.shape[-1] != a.shape[-2] or (result is not None and a.shape != result.shape):
            raise ValueError(
                f"layer {i}: attention of shape {np.shape(attn)} does not fit [B, N, L, L] of the other layers"
            )
        a = (1.0 - residual) * a + residual * np.eye(a.shape[-1])
        a = a / a.sum(axis=-1, keepdims=True)
        result = a if result is None else a @ result  # later layers multiply from the left
    return result


def query_weights(cfg: ViTConfig, seq_len: int | None = None) -> tuple[np.ndarray, str]:
    """Weights over query tokens [L] (sum 1) that define the output a map reads, and what they are.

    pool='token': one-hot on the class token; pool='summary' (RADIO): the uniform mean over the prefix
    tokens ``cfg.summary_idxs`` that form the output; otherwise the uniform mean over patch tokens (see
    the module docstring for why).

    Raises:
        ValueError: ``seq_len`` leaves no patch tokens after the prefix.
    """
    length = cfg.seq_len if seq_len is None else seq_len
    npt = cfg.num_prefix_tokens
    if length <= npt:
        raise ValueError(f"seq_len={length} leaves no patch tokens after {npt} prefix tokens")
    q = np.zeros(length, np.float64)
    if cfg.pool == "token":
        q[0] = 1.0
        return q, "the class token's attention row (query = token 0)"
    if cfg.pool == "summary":
        idx = list(cfg.summary_idxs)
        q[idx] = 1.0 / len(idx)
        return q, f"the mean of the summary tokens' attention rows (queries = tokens {idx}, pool='summary')"
    q[npt:] = 1.0 / (length - npt)
    why = {
        "gap": "pool='gap' averages the patch tokens",
        "max": "pool='max' takes each channel's maximum over the tokens",
        "avgmax": "pool='avgmax' mixes the tokens' mean and maximum",
        "map": "pool='map' reads the tokens through its probe, not a class token",
        "probe": "pool='probe' reads the tokens through its attention probe, not a class token",
        "token_gap": "pool='token_gap' joins the class token to this mean",
        "none": "pool='none' has no single output token",
    }[cfg.pool]
    return q, f"the mean over all patch-token queries of their attention rows ({why})"


@dataclass(frozen=True)
class TokenSplit:
    """A distribution over tokens [..., L] split by token kind (shares sum to 1 per map).

    cls: [...] class-token share, or None without a class token. dist: [...] distillation-token share
    (DeiT), or None. registers: [..., R] (R may be 0). patches: [..., h, w] patch grid, row-major as the
    patch embedding.
    """

    cls: np.ndarray | None
    registers: np.ndarray
    patches: np.ndarray
    dist: np.ndarray | None = None


def split_tokens(dist: np.ndarray, cfg: ViTConfig, grid: tuple[int, int] | None = None) -> TokenSplit:
    """Split [..., L] into class token, registers and the patch grid [..., h, w] (``grid`` or cfg.grid).

    Raises:
        ValueError: L is not num_prefix_tokens + h * w.
    """
    dist = np.asarray(dist)
    gh, gw = cfg.grid if grid is None else grid
    npt = cfg.num_prefix_tokens
    if dist.shape[-1] != npt + gh * gw:
        raise ValueError(f"{dist.shape[-1]} tokens: expected {npt} prefix + {gh}x{gw} patches")
    c = int(cfg.class_token) + int(cfg.dist_token)
    return TokenSplit(
        cls=dist[..., 0] if cfg.class_token else None,
        registers=dist[..., c:npt],
        patches=dist[..., npt:].reshape(*dist.shape[:-1], gh, gw),
        dist=dist[..., 1] if cfg.dist_token else None,
    )


def upsample(maps: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Patch-grid maps [..., h, w] -> [..., H, W] float64, bilinear (posemb ``'bilinear'`` matrices)."""
    maps = np.asarray(maps, np.float64)
    wh, ww = resample_matrices(maps.shape[-2:], tuple(size), "bilinear")
    return np.einsum("yh,...hw,xw->...yx", wh, maps, ww)


@dataclass(frozen=True)
class AttentionMaps:
    """Everything ``attention_maps`` extracts for a batch; each map is a distribution over L tokens.

    layers: block indices of ``raw``. raw: [B, len(layers), N, L], the query's attention per head.
    probe: [B, N, L], the MAP probe's attention (pool='map' only, else None).
    rollout: [B, L], the query (probe for MAP) read through R. head: the fusion used in the rollout.
    shows: one line per map kind saying what it is.
    """

    layers: tuple[int, ...]
    raw: np.ndarray
    probe: np.ndarray | None
    rollout: np.ndarray
    head: str | int
    shows: dict[str, str]


def attention_maps(
    cfg: ViTConfig,
    intermediates: Mapping[str, np.ndarray],
    layers: Sequence[int] | None = None,
    head: str | int = "mean",
    residual: float = 0.5,
) -> AttentionMaps:
    """Raw per-head maps for ``layers`` (default: the last block), MAP probe, and rollout.

    ``intermediates``: numpy copies of a twin's ``forward_intermediates`` dict ('attn00'..., plus
    'attn_pool' for MAP). ``head`` is the rollout's head fusion. All arrays float64.

    Raises:
        ValueError: a layer index out of range, missing attention entries, bad ``head``.
    """
    names = [f"attn{i:02d}" for i in range(cfg.depth)]
    wanted = names + (["attn_pool"] if cfg.pool == "map" else [])
    missing = [n for n in wanted if intermediates.get(n) is None]
    if missing:
        raise ValueError(f"intermediates lack attention probabilities {missing}")
    layers = (cfg.depth - 1,) if layers is None else tuple(layers)
    bad = [i for i in layers if not 0 <= i < cfg.depth]
    if bad or not layers:
        raise ValueError(f"layers={list(layers)}: expected block indices in [0, {cfg.depth})")
    attns = [np.asarray(intermediates[n], np.float64) for n in names]  # each [B, N, L, L]
    _check_head(head, attns[0].shape[1])
    q, query = query_weights(cfg, attns[0].shape[-1])
    raw = np.stack([np.einsum("l,bnlm->bnm", q, attns[i]) for i in layers], axis=1)  # [B, layers, N, L]
    r = rollout(attns, head, residual)  # [B, L, L]
    fusion = f"head {head}" if isinstance(head, int) else f"{head} over heads"
    shows = {
        "raw": f"per block and head: {query}",
        "rollout": f"attention rollout ({fusion}, {residual:g} identity for the residual) of {query}",
    }
    probe = None
    if cfg.pool == "map":
        probe = np.asarray(intermediates["attn_pool"], np.float64)[:, :, 0]  # [B, N, 1, L'] -> [B, N, L']
        skipped = r.shape[-1] - probe.shape[-1]  # prefix tokens the probe does not read
        probe = np.concatenate([np.zeros(probe.shape[:-1] + (skipped,)), probe], axis=-1)  # [B, N, L]
        read = np.einsum("bm,bml->bl", fused_rows(probe, head), r)
        shows["probe"] = "per head: the MAP head's probe attention over the final tokens (what pool='map' reads)"
        shows["rollout"] = (
            f"attention rollout ({fusion}, {residual:g} identity for the residual) of the "
            "MAP probe's attention: probe @ R, no identity for the probe"
        )
    else:
        read = np.einsum("l,blm->bm", q, r)
    if cfg.num_prefix_tokens:
        kinds = ["the class token"] * cfg.class_token + ["the distillation token"] * cfg.dist_token
        kinds += [f"{cfg.reg_tokens} register tokens"] * bool(cfg.reg_tokens)
        shows["prefix"] = f"{' and '.join(kinds)}: left out of the patch maps; each map's share reported"
    return AttentionMaps(layers=layers, raw=raw, probe=probe, rollout=read, head=head, shows=shows)


def shares(dist: np.ndarray, cfg: ViTConfig) -> dict:
    """Share of a token distribution [L] per token kind: patches, cls, registers (floats)."""
    sp = split_tokens(dist, cfg)
    out = {"patches": float(sp.patches.sum())}
    if sp.cls is not None:
        out["cls"] = float(sp.cls)
    if sp.dist is not None:
        out["dist"] = float(sp.dist)
    if sp.registers.size:
        out["registers"] = [float(x) for x in sp.registers]
    return out


def spread(n: int, k: int) -> list[int]:
    """At most ``k`` (>= 2) of the indices 0..n-1, evenly spaced, the first and the last among them."""
    return sorted({round(x) for x in np.linspace(0, n - 1, min(n, k))})
