"""The canonical weight state: a flat dict of numpy arrays in timm's names and PyTorch layouts.

A gated MLP (``mlp_type='swiglu'``) is stored as timm's ``vit_giant_patch14_dinov2`` stores it:
``mlp.fc1`` [2F, D] with the gate's rows first (``SwiGLUPacked``), ``mlp.fc2`` [D, F]; readers of other
packings (timm ``SwiGLU``'s ``fc1_g``/``fc1_x``, ``GluMlp``'s gate-last ``fc1``, HF DINOv2's
``weights_in`` / ``gate_proj`` + ``up_proj``) map them to this one explicitly.

RoPE models (``vit_common.rope``) add, under timm's Eva names: ``blocks.{i}.attn.q_bias`` and ``v_bias``
[D] (a q and v bias without a key bias: ``k_bias=False``), ``attn.norm`` [D] and ``mlp.norm`` [F] (the
inner norms), ``rope.freqs`` [2, depth, N, hd/2] (learned ``mixed`` frequencies, x then y) and
``rope.periods`` [hd/4] (DINOv3 periods kept from a checkpoint, ``rope_periods='stored'``; a buffer, not
a trained parameter). LayerScale stays ``ls1.gamma`` (timm Eva's ``gamma_1``), a split q/k/v is fused
into ``attn.qkv`` and a split SwiGLU packed into ``mlp.fc1``, by the readers.

``canonical_shapes(cfg)`` is the single description of which tensors a config has; both twins'
``to_numpy`` produce exactly these keys and shapes, and every reader and writer checks against it.
``random_state(cfg)`` fills those shapes with seeded normal values for tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from vit_common.config import ViTConfig
from vit_common.rope import dinov3_periods


class StateMismatchError(ValueError):
    """A state does not fit a config: lists missing, unexpected and wrong-shape tensors together."""

    def __init__(self, missing: list[str], unexpected: list[str], shape: list[str], context: str = ""):
        self.missing, self.unexpected, self.shape = missing, unexpected, shape
        lines = [f"state does not match the config{': ' + context if context else ''}"]
        lines += [f"  missing: {k}" for k in missing]
        lines += [f"  unexpected: {k}" for k in unexpected]
        lines += [f"  shape: {k}" for k in shape]
        super().__init__("\n".join(lines))


def _linear(prefix: str, d_in: int, d_out: int, bias: bool = True) -> dict[str, tuple[int, ...]]:
    out = {f"{prefix}.weight": (d_out, d_in)}
    if bias:
        out[f"{prefix}.bias"] = (d_out,)
    return out


def _norm(prefix: str, d: int, kind: str = "layernorm") -> dict[str, tuple[int, ...]]:
    """A norm's tensors: LayerNorm weight and bias, RMSNorm (``kind='rmsnorm'``) weight only."""
    return {f"{prefix}.weight": (d,)} | ({} if kind == "rmsnorm" else {f"{prefix}.bias": (d,)})


def _mlp(prefix: str, d: int, f: int, gated: bool = False, bias: bool = True) -> dict[str, tuple[int, ...]]:
    """fc1 and fc2; a gated (SwiGLU) fc1 packs [gate; value] rows, [2F, D] (timm ``SwiGLUPacked``)."""
    return {**_linear(f"{prefix}.fc1", d, 2 * f if gated else f, bias), **_linear(f"{prefix}.fc2", f, d, bias)}


