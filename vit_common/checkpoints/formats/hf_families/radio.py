"""RADIO (transformers ``radio``: ``RadioModel``, NVIDIA's C-RADIO) in the hf_family format.

``save_pretrained`` writes NVIDIA's own tensor names (transformers' ``conversion_mapping.py`` renames them
when it loads), all under ``radio_model.``:

=========================================== ===================================================================
file tensor                                 our config and canonical state
=========================================== ===================================================================
``model.patch_generator.embedder.weight``   a bias-free linear map of patches flattened (C, P, P), [D, C*P*P]:
                                            the patch convolution [D, C, P, P] (patch_bias False)
``model.patch_generator.pos_embed``         [1, M*M, D], M = config.json ``max_img_size`` // P: pos_embed of a
                                            model of image_size M*P (config.json ``image_size`` is the
                                            processor's; the model ignores it), patch rows only
                                            (posemb_prefix False), resized to any grid as transformers does:
                                            bilinear to a square of the larger side, then its top-left crop
                                            (posemb_resample 'bilinear_crop', dynamic_img_size)
``model.patch_generator.cls_token.token``   [T, D], T = ``num_cls_tokens`` + ``num_registers``: the first row is
                                            cls_token, the others reg_token (reg_tokens T - 1), as timm's
                                            ``_convert_radio``; no position embedding reaches them
``model.blocks.{i}.*``                      timm's names (``attn.qkv`` fused, ``attn.proj`` biased), the MLP
                                            ``mlp.fc1``/``fc2`` or, with ``use_swiglu_ffn``, ``mlp.gate_proj``,
                                            ``up_proj`` (our fc1, gate rows first) and ``down_proj``, hidden
                                            width from ``mlp_ratio`` as DINOv2's; ``layer_scale{1,2}.lambda1``
                                            = LayerScale where the file has them (transformers' default
                                            ``layerscale_value`` 1 makes missing ones the identity)
``input_conditioner.norm_mean``/``_std``    [C, 1, 1] buffers: input_mean / input_std (the model normalises
                                            its input in float32)
``summary_idxs``                            int64 buffer: summary_idxs; pool 'summary' (transformers'
                                            ``summary``: those class tokens concatenated)
``model.patch_generator.video_embedder``    video patches only: ignored (reported)
=========================================== ===================================================================

No final norm (final_norm False). Written as ``RadioModel`` with ``max_img_size`` = image_size,
``num_cls_tokens`` = max(summary_idxs) + 1 and the other prefix tokens as registers. Sources:
transformers 5.24 ``models/radio/modeling_radio.py``, ``configuration_radio.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf_families.dinov2 import ratio_mlp, swiglu_width
from vit_common.checkpoints.formats.hf_families.family import Family, FamilyConfig
from vit_common.checkpoints.formats.provenance import Origin, declared, derived
from vit_common.checkpoints.formats.rules import Piece, Rule, copy
from vit_common.config import ViTConfig

# transformers 5.24 RadioConfig defaults beyond the common ones
_RADIO = dict(
    hidden_size=1280,
    num_hidden_layers=32,
    num_attention_heads=16,
    patch_size=16,
    hidden_act="gelu",
    layer_norm_eps=1e-6,
    mlp_ratio=4.0,
    use_swiglu_ffn=False,
    qkv_bias=True,
    layerscale_value=1.0,
    max_img_size=2048,
    num_cls_tokens=3,
    num_registers=7,
)
_M = "model."
_PATCH = _M + "patch_generator.embedder.weight"
_TOKENS = _M + "patch_generator.cls_token.token"
_MEAN, _STD = "input_conditioner.norm_mean", "input_conditioner.norm_std"


def _check_table(cj: FamilyConfig, tensors: Mapping[str, Any], key: str) -> None:
    """Refuse a position table ``key`` [1, M*M, D] whose rows are not config.json's (``max_img_size`` // P)^2."""
    if key not in tensors:
        return
    size, _ = cj.get("max_img_size", (int,))
    p, _ = cj.get("patch_size", (int,))
    shape, m = tuple(np.shape(tensors[key])), size // p
    if m >= 1 and len(shape) == 3 and shape[1] != m * m:  # m = 0: read_image_size names it
        side = math.isqrt(shape[1])
        want = f"max_img_size={side * p} (a table of {side}x{side})" if side * side == shape[1] else "a square table"
        raise FormatError(
            f"{cj.context}: config.json max_img_size={size} with patch_size={p} gives a {m}x{m} position table "
            f"({m * m} rows), but {key} has {shape[1]} rows: expected {want}"
        )


