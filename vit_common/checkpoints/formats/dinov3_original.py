"""Meta's original DINOv3 checkpoints (facebookresearch/dinov3 ``DinoVisionTransformer.state_dict()``, the
torch.hub ``.pth`` files) <-> the config and canonical state: the ``dinov3_original`` format.

Keys, as timm's converter (``timm.models.eva.checkpoint_filter_fn``, the Meta DINOv3 branch) maps them:

============================== ========================================= ==================================
Meta                           canonical                                 how
============================== ========================================= ==================================
cls_token [1, 1, D]            cls_token
storage_tokens [1, R, D]       reg_token                                 registers (none: R = 0)
mask_token [1, D]              -                                         training only: ignored, reported
patch_embed.proj.*             patch_embed.proj.*
rope_embed.periods [hd/4]      rope.periods (``--rope-periods stored``)  gives the head dimension
blocks.i.attn.qkv.weight       blocks.i.attn.qkv.weight
blocks.i.attn.qkv.bias [3D]    attn.q_bias, attn.v_bias (k third masked) the k third zeroed by bias_mask
  + qkv.bias_mask [3D]         or attn.qkv.bias (mask all ones)          (any other mask: refused)
blocks.i.ls1.gamma, ls2.gamma  blocks.i.ls1.gamma, ls2.gamma             LayerScale
blocks.i.mlp.fc1 / fc2         blocks.i.mlp.fc1 / fc2                    GELU MLP
blocks.i.mlp.w1 / w2 / w3      mlp.fc1 = [w1; w2] (gate rows first), fc2 SwiGLU (H+, 7B)
norm.*                         norm.*                                    the final norm
local_cls_norm.*               -                                         7B pretraining only: ignored
============================== ========================================= ==================================

What the files store: every shape, from which width, depth, patch, registers, MLP kind and width, the
biases, and the head count (D / (4 len(periods))) are derived. What the format fixes (Meta's
``RopePositionEmbedding`` in eval: base 100, half layout, 0.5-centred coordinates normalised per axis,
no jitter or rescale; a LayerNorm of eps 1e-5, exact GELU, the class token as the output): declared by
the format. The stored periods are checked against base 100 (equal after bfloat16 rounding, else
refused). The periods choice (``rope_periods``, ``--rope-periods stored|recomputed``): 'stored' (the
default) runs the file's bfloat16-rounded values, the original's numbers; 'computed' recomputes them in
float32 as timm and transformers do. Every read reports the choice and the largest relative difference
between the two sets of periods. Files hold no image size: 256 (DINOv3's pretraining size, timm's) is
assumed; with no position table it changes no output.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Format, Source, writer
from vit_common.checkpoints.formats.provenance import (
    GIVEN,
    Origin,
    assumed,
    build_config,
    common_float_dtype,
    declared,
    derived,
    positive_dims,
)
from vit_common.checkpoints.formats.rules import check_canonical, refuse
from vit_common.checkpoints.formats.tensors import Tensor, TensorMap, concat_rows, dtype_of, row_slice
from vit_common.config import ViTConfig
from vit_common.data.images import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from vit_common.rope import dinov3_periods

TEMPERATURE = 100.0  # Meta's RopePositionEmbedding base of every DINOv3 release
PERIODS = "rope_embed.periods"
_IGNORED = {
    "mask_token": "mask token of masked-image modelling; unused for images",
    "local_cls_norm.weight": "the 7B's norm of local crops' class tokens (pretraining only)",
    "local_cls_norm.bias": "the 7B's norm of local crops' class tokens (pretraining only)",
}
# What DINOv3 itself fixes, whichever library's file holds it (this format's, and hf_dinov3's): the
# ViTConfig fields no DINOv3 file states.
DINOV3_FIXED: dict[str, Any] = dict(
    class_token=True,
    posemb="none",
    pool="token",
    rope="dinov3",
    rope_layout="half",
    rope_normalize="separate",
    rope_grid_offset=0.0,
    rope_grid_indexing="ij",
    rope_ref_grid=None,
    norm_pre=False,
    patch_bias=True,
    final_norm=True,
    fc_norm=False,
    qk_norm=False,
    attn_inner_norm=False,
    mlp_inner_norm=False,
    dist_token=False,
    rep_size=0,
    norm="layernorm",
    patch_norm=False,
)


def dinov3_fixed(after: str, extra: dict[str, Any]) -> dict[str, Any]:
    """``DINOV3_FIXED`` with a format's own fixed fields ``extra`` placed after field ``after`` (the order
    a report lists them in)."""
    keys = list(DINOV3_FIXED)
    return {k: DINOV3_FIXED[k] for k in keys[: keys.index(after) + 1]} | extra | DINOV3_FIXED


# Meta's code fixes more: what transformers' config.json states.
_FIXED: dict[str, Any] = dinov3_fixed("rope", {"rope_temperature": TEMPERATURE}) | dict(
    proj_bias=True, mlp_bias=True, ln_eps=1e-5, gelu="exact", num_classes=0
)


def is_dinov3_original(keys) -> bool:
    """True if the key names are a Meta DINOv3 state_dict (RoPE periods, with storage tokens or a mask token:
    a model of ``n_storage_tokens=0`` has no ``storage_tokens``)."""
    return PERIODS in keys and ("storage_tokens" in keys or "mask_token" in keys)


def bias_kind(mask: np.ndarray, context: str) -> bool:
    """Whether a ``qkv.bias_mask`` [3D] keeps the k bias: False for [1..1, 0..0, 1..1] (Meta's, the k third
    zeroed), True for all ones.

    Raises:
        FormatError: any other mask (names the file and what was found).
    """
    d = mask.shape[0] // 3
    ones, zeros = np.ones(d, mask.dtype), np.zeros(d, mask.dtype)
    if np.array_equal(mask, np.concatenate([ones, zeros, ones])):
        return False
    if np.array_equal(mask, np.ones_like(mask)):
        return True
    raise FormatError(
        f"{context}: qkv.bias_mask is neither [1, 0, 1] by thirds (the k bias masked) nor all ones "
        f"(values {sorted({float(v) for v in np.unique(mask)})[:4]})"
    )


def periods_report(stored: np.ndarray, head_dim: int, mode: str) -> str:
    """The periods choice ``mode`` ('stored' or 'computed') and the largest relative difference of the
    file's periods to float32 recomputed ones, as one note."""
    computed = dinov3_periods(head_dim, TEMPERATURE).astype(np.float64)
    gap = float(np.max(np.abs(stored.astype(np.float64) - computed) / computed))
    which = (
        "the file's, the original's numbers" if mode == "stored" else "recomputed in float32, timm's and transformers'"
    )
    return (
        f"RoPE periods: {mode} ({which}); the file's (bfloat16-rounded) differ from float32 recomputed ones "
        f"by up to {gap:.2e} relative (--rope-periods stored|recomputed)"
    )