def canonical_shapes(cfg: ViTConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the canonical state for ``cfg``, name -> shape, in timm state_dict order."""
    d, f, hd = cfg.width, cfg.mlp_dim, cfg.head_dim
    ph, pw = cfg.patch_size
    nk = cfg.norm  # every norm's kind
    s: dict[str, tuple[int, ...]] = {}  # in torch state_dict order: own parameters, then children
    if cfg.class_token:
        s["cls_token"] = (1, 1, d)
    if cfg.reg_tokens:
        s["reg_token"] = (1, cfg.reg_tokens, d)
    if cfg.posemb == "learn":
        s["pos_embed"] = (1, cfg.posemb_len, d)
    if cfg.dist_token:
        s["dist_token"] = (1, 1, d)  # timm VisionTransformerDistilled registers it after pos_embed
    s["patch_embed.proj.weight"] = (d, cfg.in_chans, ph, pw)  # (D, C, P, P) OIHW
    if cfg.patch_bias:
        s["patch_embed.proj.bias"] = (d,)
    if cfg.patch_norm:
        s.update(_norm("patch_embed.norm", d, nk))
    if cfg.rope == "mixed":  # learned RoPE frequencies: axis 0 x then y, per block and head
        s["rope.freqs"] = (2, cfg.depth, cfg.num_heads, hd // 2)
    if cfg.rope == "dinov3" and cfg.rope_periods == "stored":  # the checkpoint's periods (Meta's buffer)
        s["rope.periods"] = (hd // 4,)
    if cfg.norm_pre:
        s.update(_norm("norm_pre", d, nk))
    for i in range(cfg.depth):
        b = f"blocks.{i}"
        s.update(_norm(f"{b}.norm1", d, nk))
        s.update(_linear(f"{b}.attn.qkv", d, 3 * d, cfg.qkv_bias and cfg.k_bias))  # rows [q; k; v], head-major
        if cfg.qkv_bias and not cfg.k_bias:  # no key bias: timm EvaAttention's q_bias and v_bias
            s[f"{b}.attn.q_bias"], s[f"{b}.attn.v_bias"] = (d,), (d,)
        if cfg.qk_norm:
            s.update(_norm(f"{b}.attn.q_norm", hd, nk))
            s.update(_norm(f"{b}.attn.k_norm", hd, nk))
        if cfg.attn_inner_norm:
            s.update(_norm(f"{b}.attn.norm", d, nk))
        s.update(_linear(f"{b}.attn.proj", d, d, cfg.proj_bias))
        if cfg.layer_scale is not None:
            s[f"{b}.ls1.gamma"] = (d,)
        s.update(_norm(f"{b}.norm2", d, nk))
        s.update(_mlp(f"{b}.mlp", d, f, cfg.mlp_type == "swiglu", cfg.mlp_bias))
        if cfg.mlp_inner_norm:
            s.update(_norm(f"{b}.mlp.norm", f, nk))
        if cfg.layer_scale is not None:
            s[f"{b}.ls2.gamma"] = (d,)
    if cfg.final_norm and not cfg.fc_norm:
        s.update(_norm("norm", d, nk))
    if cfg.pool == "map":  # timm AttentionPoolLatent
        s["attn_pool.latent"] = (1, 1, d)
        s.update(_linear("attn_pool.q", d, d))
        s.update(_linear("attn_pool.kv", d, 2 * d))
        s.update(_linear("attn_pool.proj", d, d))
        s.update(_norm("attn_pool.norm", d, nk))
        s.update(_mlp("attn_pool.mlp", d, cfg.map_mlp_width))
    if cfg.pool == "probe":  # HF Aimv2AttentionPoolingHead: the latent is the query, no q projection
        s["attn_pool.latent"] = (1, 1, d)
        s.update(_linear("attn_pool.kv", d, 2 * d, cfg.qkv_bias))
        s.update(_linear("attn_pool.proj", d, d))
    if cfg.fc_norm:
        s.update(_norm("fc_norm", d, nk))
    if cfg.rep_size:
        s.update(_linear("pre_logits.fc", d, cfg.rep_size))
    if cfg.num_classes:
        s.update(_linear("head", cfg.features_dim, cfg.num_classes, cfg.head_bias))
        if cfg.head_dist:
            s.update(_linear("head_dist", cfg.features_dim, cfg.num_classes, cfg.head_bias))
    return s


def check_state(expected: Mapping[str, tuple[int, ...]], state: Mapping[str, object], context: str = "") -> None:
    """Raise StateMismatchError unless ``state`` has exactly the keys and shapes of ``expected``."""
    missing = [k for k in expected if k not in state]
    unexpected = sorted(k for k in state if k not in expected)
    shape = [
        f"{k} has {tuple(np.shape(state[k]))}, expected {tuple(v)}"
        for k, v in expected.items()
        if k in state and tuple(np.shape(state[k])) != tuple(v)
    ]
    if missing or unexpected or shape:
        raise StateMismatchError(missing, unexpected, shape, context)


def nonfinite(state: Mapping[str, np.ndarray]) -> list[str]:
    """Names of tensors holding NaN or Inf: those of a numpy floating dtype, and ``ml_dtypes.bfloat16``
    ones through their bits as uint16 (exponent bits all ones: NaN or Inf). Each is loaded once and
    checked a block of rows at a time, its axes taken in memory order (a transposed view is read as it
    lies, not one element per cache line); other dtypes are not loaded."""
    out = []
    for k, v in state.items():
        dtype = getattr(v, "dtype", None)
        dtype = np.asarray(v).dtype if dtype is None else np.dtype(dtype)
        if dtype.name == "bfloat16":
            bad = _bfloat16_nonfinite
        elif np.issubdtype(dtype, np.floating):
            bad = _float_nonfinite
        else:
            continue
        a = np.atleast_1d(np.asarray(v))
        a = a.transpose(np.argsort([-abs(st) for st in a.strides], kind="stable"))  # memory order: a transposed view
        step = max(1, (1 << 22) // max(1, a[:1].size))
        if any(bad(a[i : i + step]) for i in range(0, len(a), step)):
            out.append(k)
    return out


def _float_nonfinite(a: np.ndarray) -> bool:
    return not np.isfinite(a).all()


def _bfloat16_nonfinite(a: np.ndarray) -> bool:
    """bfloat16 (sign 1 bit, exponent 8, mantissa 7): NaN and Inf are the magnitudes 0x7F80 and above, the
    largest finite one 0x7F7F: a masked maximum, one temporary and a reduction."""
    return bool((a.view(np.uint16) & np.uint16(0x7FFF)).max() >= 0x7F80)


def random_state(
    cfg: ViTConfig, *, seed: int = 0, scale: float = 1.0, dtype: npt.DTypeLike = np.float32
) -> dict[str, np.ndarray]:
    """A canonical state for ``cfg`` of seeded normal values, for tests and benchmarks: name -> array of
    ``canonical_shapes(cfg)``'s shapes and order, ``scale`` times standard normal draws of
    ``numpy.random.default_rng(seed)`` taken in that order, scaled in float64 then cast to ``dtype``
    (float32, float64, ``ml_dtypes.bfloat16``...). Numpy only, so no framework compiles an initialiser.

    Continuous draws: no tensor is constant or symmetric and no two are equal, so a swapped, transposed
    or dropped tensor cannot go unnoticed (single values can repeat by float32 rounding: 2 of the 15,690
    of a width-32, depth-1 config). Test weights, not an initialisation: LayerNorm weights are drawn like
    every other tensor. Stored DINOv3 periods (``rope.periods``) are drawn too, then replaced by the
    float32 periods of ``rope_temperature`` (periods must be positive).
    """
    rng = np.random.default_rng(seed)
    out = {k: (scale * rng.standard_normal(s)).astype(dtype) for k, s in canonical_shapes(cfg).items()}
    if "rope.periods" in out:
        out["rope.periods"] = dinov3_periods(cfg.head_dim, cfg.rope_temperature).astype(dtype)
    return out