def radio_ratio(cfg: ViTConfig) -> float | None:
    """The smallest ``mlp_ratio`` r whose hidden width int(D * r) (rounded for SwiGLU) gives cfg.mlp_dim,
    or None if none does."""
    d = cfg.width
    if cfg.mlp_type == "plain":
        hidden = cfg.mlp_dim
    else:
        hidden = next((h for h in range(cfg.mlp_dim, 2 * cfg.mlp_dim + 8) if swiglu_width(h) == cfg.mlp_dim), 0)
    if not hidden:
        return None
    r = hidden / d
    while int(d * r) < hidden:
        r = float(np.nextafter(r, np.inf))
    return r if int(d * r) == hidden else None


class RADIO(Family):
    """RADIO's rules: NVIDIA's tensor names, the cropped position table, class tokens and registers in one
    tensor, the input normaliser and summary indices kept as buffers, no final norm."""

    def patch_key(self) -> str:
        return _PATCH

    def patch_dims(self, cj: FamilyConfig, shape: tuple[int, ...], key: str) -> tuple[int, int, int, int]:
        """(D, C, P, P) of the linear patch embedding [D, C*P*P], P and C from config.json."""
        p, _ = cj.get("patch_size", (int,))
        c, _ = cj.get("num_channels", (int,))
        if len(shape) != 2 or shape[1] != c * p * p:
            raise FormatError(f"{cj.context}: {key} has shape {tuple(shape)}, expected [D, C*P*P = {c * p * p}]")
        return shape[0], c, p, p

    def read_image_size(self, cj: FamilyConfig) -> tuple[int, Origin]:
        """M*P for the position table's M x M grid, M = config.json ``max_img_size`` // P."""
        size, _ = cj.get("max_img_size", (int,))
        p, _ = cj.get("patch_size", (int,))
        if size < p:
            raise FormatError(f"{cj.context}: config.json max_img_size={size} is smaller than patch_size={p}")
        return size // p * p, declared(f"config.json max_img_size={size}: the position table's grid")

    def read_block(
        self, cj: FamilyConfig, fields: dict[str, Any], type_origin: Origin
    ) -> tuple[dict[str, Any], dict[str, Origin]]:
        """A GELU and LayerNorms as every family's, no final norm, the cropped table of patch rows."""
        out, origins = super().read_block(cj, fields, type_origin)
        fixed = dict(final_norm=False, posemb_prefix=False, dynamic_img_size=True, pool_include_prefix=False)
        return out | fixed, origins | {k: type_origin for k in fixed}

    def read_mlp(self, cj: FamilyConfig, width: int, origin: Origin) -> tuple[dict[str, Any], dict[str, Origin]]:
        return ratio_mlp(cj, width)

    def read_registers(self, cj: FamilyConfig, origin: Origin) -> tuple[int, Origin]:
        """The class tokens after the first and the registers: ``num_cls_tokens`` + ``num_registers`` - 1."""
        n_cls, _ = cj.get("num_cls_tokens", (int,))
        n_reg, _ = cj.get("num_registers", (int,))
        if n_cls < 1 or n_reg < 0:
            raise FormatError(
                f"{cj.context}: config.json num_cls_tokens={n_cls}, num_registers={n_reg}: expected >= 1 and >= 0"
            )
        return n_cls + n_reg - 1, declared("config.json num_cls_tokens + num_registers - 1 (the first is cls_token)")

    def read_tensors(
        self, cj: FamilyConfig, tensors: Mapping[str, Any], prefix: str
    ) -> tuple[dict[str, Any], dict[str, Origin], dict[str, str]]:
        """input_mean / input_std and summary_idxs from their buffers (transformers loads them from the file),
        LayerScale where the file has ``lambda1`` tensors, and the video projection ignored.

        Raises:
            FormatError (one line): a buffer missing or malformed, a position table whose rows are not the
                (``max_img_size`` // P)^2 cells config.json declares.
        """
        missing = [k for k in (_MEAN, _STD, "summary_idxs") if prefix + k not in tensors]
        if missing:
            raise FormatError(f"{cj.context}: no {', '.join(prefix + k for k in missing)}, so not a RadioModel")
        _check_table(cj, tensors, prefix + _M + "patch_generator.pos_embed")
        mean, std = (np.asarray(tensors[prefix + k], np.float32).reshape(-1) for k in (_MEAN, _STD))
        idxs = np.asarray(tensors[prefix + "summary_idxs"])
        n_cls, _ = cj.get("num_cls_tokens", (int,))
        if idxs.ndim != 1 or idxs.dtype.kind not in "iu" or not all(0 <= i < n_cls for i in idxs.tolist()):
            raise FormatError(
                f"{cj.context}: {prefix}summary_idxs={idxs.tolist()}: expected class token indices in [0, {n_cls})"
            )
        scaled = any(k.startswith(prefix + _M + "blocks.") and k.endswith(".lambda1") for k in tensors)
        value, _ = cj.get("layerscale_value", (int, float))
        if not scaled and value != 1:
            raise FormatError(
                f"{cj.context}: no layer_scale tensors with config.json layerscale_value={value}: transformers "
                "would use that constant, which the twins do not (only 1, the identity)"
            )
        fields = {
            "input_mean": tuple(mean.tolist()),
            "input_std": tuple(std.tolist()),
            "summary_idxs": tuple(idxs.tolist()),
            "layer_scale": 1.0 if scaled else None,
        }
        origins = {k: declared(f"{prefix}{key}") for k, key in zip(fields, (_MEAN, _STD, "summary_idxs"), strict=False)}
        origins["layer_scale"] = derived("layer_scale{1,2}.lambda1 tensors present" if scaled else "none present")
        video = prefix + _M + "patch_generator.video_embedder.weight"
        unread = {prefix + k: "" for k in (_MEAN, _STD, "summary_idxs")}
        return (
            fields,
            origins,
            unread | ({video: "the video patch projection (not used for images)"} if video in tensors else {}),
        )

    def unpack(self, cfg: ViTConfig, tensors: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """The class and register tokens [T, D] as ``<key>.cls`` [1, 1, D] and ``<key>.reg`` [1, T-1, D]."""
        out = dict(tensors)
        key = prefix + _TOKENS
        t = np.asarray(out.pop(key))
        out[key + ".cls"] = t[None, :1]
        if cfg.reg_tokens:
            out[key + ".reg"] = t[None, 1:]
        return out

    def pack(self, cfg: ViTConfig, tensors: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """Inverse of ``unpack``, with the buffers: the input normaliser [C, 1, 1] and summary_idxs (int64)."""
        out = dict(tensors)
        key = prefix + _TOKENS
        parts = [np.asarray(out.pop(key + ".cls"))[0]] + (
            [np.asarray(out.pop(key + ".reg"))[0]] if cfg.reg_tokens else []
        )
        out[key] = np.ascontiguousarray(np.concatenate(parts))
        dt = out[key].dtype
        out[prefix + _MEAN] = np.asarray(cfg.input_mean, dt).reshape(-1, 1, 1)
        out[prefix + _STD] = np.asarray(cfg.input_std, dt).reshape(-1, 1, 1)
        out[prefix + "summary_idxs"] = np.asarray(cfg.summary_idxs, np.int64)
        return out

    def holds(self, cfg: ViTConfig) -> str | None:
        """``RadioModel``: pool 'summary' (RADIO's alone), no classes."""
        return "RadioModel" if cfg.pool == "summary" and not cfg.num_classes else None

    def checks(self, cfg: ViTConfig) -> dict[str, bool]:
        return {
            "final_norm (RADIO has no final norm)": cfg.final_norm,
            "no input normaliser (RADIO always normalises its input)": cfg.input_mean is None,
            "patch_bias (RADIO's patch projection has no bias)": cfg.patch_bias,
            "norm='rmsnorm' or patch_norm": cfg.norm == "rmsnorm" or cfg.patch_norm,
            "proj_bias=False or mlp_bias=False": not (cfg.proj_bias and cfg.mlp_bias),
            f"posemb={cfg.posemb!r} with posemb_prefix={cfg.posemb_prefix} (RADIO has a learned table of patch "
            "rows)": cfg.posemb != "learn" or cfg.posemb_prefix,
            f"posemb_resample={cfg.posemb_resample!r} (transformers' RADIO resizes with 'bilinear_crop')": (
                cfg.posemb_resample != "bilinear_crop"
            ),
            f"mlp_dim={cfg.mlp_dim} (no RADIO mlp_ratio gives it)": radio_ratio(cfg) is None,
        }

    def keeps_posemb(self, cfg: ViTConfig) -> bool:
        return True

    def config_json(self, cfg: ViTConfig, common: dict[str, Any]) -> dict[str, Any]:
        """RADIO's keys: ``max_img_size`` = image_size, the MLP ratio, the tokens, the summary, the normaliser."""
        n_cls = max(cfg.summary_idxs) + 1
        return common | {
            "max_img_size": cfg.image_size[0],
            "mlp_ratio": radio_ratio(cfg),
            "use_swiglu_ffn": cfg.mlp_type == "swiglu",
            "qkv_bias": cfg.qkv_bias,
            "layerscale_value": 1.0,
            "num_cls_tokens": n_cls,
            "num_registers": cfg.num_prefix_tokens - n_cls,
            "summary_idxs": list(cfg.summary_idxs),
            "norm_mean": list(cfg.input_mean),
            "norm_std": list(cfg.input_std),
        }

    def rules(self, cfg: ViTConfig, spelling: str, prefix: str, layer_prefix: str, head: str) -> list[Rule]:
        """File <-> canonical rules: the table above (one key spelling; ``layer_prefix`` is ``prefix``), the
        tokens as ``unpack`` splits them."""
        d, f, c = cfg.width, cfg.mlp_dim, cfg.in_chans
        ph, pw = cfg.patch_size
        m = prefix + _M
        r = [
            Rule(
                "patch_embed.proj.weight",
                (Piece(m + "patch_generator.embedder.weight", (d, c * ph * pw), (d, c, ph, pw)),),
            ),
            copy(m + "patch_generator.pos_embed", "pos_embed", (1, cfg.posemb_len, d)),
            copy(prefix + _TOKENS + ".cls", "cls_token", (1, 1, d)),
        ]
        if cfg.reg_tokens:
            r.append(copy(prefix + _TOKENS + ".reg", "reg_token", (1, cfg.reg_tokens, d)))
        for i in range(cfg.depth):
            p, b = f"{m}blocks.{i}.", f"blocks.{i}."
            r += [copy(f"{p}{n}.{w}", f"{b}{n}.{w}", (d,)) for n in ("norm1", "norm2") for w in ("weight", "bias")]
            r.append(copy(p + "attn.qkv.weight", b + "attn.qkv.weight", (3 * d, d)))
            if cfg.qkv_bias:
                r.append(copy(p + "attn.qkv.bias", b + "attn.qkv.bias", (3 * d,)))
            r += [copy(f"{p}attn.proj.{w}", f"{b}attn.proj.{w}", s) for w, s in (("weight", (d, d)), ("bias", (d,)))]
            if cfg.layer_scale is not None:
                r += [copy(f"{p}layer_scale{j}.lambda1", f"{b}ls{j}.gamma", (d,)) for j in (1, 2)]
            if cfg.mlp_type == "plain":
                r += [
                    copy(f"{p}mlp.{n}.{w}", f"{b}mlp.{n}.{w}", s)
                    for n, shapes in (("fc1", ((f, d), (f,))), ("fc2", ((d, f), (d,))))
                    for w, s in zip(("weight", "bias"), shapes, strict=True)
                ]
            else:
                gate_up = (p + "mlp.gate_proj", p + "mlp.up_proj")  # our fc1: gate rows first
                r.append(Rule(b + "mlp.fc1.weight", tuple(Piece(k + ".weight", (f, d)) for k in gate_up)))
                r.append(Rule(b + "mlp.fc1.bias", tuple(Piece(k + ".bias", (f,)) for k in gate_up)))
                r += [
                    copy(f"{p}mlp.down_proj.{w}", f"{b}mlp.fc2.{w}", s) for w, s in (("weight", (d, f)), ("bias", (d,)))
                ]
        return r


FAMILIES: dict[str, Family] = {
    "radio": RADIO(
        "radio", _RADIO, {"RadioModel": ("radio_model.", "summary")}, resample="bilinear_crop", patch_bias=False
    ),
}