def read_original(
    tensors: TensorMap,
    *,
    overrides: Mapping[str, Any] = (),
    source_image_size: tuple[int, int] | None = None,
    context: str = "DINOv3 checkpoint",
) -> Decoded:
    """Config, canonical state and provenance of a Meta DINOv3 state_dict.

    Raises:
        FormatError: a periods tensor that is not 1-D of hd/4 values equal to base 100's after bfloat16
            rounding, a bias mask other than Meta's, tensors the twins lack (``cls_norm``: untied class
            and patch norms), an invalid config: each named.
        StateMismatchError: tensors missing, unexpected or of the wrong shape.
    """
    overrides = dict(overrides)
    if "cls_norm.weight" in tensors:
        raise FormatError(f"{context}: cls_norm.weight (a norm of its own for class tokens); the twins have one")
    periods = np.asarray(tensors[PERIODS], np.float32)
    d, c, ph, pw = positive_dims(np.shape(tensors["patch_embed.proj.weight"]), "patch_embed.proj.weight", context)
    if periods.ndim != 1 or not len(periods) or d % (4 * len(periods)):
        raise FormatError(
            f"{context}: {PERIODS} of shape {periods.shape}; expected [hd/4] with D={d} = 4 * hd/4 * heads"
        )
    hd = 4 * len(periods)
    want = dinov3_periods(hd, TEMPERATURE)
    if not np.all(np.abs(periods - want) <= want * 2.0**-8):
        raise FormatError(f"{context}: {PERIODS} are not base {TEMPERATURE:g}'s (first {periods[:3].tolist()})")
    depth = len({k.split(".")[1] for k in tensors if k.startswith("blocks.")})
    swiglu = "blocks.0.mlp.w1.weight" in tensors
    fc1 = "blocks.0.mlp.w1.weight" if swiglu else "blocks.0.mlp.fc1.weight"
    fmt = declared("Meta DINOv3 (fixed by the format)")
    f: dict[str, Any] = dict(_FIXED)
    prov: dict[str, Origin] = dict.fromkeys(f, fmt)
    shapes = derived("tensor shapes")
    f |= dict(
        width=d,
        in_chans=c,
        patch_size=(ph, pw),
        depth=depth,
        num_heads=d // hd,
        reg_tokens=int(np.shape(tensors["storage_tokens"])[1]) if "storage_tokens" in tensors else 0,
        mlp_type="swiglu" if swiglu else "plain",
        mlp_dim=int(np.shape(tensors[fc1])[0]),
        qkv_bias="blocks.0.attn.qkv.bias" in tensors,
    )
    prov |= dict.fromkeys(("width", "in_chans", "patch_size", "depth", "reg_tokens", "mlp_type", "mlp_dim"), shapes)
    prov["num_heads"] = derived(f"D / hd, hd = 4 x len({PERIODS})")
    prov["qkv_bias"] = shapes
    masks = [k for k in tensors if k.endswith("qkv.bias_mask")]
    kinds = {bias_kind(np.asarray(tensors[k]), f"{context} {k}") for k in masks}
    if len(kinds) > 1:
        raise FormatError(f"{context}: the blocks' qkv.bias_mask differ (some mask the k bias, some not)")
    f["k_bias"] = kinds.pop() if kinds else True
    prov["k_bias"] = derived("qkv.bias_mask" if masks else "qkv.bias without a mask")
    f["layer_scale"] = 1.0 if "blocks.0.ls1.gamma" in tensors else None
    f["dynamic_img_size"] = True
    size = source_image_size or (256, 256)
    f["image_size"] = size
    prov["image_size"] = (
        Origin(GIVEN, "--source-image-size")
        if source_image_size
        else assumed("DINOv3's pretraining size (timm's); no position table, so no output depends on it")
    )
    f["rope_periods"] = "stored"
    prov["rope_periods"] = declared(f"the file's {PERIODS} (--rope-periods recomputed: timm's float32 ones)")
    dt = common_float_dtype(tensors)
    if dt in ("float32", "float64", "bfloat16", "float16"):
        f["param_dtype"] = dt
    cfg = build_config(f, prov, overrides, context, tensors)
    dropped = [(k, why) for k, why in _IGNORED.items() if k in tensors]
    dropped += [(k, "the mask of the k bias, applied when read") for k in masks]
    state = to_canonical(cfg, {k: v for k, v in tensors.items() if k not in _IGNORED and k not in masks})
    check_canonical(cfg, state, context)
    notes = [periods_report(periods, hd, cfg.rope_periods)]
    return Decoded(cfg, state, "DinoVisionTransformer state_dict", prov, dropped, notes)


def to_canonical(cfg: ViTConfig, tensors: TensorMap) -> dict[str, Tensor]:
    """A Meta DINOv3 state (bias masks and ignored tensors removed) -> the canonical state of ``cfg``; the
    caller checks it against ``canonical_shapes``."""
    t = dict(tensors)
    out: dict[str, Tensor] = {"reg_token": t.pop("storage_tokens")} if "storage_tokens" in t and cfg.reg_tokens else {}
    periods = t.pop(PERIODS)
    if cfg.rope_periods == "stored":
        out["rope.periods"] = periods
    for i in range(cfg.depth):
        b = f"blocks.{i}"
        bias = t.pop(f"{b}.attn.qkv.bias", None)
        if bias is not None and cfg.k_bias:
            out[f"{b}.attn.qkv.bias"] = bias
        elif bias is not None:
            d = cfg.width
            out[f"{b}.attn.q_bias"], out[f"{b}.attn.v_bias"] = row_slice(bias, 0, d), row_slice(bias, 2 * d, 3 * d)
        if f"{b}.mlp.w1.weight" in t:
            for leaf in ("weight", "bias"):
                out[f"{b}.mlp.fc1.{leaf}"] = concat_rows([t.pop(f"{b}.mlp.w1.{leaf}"), t.pop(f"{b}.mlp.w2.{leaf}")])
                out[f"{b}.mlp.fc2.{leaf}"] = t.pop(f"{b}.mlp.w3.{leaf}")
    return out | t  # the other names are the canonical ones; what is left over is reported by the check


def from_canonical(cfg: ViTConfig, state: TensorMap) -> dict[str, Tensor]:
    """The canonical state of ``cfg`` (``cannot_hold`` empty) -> Meta's names, with ``qkv.bias_mask`` (the
    k third zeroed without a k bias), a zero ``mask_token`` and the periods (stored, else base 100's
    rounded to bfloat16 as Meta's files hold them)."""
    d, f = cfg.width, cfg.mlp_dim
    dtype = dtype_of(state["cls_token"])
    out: dict[str, Tensor] = {}
    for k, v in state.items():
        if k == "reg_token" or k == "rope.periods" or ".attn.q_bias" in k or ".attn.v_bias" in k:
            continue
        if cfg.mlp_type == "swiglu" and ".mlp.fc1." in k:
            w1, w2 = k.replace(".fc1.", ".w1."), k.replace(".fc1.", ".w2.")
            out[w1], out[w2] = row_slice(v, 0, f), row_slice(v, f, 2 * f)
        elif cfg.mlp_type == "swiglu" and ".mlp.fc2." in k:
            out[k.replace(".fc2.", ".w3.")] = v
        else:
            out[k] = v
    if cfg.reg_tokens:  # Meta's model of n_storage_tokens=0 holds no storage_tokens
        out["storage_tokens"] = state["reg_token"]
    out["mask_token"] = np.zeros((1, d), dtype)
    periods = state.get("rope.periods")
    if periods is None:
        periods = _bf16_round(dinov3_periods(cfg.head_dim, cfg.rope_temperature))
    out[PERIODS] = periods
    for i in range(cfg.depth if cfg.qkv_bias else 0):
        b = f"blocks.{i}.attn"
        if cfg.k_bias:
            out[f"{b}.qkv.bias_mask"] = np.ones((3 * d,), np.float32)
            continue
        q, v = np.asarray(state[f"{b}.q_bias"]), np.asarray(state[f"{b}.v_bias"])
        out[f"{b}.qkv.bias"] = np.concatenate([q, np.zeros_like(q), v])
        out[f"{b}.qkv.bias_mask"] = np.concatenate([np.ones(d), np.zeros(d), np.ones(d)]).astype(np.float32)
    return out


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), kept float32: Meta's stored periods."""
    import ml_dtypes

    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def cannot_hold(cfg: ViTConfig) -> list[str]:
    """Why a Meta DINOv3 file cannot hold ``cfg``'s function, one line per reason ([] if it can)."""
    inert = cfg.inert_fields()
    skip = {"rope_temperature", "ln_eps", "gelu"} | inert
    out = [
        f"{k}={getattr(cfg, k)!r} (Meta's DINOv3 has {v!r})"
        for k, v in _FIXED.items()
        if k not in skip and getattr(cfg, k) != v
    ]
    if cfg.rope == "dinov3" and cfg.rope_temperature != TEMPERATURE:
        out.append(f"rope_temperature={cfg.rope_temperature} (Meta's DINOv3 has {TEMPERATURE:g})")
    if cfg.ln_eps != 1e-5:
        out.append(f"ln_eps={cfg.ln_eps} (Meta's DINOv3 has 1e-05)")
    if cfg.mlp_type == "plain" and cfg.gelu != "exact":
        out.append(f"gelu={cfg.gelu!r} (Meta's DINOv3 has 'exact')")
    if cfg.layer_scale is None:
        out.append("layer_scale=None (Meta's DINOv3 has LayerScale)")
    return out


class Dinov3Original(Format):
    """Meta's DINOv3 ``.pth`` state_dicts (read with torch's weights-only loader; written with ``torch.save``)."""

    name = "dinov3_original"
    description = "Meta's original DINOv3 state_dict (.pth, torch.hub keys)"
    framework = "torch"  # no suffix of its own: a .pth is timm's unless --to dinov3_original
    signature = f"{PERIODS} with storage_tokens or mask_token"
    assumed_preprocess = Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bilinear", 1.0, "squash")
    assumed_why = "Meta's DINOv3 evaluation transform: ImageNet mean/std, a bilinear resize"

    def detect(self, src: Source) -> bool:
        return src.container in ("torch", "safetensors") and is_dinov3_original(src.tensors)

    def read(self, src: Source, opts) -> Decoded:
        return read_original(
            src.tensors, overrides=opts.overrides, source_image_size=opts.source_image_size, context=src.context
        )

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        return cannot_hold(cfg)

    def encode(self, cfg: ViTConfig, state, path: Path, options, assumed=()) -> Encoded:
        refuse("Meta DINOv3", self.cannot_hold(cfg))
        notes = ["mask_token written as zeros (Meta's model builds one; images never use it)"]
        if cfg.rope_periods != "stored":
            notes.append(f"{PERIODS}: base 100's rounded to bfloat16, as Meta's files hold them")
        return Encoded(cfg, state, from_canonical(cfg, state), None, None, notes)

    def decode(self, enc: Encoded) -> Decoded:
        return read_original(
            enc.tensors,
            overrides={"rope_periods": enc.cfg.rope_periods},
            source_image_size=enc.cfg.image_size,
            context="dinov3_original read-back",
        )

    def write(self, path: Path, enc: Encoded, writers) -> None:
        writer(writers, "torch", path)(path, enc.tensors)

    def export_name(self, source=None) -> str:
        return "model_dinov3_original.pth"


FORMAT = Dinov3Original()
