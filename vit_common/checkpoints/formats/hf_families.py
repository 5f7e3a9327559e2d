"""Hugging Face transformers vision towers beyond ViT and DeiT: SigLIP, CLIP, DINOv2 (with registers),
ViT-MAE, ViT-MSN and I-JEPA folders (config.json + weights) <-> the canonical state.

``model_type`` decides the layout and ``architectures`` the output (transformers 5.24's modules):

======================= ========================================== =====================================
model_type              architectures                              our config
======================= ========================================== =====================================
siglip_vision_model     SiglipVisionModel (output: the MAP head,   no class token; ``position_embedding``
                        ``head.*``, with its ``in_proj`` split      [N, D] = pos_embed; ``post_layernorm``
                        into q and kv); SiglipForImageClassification = norm; pool 'map' (head), or 'gap' for
                        (mean of the tokens, ``classifier``)        the classifier (its unused head ignored)
siglip                  SiglipModel: ``vision_model.*`` as above; the text tower, ``logit_scale`` and
                        ``logit_bias`` are ignored (reported)
clip_vision_model       CLIPVisionModel (pooler = post-norm of     ``class_embedding`` [D] = cls_token,
                        the class token), CLIPVisionModelWith-     ``pre_layrnorm`` = norm_pre, no patch
                        Projection (+ bias-free                    bias, ``post_layernorm`` = norm (the
                        ``visual_projection``)                     class token's norm is the same either
                                                                   way), the projection = a bias-free head
clip                    CLIPModel: ``vision_model.*`` and ``visual_projection`` as above; text ignored
dinov2                  Dinov2Model (pooler = the class token),    ``layer_scale{1,2}.lambda1`` =
                        Dinov2ForImageClassification (classifier   LayerScale, ``mask_token`` ignored,
                        on [class token, mean of patches])         pool 'token' / 'token_gap', SwiGLU
dinov2_with_registers   as dinov2, with ``register_tokens``        registers enter after the position
                                                                   embedding, which has a class row: that
                                                                   row is folded into cls_token (exact)
vit_mae                 ViTMAEModel (every patch: transformers     an HF ViT; pool 'token'
                        with ``mask_ratio=0``)
vit_msn                 ViTMSNModel, ViTMSNForImageClassification  an HF ViT; pool 'token'
ijepa                   IJepaModel, IJepaForImageClassification    no class token; pool 'gap'
======================= ========================================== =====================================

One table of block key spellings serves them all (``BLOCK_KEYS``): the v4 names ``save_pretrained``
writes and the v5 module names of transformers 5 ``state_dict()``, as transformers' own
``conversion_mapping.py`` renames them; SigLIP and CLIP have one spelling. A DINOv2 SwiGLU FFN is
``mlp.weights_in`` [2F, D] (v4: gate rows first, as our fc1) or ``mlp.gate_proj`` + ``mlp.up_proj`` (v5),
and ``mlp.weights_out`` / ``mlp.down_proj``. Position embeddings are resampled as transformers'
``interpolate_pos_encoding`` does: bicubic without antialias, but with it for dinov2_with_registers.
Written (``family_for``): the family that holds the model, a two-tower folder as its vision tower, DINOv2
with a zero ``mask_token`` and (registers) a zero class position row. A plain ViT (class token pooling)
is the hf format's unless written as ``vit_mae`` (``ViTMAEModel``, ``mask_ratio`` 0) or ``vit_msn``:
``HfWriteOptions.model_type`` (``--hf-model-type``), which ``complete_options`` sets from a source read
from such a folder. Still refused by name: CLIPForImageClassification (a mean of
un-normalised tokens), ViTMAEForPreTraining (its decoder), and in ``hf_vit.py`` relative position bias (BEiT,
data2vec-vision), rotary embeddings (DINOv3, Perception Encoder), NaFlex SigLIP2 and AIMv2's RMSNorm.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf import HfWriteOptions, HuggingFace
from vit_common.checkpoints.formats.hf_common import BLOCK_KEYS
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Source
from vit_common.checkpoints.formats.provenance import (
    ASSUMED_KEY,
    Origin,
    build_config,
    carried_assumptions,
    common_float_dtype,
    declared,
    positive_dims,
    refuse_unsupported,
)
from vit_common.checkpoints.formats.rules import (
    Piece,
    Rule,
    copy,
    from_canonical,
    materialize_posemb,
    refuse,
    to_canonical,
    unsupported,
)
from vit_common.config import ViTConfig
from vit_common.system import io

# DINOv2's SwiGLU FFN per spelling: (packed [gate; up] or the two halves, down)
_SWIGLU_KEYS = {
    "v4": (("mlp.weights_in",), "mlp.weights_out"),
    "v5": (("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj"),
}


@dataclass(frozen=True)
class Family:
    """One transformers model type: its block style, config defaults (transformers 5.24's config class),
    the architectures it reads (name -> (prefix of the backbone's tensors, head kind)) and how its
    position embedding is resampled."""

    style: str
    defaults: Mapping[str, Any]
    architectures: Mapping[str, tuple[str, str]]
    resample: str = "bicubic"
    two_tower: bool = False


_SIGLIP = dict(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, patch_size=16)
_CLIP = dict(hidden_act="quick_gelu", layer_norm_eps=1e-5, patch_size=32)
_DINO = dict(hidden_act="gelu", layer_norm_eps=1e-6, mlp_ratio=4, qkv_bias=True, use_swiglu_ffn=False)
FAMILIES: dict[str, Family] = {
    "siglip_vision_model": Family("clip", _SIGLIP, {"SiglipVisionModel": ("", "map")}),
    "siglip": Family(
        "clip",
        _SIGLIP,
        {"SiglipModel": ("vision_model.", "map"), "SiglipForImageClassification": ("vision_model.", "gap")},
        two_tower=True,
    ),
    "clip_vision_model": Family(
        "clip", _CLIP, {"CLIPVisionModel": ("", "token"), "CLIPVisionModelWithProjection": ("vision_model.", "project")}
    ),
    "clip": Family("clip", _CLIP, {"CLIPModel": ("vision_model.", "project")}, two_tower=True),
    "dinov2": Family(
        "dinov2",
        _DINO | dict(patch_size=14),
        {"Dinov2Model": ("", "token"), "Dinov2ForImageClassification": ("dinov2.", "token_gap")},
    ),
    "dinov2_with_registers": Family(
        "dinov2",
        _DINO | dict(patch_size=16, num_register_tokens=4),
        {
            "Dinov2WithRegistersModel": ("", "token"),
            "Dinov2WithRegistersForImageClassification": ("dinov2_with_registers.", "token_gap"),
        },
        resample="bicubic_aa",
    ),
    "vit_mae": Family(
        "vit", dict(hidden_act="gelu", layer_norm_eps=1e-12, qkv_bias=True), {"ViTMAEModel": ("", "token")}
    ),
    "vit_msn": Family(
        "vit",
        dict(hidden_act="gelu", layer_norm_eps=1e-6, qkv_bias=True),
        {"ViTMSNModel": ("", "token"), "ViTMSNForImageClassification": ("vit.", "token")},
    ),
    "ijepa": Family(
        "vit",
        dict(hidden_act="gelu", layer_norm_eps=1e-12, qkv_bias=True),
        {"IJepaModel": ("", "gap"), "IJepaForImageClassification": ("ijepa.", "gap")},
    ),
}
_COMMON_DEFAULTS = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    num_channels=3,
    image_size=224,
)
_REFUSED_ARCHITECTURES = {
    "CLIPForImageClassification": "a classifier on the mean of un-normalised patch tokens (no final norm)",
    "ViTMAEForPreTraining": "ViT-MAE's masked-image-modelling decoder (save its ViTMAEModel encoder)",
    "Dinov2Backbone": "a multi-stage backbone output",
    "Dinov2WithRegistersBackbone": "a multi-stage backbone output",
}
_ACT_TO_GELU = {
    "gelu": "exact",
    "gelu_python": "exact",
    "gelu_pytorch_tanh": "tanh",
    "gelu_new": "tanh",
    "quick_gelu": "quick",
}


def _pair(v: Any, name: str, context: str) -> tuple[int, int]:
    pair = [v, v] if not isinstance(v, (list, tuple)) else list(v)
    if len(pair) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in pair):
        return pair[0], pair[1]
    raise FormatError(f"{context}: config.json {name}={v!r} is not a positive int or [H, W]")


def is_family(config: Mapping[str, Any] | None) -> bool:
    """True if an HF config.json names one of ``FAMILIES``' model types (``hf._FAMILY_MODEL_TYPES``)."""
    return (
        isinstance(config, Mapping) and isinstance(config.get("model_type"), str) and config["model_type"] in FAMILIES
    )


class _Config:
    """config.json values (a two-tower folder's ``vision_config``) with provenance: a missing key is the
    family's transformers default (declared: that is what transformers builds)."""

    def __init__(self, config: Mapping[str, Any], defaults: Mapping[str, Any], context: str):
        self.config, self.defaults, self.context = config, {**_COMMON_DEFAULTS, **defaults}, context

    def get(self, key: str, types: tuple) -> tuple[Any, Origin]:
        if key not in self.config:
            return self.defaults[key], declared(f"transformers' default for a missing {key}")
        v = self.config[key]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise FormatError(f"{self.context}: config.json {key}={v!r} is not a {names}")
        return v, declared(f"config.json {key}")


def _spelling(style: str, tensors: Mapping[str, np.ndarray], prefix: str) -> str:
    if style == "vit" and any(k.startswith(f"{prefix}layers.") for k in tensors):
        return "v5"
    if style == "dinov2" and any(".attention.q_proj." in k for k in tensors):
        return "v5"
    return "v4"


def _layer_prefix(prefix: str, tensors: Mapping[str, np.ndarray], layer: str) -> str:
    """Where the blocks are: under ``prefix``, or at the top where a task model's file keeps them there
    (ViT-MSN classifiers: ``encoder.layer.*`` beside ``vit.embeddings``, which transformers 5.24 writes and
    renames ``^encoder.`` -> ``vit.encoder.`` when it loads them)."""
    first = layer.format(i=0)
    if prefix and not any(k.startswith(prefix + first) for k in tensors) and any(k.startswith(first) for k in tensors):
        return ""
    return prefix


_IN_PROJ = ("head.attention.in_proj_weight", "head.attention.in_proj_bias")


def split_in_proj(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """SigLIP's packed MAP ``in_proj`` [3D, ...] (torch ``nn.MultiheadAttention``, rows [q; k; v]) as two
    tensors ``<key>.q`` [D, ...] and ``<key>.kv`` [2D, ...], our MAP head's q and kv."""
    out = dict(tensors)
    for key in (prefix + k for k in _IN_PROJ):
        if key in out and np.ndim(out[key]) >= 1 and np.shape(out[key])[0] % 3 == 0:
            a = np.asarray(out.pop(key))
            d = a.shape[0] // 3
            out[key + ".q"], out[key + ".kv"] = a[:d], a[d:]
    return out


def pack_in_proj(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Inverse of ``split_in_proj``."""
    out = dict(tensors)
    for key in (prefix + k for k in _IN_PROJ):
        if key + ".q" in out:
            out[key] = np.ascontiguousarray(np.concatenate([out.pop(key + ".q"), out.pop(key + ".kv")]))
    return out


def fold_class_row(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """dinov2_with_registers adds its position embedding (class row + patch rows) before the registers
    are inserted: the class row is added to the class token here (the same float addition transformers
    does), leaving patch rows only (our posemb_prefix=False, as timm's ``*_reg4_dinov2``)."""
    out = dict(tensors)
    e = prefix + "embeddings."
    pe, cls = np.asarray(out[e + "position_embeddings"]), np.asarray(out[e + "cls_token"])
    out[e + "cls_token"] = (cls + pe[:, :1]).astype(cls.dtype)
    out[e + "position_embeddings"] = np.ascontiguousarray(pe[:, 1:])
    return out


def unfold_class_row(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Inverse of ``fold_class_row`` for writing: a zero class row (exact: cls + 0 is cls)."""
    out = dict(tensors)
    key = prefix + "embeddings.position_embeddings"
    pe = np.asarray(out[key])
    out[key] = np.ascontiguousarray(np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1))
    return out


def rules(cfg: ViTConfig, style: str, spelling: str, prefix: str, layer_prefix: str, head: str) -> list[Rule]:
    """File <-> canonical rules for ``cfg`` in block ``style`` and ``spelling``: the backbone's tensors
    under ``prefix`` (its blocks under ``layer_prefix``), ``head`` the architecture's output kind.

    SigLIP's MAP ``in_proj_weight`` [3D, D] is split before these rules (``split_in_proj``) into the
    keys ``head.attention.in_proj_weight.q`` [D, D] and ``.kv`` [2D, D] (and the biases alike); a
    dinov2_with_registers class row is folded into cls_token before them (``fold_class_row``).
    """
    lp = layer_prefix
    d, f = cfg.width, cfg.mlp_dim
    ph, pw = cfg.patch_size
    layer, n1, q, k, v, o, n2, fc1, fc2 = BLOCK_KEYS[style][spelling]
    e = prefix + "embeddings."
    r: list[Rule] = []
    if style == "clip":
        if cfg.class_token:
            r.append(Rule("cls_token", (Piece(e + "class_embedding", (d,), reshape=(1, 1, d)),)))
        rows = cfg.posemb_len
        r.append(Rule("pos_embed", (Piece(e + "position_embedding.weight", (rows, d), reshape=(1, rows, d)),)))
        r.append(copy(e + "patch_embedding.weight", "patch_embed.proj.weight", (d, cfg.in_chans, ph, pw)))
        if cfg.patch_bias:
            r.append(copy(e + "patch_embedding.bias", "patch_embed.proj.bias", (d,)))
        if cfg.norm_pre:
            r += [copy(f"{prefix}pre_layrnorm.{w}", f"norm_pre.{w}", (d,)) for w in ("weight", "bias")]
    else:
        if cfg.class_token:
            r.append(copy(e + "cls_token", "cls_token", (1, 1, d)))
        if cfg.reg_tokens:
            r.append(copy(e + "register_tokens", "reg_token", (1, cfg.reg_tokens, d)))
        r.append(copy(e + "position_embeddings", "pos_embed", (1, cfg.posemb_len, d)))
        r.append(copy(e + "patch_embeddings.projection.weight", "patch_embed.proj.weight", (d, cfg.in_chans, ph, pw)))
        r.append(copy(e + "patch_embeddings.projection.bias", "patch_embed.proj.bias", (d,)))
    for i in range(cfg.depth):
        p, b = lp + layer.format(i=i), f"blocks.{i}."
        r += [copy(f"{p}{n1}.{w}", f"{b}norm1.{w}", (d,)) for w in ("weight", "bias")]
        r.append(Rule(b + "attn.qkv.weight", tuple(Piece(f"{p}{n}.weight", (d, d)) for n in (q, k, v))))
        if cfg.qkv_bias:
            r.append(Rule(b + "attn.qkv.bias", tuple(Piece(f"{p}{n}.bias", (d,)) for n in (q, k, v))))
        r += [copy(f"{p}{o}.{w}", f"{b}attn.proj.{w}", s) for w, s in (("weight", (d, d)), ("bias", (d,)))]
        if cfg.layer_scale is not None:
            r += [copy(f"{p}layer_scale{j}.lambda1", f"{b}ls{j}.gamma", (d,)) for j in (1, 2)]
        r += [copy(f"{p}{n2}.{w}", f"{b}norm2.{w}", (d,)) for w in ("weight", "bias")]
        if cfg.mlp_type == "swiglu":
            ins, out = _SWIGLU_KEYS[spelling]
            for w, shape in (("weight", (f, d)), ("bias", (f,))):
                if len(ins) == 1:  # v4 weights_in: [gate; up] rows, our packing
                    r.append(copy(f"{p}{ins[0]}.{w}", f"{b}mlp.fc1.{w}", (2 * f,) + shape[1:]))
                else:  # v5 gate_proj then up_proj
                    r.append(Rule(f"{b}mlp.fc1.{w}", tuple(Piece(f"{p}{n}.{w}", shape) for n in ins)))
            r += [copy(f"{p}{out}.{w}", f"{b}mlp.fc2.{w}", s) for w, s in (("weight", (d, f)), ("bias", (d,)))]
        else:
            r += [copy(f"{p}{fc1}.{w}", f"{b}mlp.fc1.{w}", s) for w, s in (("weight", (f, d)), ("bias", (f,)))]
            r += [copy(f"{p}{fc2}.{w}", f"{b}mlp.fc2.{w}", s) for w, s in (("weight", (d, f)), ("bias", (d,)))]
    final = "post_layernorm" if style == "clip" else "layernorm"
    r += [copy(f"{prefix}{final}.{w}", f"norm.{w}", (d,)) for w in ("weight", "bias")]
    if cfg.pool == "map":
        h = prefix + "head."
        r.append(copy(h + "probe", "attn_pool.latent", (1, 1, d)))
        r.append(copy(h + "attention.in_proj_weight.q", "attn_pool.q.weight", (d, d)))
        r.append(copy(h + "attention.in_proj_bias.q", "attn_pool.q.bias", (d,)))
        r.append(copy(h + "attention.in_proj_weight.kv", "attn_pool.kv.weight", (2 * d, d)))
        r.append(copy(h + "attention.in_proj_bias.kv", "attn_pool.kv.bias", (2 * d,)))
        r += [
            copy(f"{h}attention.out_proj.{w}", f"attn_pool.proj.{w}", s)
            for w, s in (("weight", (d, d)), ("bias", (d,)))
        ]
        r += [copy(f"{h}layernorm.{w}", f"attn_pool.norm.{w}", (d,)) for w in ("weight", "bias")]
        r += [copy(f"{h}mlp.fc1.{w}", f"attn_pool.mlp.fc1.{w}", s) for w, s in (("weight", (f, d)), ("bias", (f,)))]
        r += [copy(f"{h}mlp.fc2.{w}", f"attn_pool.mlp.fc2.{w}", s) for w, s in (("weight", (d, f)), ("bias", (d,)))]
    if cfg.num_classes:
        if head == "project":
            r.append(copy("visual_projection.weight", "head.weight", (cfg.num_classes, d)))
        else:
            r.append(copy("classifier.weight", "head.weight", (cfg.num_classes, cfg.features_dim)))
            r.append(copy("classifier.bias", "head.bias", (cfg.num_classes,)))
    return r


# The fields each model type fixes (not in config.json): class token, registers, patch bias, norm_pre.
def _fixed(model_type: str, fam: Family) -> dict[str, Any]:
    return dict(
        class_token=model_type not in ("siglip_vision_model", "siglip", "ijepa"),
        patch_bias=model_type not in ("clip_vision_model", "clip"),
        norm_pre=model_type in ("clip_vision_model", "clip"),
        dist_token=False,
        head_dist=False,
        qk_norm=False,
        fc_norm=False,
        rep_size=0,
        posemb="learn",
        pool_include_prefix=False,
    )


def _pick_architecture(model_type: str, fam: Family, config: Mapping[str, Any], tensors, context: str):
    """(architecture, its origin, notes) from config.json ``architectures``, else from the head tensors."""
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch in _REFUSED_ARCHITECTURES:
        raise FormatError(
            f"{context}: architecture {arch} is not supported (the twins lack {_REFUSED_ARCHITECTURES[arch]})"
        )
    if arch is not None:
        if arch not in fam.architectures:
            raise FormatError(
                f"{context}: architecture {arch!r} is not supported for model_type {model_type!r}; "
                f"supported: {', '.join(fam.architectures)}"
            )
        return arch, declared("config.json architectures"), []
    want = "classify" if "classifier.weight" in tensors else "project" if "visual_projection.weight" in tensors else ""
    arch = next(
        (
            a
            for a in fam.architectures
            if ("ForImageClassification" in a) == (want == "classify")
            and (fam.architectures[a][1] == "project") == (want == "project")
        ),
        next(iter(fam.architectures)),
    )
    return (
        arch,
        declared("model_type; the head tensors present"),
        [f"config.json names no architecture: read as {arch}"],
    )


def read_family(
    tensors: Mapping[str, np.ndarray],
    config: Mapping[str, Any],
    *,
    source_image_size: tuple[int, int] | None = None,
    overrides: Mapping[str, Any] = (),
    context: str = "Hugging Face folder",
) -> Decoded:
    """Canonical state, config and provenance of a transformers folder of one of ``FAMILIES``' model types.

    Every structural field comes from config.json (a two-tower folder's ``vision_config``; a missing key
    is transformers' default) or is fixed by the model type; the tensors must all be there.

    Raises:
        FormatError: an architecture the twins do not implement (named), an invalid config value.
        StateMismatchError: tensors missing, unexpected or of the wrong shape for the declared config.
    """
    model_type = config["model_type"]
    fam = FAMILIES[model_type]
    arch, arch_origin, notes = _pick_architecture(model_type, fam, config, tensors, context)
    declared_prefix, head = fam.architectures[arch]
    vc = config.get("vision_config") if fam.two_tower else config
    if not isinstance(vc, Mapping):
        raise FormatError(f"{context}: config.json model_type={model_type!r} has no vision_config object")
    cj = _Config(vc, fam.defaults, context)
    patch_key = (
        "embeddings.patch_embedding.weight" if fam.style == "clip" else "embeddings.patch_embeddings.projection.weight"
    )
    prefix = next((p for p in dict.fromkeys((declared_prefix, "vision_model.", "")) if p + patch_key in tensors), None)
    if prefix is None or np.ndim(tensors[prefix + patch_key]) != 4:
        raise FormatError(f"{context}: no 4-D {declared_prefix}{patch_key}, so not a transformers {arch}")
    refuse_unsupported(tensors, context)
    d, c, ph, pw = positive_dims(np.shape(tensors[prefix + patch_key]), prefix + patch_key, context)
    type_origin = declared(f"model_type {model_type!r}")
    f: dict[str, Any] = _fixed(model_type, fam)
    prov: dict[str, Origin] = {k: type_origin for k in f}
    for name, key in (("width", "hidden_size"), ("depth", "num_hidden_layers"), ("num_heads", "num_attention_heads")):
        f[name], prov[name] = cj.get(key, (int,))
    f["in_chans"], prov["in_chans"] = cj.get("num_channels", (int,))
    act, prov["gelu"] = cj.get("hidden_act", (str,))
    if act not in _ACT_TO_GELU:
        raise FormatError(f"{context}: config.json hidden_act={act!r}: the twins implement {', '.join(_ACT_TO_GELU)}")
    f["gelu"] = _ACT_TO_GELU[act]
    f["ln_eps"], prov["ln_eps"] = cj.get("layer_norm_eps", (float, int))
    size, prov["image_size"] = cj.get("image_size", (int, list))
    f["image_size"] = _pair(size, "image_size", context)
    cp, prov["patch_size"] = cj.get("patch_size", (int, list))
    f["patch_size"] = _pair(cp, "patch_size", context)
    if f["patch_size"] != (ph, pw):
        raise FormatError(f"{context}: config.json patch_size={cp!r} but {prefix + patch_key} has patch {ph}x{pw}")
    if fam.style == "clip":
        f["qkv_bias"], prov["qkv_bias"] = True, type_origin
    else:
        f["qkv_bias"], prov["qkv_bias"] = cj.get("qkv_bias", (bool,))
    if fam.style == "dinov2":
        ratio, ratio_origin = cj.get("mlp_ratio", (int, float))
        if not (math.isfinite(ratio) and 0 < ratio <= 64):
            raise FormatError(f"{context}: config.json mlp_ratio={ratio!r}: expected a number in (0, 64]")
        gated, prov["mlp_type"] = cj.get("use_swiglu_ffn", (bool,))
        hidden = int(f["width"] * ratio)
        f["mlp_dim"] = (int(hidden * 2 / 3) + 7) // 8 * 8 if gated else hidden  # transformers Dinov2SwiGLUFFN
        f["mlp_type"] = "swiglu" if gated else "plain"
        prov["mlp_dim"] = ratio_origin
        f["layer_scale"] = 1.0  # transformers' layerscale_value: the init value, replaced by the loaded lambda1
    else:
        f["mlp_dim"], prov["mlp_dim"] = cj.get("intermediate_size", (int,))
        f["mlp_type"], prov["mlp_type"] = "plain", type_origin
    f["reg_tokens"], prov["reg_tokens"] = (
        cj.get("num_register_tokens", (int,)) if model_type == "dinov2_with_registers" else (0, type_origin)
    )
    f["posemb_prefix"] = not f["reg_tokens"]  # registers: the class row is folded into cls_token
    prov["posemb_prefix"] = type_origin
    spelling = _spelling(fam.style, tensors, prefix)
    layer_prefix = _layer_prefix(prefix, tensors, BLOCK_KEYS[fam.style][spelling][0])
    dropped: list[tuple[str, str]] = []
    mine = (prefix,) if prefix else ()
    if fam.two_tower or (prefix and head != "project"):
        keep = mine + ((layer_prefix,) if layer_prefix else ()) + ("visual_projection.", "classifier.")
        dropped += [
            (k, "the text tower and the contrastive logit scale (not the image tower)")
            for k in tensors
            if not k.startswith(keep) and (k.startswith("text_") or k.startswith("logit_"))
        ]
    f["pool"], prov["pool"] = ("token" if head == "project" else head), arch_origin
    if fam.style == "clip" and not f["class_token"]:  # SigLIP: the MAP head, if the folder has one
        use_head, head_origin = cj.get("vision_use_head", (bool,)) if "vision_use_head" in vc else (True, type_origin)
        if head == "map" and not use_head:
            f["pool"], prov["pool"] = "none", head_origin
        if head == "gap" or not use_head:
            reason = f"{arch} does not use the MAP head" if head == "gap" else "config.json vision_use_head=false"
            dropped += [(k, reason) for k in tensors if k.startswith(prefix + "head.")]
    mask = prefix + "embeddings.mask_token"
    if mask in tensors:
        dropped.append((mask, "mask token of masked-image modelling; unused for images"))
    if model_type == "vit_mae":
        notes.append(
            "ViT-MAE: every patch is encoded (transformers' ViTMAEModel with mask_ratio=0); its random masking is "
            "a pre-training device"
        )
    f["head_bias"], prov["head_bias"] = head != "project", arch_origin
    classifier = "visual_projection.weight" if head == "project" else "classifier.weight"
    rows = tensors.get(classifier)
    conflicts = []
    if "ForImageClassification" in arch or head == "project":
        if rows is None or np.ndim(rows) != 2:
            raise FormatError(f"{context}: {arch} without a 2-D {classifier}")
        f["num_classes"], prov["num_classes"] = int(np.shape(rows)[0]), declared(f"{classifier} rows ({arch})")
        labels = config.get("id2label")
        if "ForImageClassification" in arch and isinstance(labels, dict) and len(labels) != f["num_classes"]:
            conflicts.append(f"config.json has {len(labels)} labels but the classifier has {f['num_classes']} rows")
    else:
        f["num_classes"], prov["num_classes"] = 0, arch_origin
    carried_assumptions(config.get(ASSUMED_KEY), prov, context)
    f["posemb_resample"] = fam.resample
    dt = common_float_dtype({k: v for k, v in tensors.items() if k.startswith(mine) or not mine})
    if dt in ("float32", "float64", "bfloat16", "float16"):
        f["param_dtype"] = dt
    cfg = build_config(f, prov, dict(overrides), context)
    ignored = {k for k, _ in dropped}
    kept = split_in_proj({k: v for k, v in tensors.items() if k not in ignored}, prefix)
    if cfg.reg_tokens:
        kept = fold_class_row(kept, prefix)
        notes.append("position embedding's class row added to cls_token (registers follow the position embedding)")
    state = to_canonical(rules(cfg, fam.style, spelling, prefix, layer_prefix, head), kept, context)
    return Decoded(cfg, state, f"{arch}, {spelling} key names", prov, dropped, notes, conflicts, model_type)


_GELU_TO_ACT = {"exact": "gelu", "tanh": "gelu_pytorch_tanh", "quick": "quick_gelu"}


def _dinov2_ratio(cfg: ViTConfig) -> int | None:
    """The integer ``mlp_ratio`` (transformers 5.24's Dinov2Config types it int) that gives cfg.mlp_dim:
    hidden = D * mlp_ratio, for SwiGLU rounded as (int(hidden * 2 / 3) + 7) // 8 * 8; None if none does."""
    for ratio in range(1, 65):
        h = cfg.width * ratio
        if (h if cfg.mlp_type == "plain" else (int(h * 2 / 3) + 7) // 8 * 8) == cfg.mlp_dim:
            return ratio
    return None


def _holders(cfg: ViTConfig) -> dict[str, str]:
    """model_type -> architecture of each transformers family that holds ``cfg``'s outputs, in the order
    ``family_for`` prefers them: CLIP (norm_pre, no patch bias, class token), SigLIP (no class token, MAP
    head or every token, no classes), DINOv2 with or without registers (LayerScale and a class token;
    backbone or token_gap classifier), I-JEPA (no class token, mean pooling), then ViT-MAE (the encoder,
    no classes) and ViT-MSN (backbone or classifier) for a plain ViT pooling its class token."""
    out: dict[str, str] = {}
    plain = cfg.class_token and cfg.pool == "token" and not cfg.norm_pre and cfg.layer_scale is None
    if cfg.norm_pre and not cfg.patch_bias and cfg.class_token and cfg.pool == "token":
        out["clip_vision_model"] = "CLIPVisionModelWithProjection" if cfg.num_classes else "CLIPVisionModel"
    if not cfg.class_token and cfg.pool in ("map", "none") and not cfg.num_classes:
        out["siglip_vision_model"] = "SiglipVisionModel"
    if (
        cfg.class_token
        and cfg.layer_scale is not None
        and (cfg.pool, bool(cfg.num_classes))
        in (
            ("token", False),
            ("token_gap", True),
        )
    ):
        mt = "dinov2_with_registers" if cfg.reg_tokens else "dinov2"
        name = "Dinov2WithRegisters" if cfg.reg_tokens else "Dinov2"
        out[mt] = f"{name}{'ForImageClassification' if cfg.num_classes else 'Model'}"
    if not cfg.class_token and cfg.pool == "gap" and not cfg.reg_tokens:
        out["ijepa"] = "IJepaForImageClassification" if cfg.num_classes else "IJepaModel"
    if plain and not cfg.num_classes:
        out["vit_mae"] = "ViTMAEModel"
    if plain:
        out["vit_msn"] = "ViTMSNForImageClassification" if cfg.num_classes else "ViTMSNModel"
    return out


def family_for(cfg: ViTConfig, model_type: str | None = None) -> tuple[str, str] | None:
    """(model_type, architecture) of the transformers family that holds ``cfg`` (``_holders``), or None:
    ``model_type`` where given and it holds the model, else the first of CLIP, SigLIP, DINOv2 and I-JEPA
    (a plain ViT is the hf format's unless ``vit_mae`` or ``vit_msn`` is asked for)."""
    holders = _holders(cfg)
    if model_type is not None:
        return (model_type, holders[model_type]) if model_type in holders else None
    return next(((mt, a) for mt, a in holders.items() if mt not in ("vit_mae", "vit_msn")), None)


def config_json(cfg: ViTConfig, model_type: str, arch: str) -> dict[str, Any]:
    """The config.json of a ``model_type`` folder of architecture ``arch`` holding ``cfg``."""
    (ih, _), (ph, _) = cfg.image_size, cfg.patch_size
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "num_channels": cfg.in_chans,
        "image_size": ih,
        "patch_size": ph,
        "hidden_act": _GELU_TO_ACT[cfg.gelu],
        "layer_norm_eps": cfg.ln_eps,
        "dtype": cfg.param_dtype,
    }
    if FAMILIES[model_type].style == "dinov2":
        config |= {
            "mlp_ratio": _dinov2_ratio(cfg),
            "use_swiglu_ffn": cfg.mlp_type == "swiglu",
            "qkv_bias": cfg.qkv_bias,
            "layerscale_value": 1.0,
            "use_mask_token": True,
        } | ({"num_register_tokens": cfg.reg_tokens} if cfg.reg_tokens else {})
    else:
        config["intermediate_size"] = cfg.mlp_dim
    if FAMILIES[model_type].style == "vit":
        config["qkv_bias"] = cfg.qkv_bias
    if model_type == "vit_mae":
        config["mask_ratio"] = 0.0  # ViTMAEModel encodes every patch (in its random order: attention is blind to it)
    if model_type == "siglip_vision_model":
        config["vision_use_head"] = cfg.pool == "map"
    if model_type == "clip_vision_model" and cfg.num_classes:
        config["projection_dim"] = cfg.num_classes
    if "ForImageClassification" in arch:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_classes)}
    return config


class HfFamilies(HuggingFace):
    """transformers folders of the model types in ``FAMILIES``: read, and written as the family that
    holds the model (``family_for``) with HF ViT's folder layout, preprocessing and class names."""

    name = "hf_family"
    description = "Hugging Face transformers SigLIP, CLIP, DINOv2, ViT-MAE, ViT-MSN or I-JEPA folder"
    signature = "a folder whose config.json model_type is " + ", ".join(FAMILIES)

    def export_name(self, source=None) -> str:
        return "model_hf_family"

    def detect(self, src: Source) -> bool:
        return src.container == "hf_folder" and is_family(src.config)

    def read(self, src: Source, opts) -> Decoded:
        return read_family(
            src.tensors,
            src.config,
            source_image_size=opts.source_image_size,
            overrides=opts.overrides,
            context=src.context,
        )

    def cannot_hold(self, cfg: ViTConfig, model_type: str | None = None) -> list[str]:
        """What ``cfg`` has that the family it would be written as (``family_for``, ``model_type`` where
        given) cannot hold."""
        found = family_for(cfg, model_type)
        if found is None:
            which = f"{model_type} model" if model_type else "SigLIP, CLIP, DINOv2 or I-JEPA model"
            return [
                f"no {which} has class_token={cfg.class_token}, pool={cfg.pool!r}, "
                f"num_classes={cfg.num_classes}, norm_pre={cfg.norm_pre}, LayerScale={cfg.layer_scale is not None} "
                "(write hf for a ViT, or --hf-model-type vit_mae / vit_msn; timm or canonical)"
            ]
        model_type, _ = found
        style = FAMILIES[model_type].style
        (ih, iw), (ph, pw) = cfg.image_size, cfg.patch_size
        return unsupported(
            model_type,
            {
                f"image_size={cfg.image_size} (a square size only)": ih != iw,
                f"patch_size={cfg.patch_size} (a square patch only)": ph != pw,
                "qk_norm": cfg.qk_norm,
                "fc_norm": cfg.fc_norm,
                f"rep_size={cfg.rep_size}": cfg.rep_size > 0,
                "a distillation token": cfg.dist_token,
                "posemb='none'": cfg.posemb == "none",
                "pool_include_prefix=True": cfg.pool_include_prefix and cfg.num_prefix_tokens > 0,
                "qkv_bias=False": style == "clip" and not cfg.qkv_bias,
                "patch_bias=False": model_type != "clip_vision_model" and not cfg.patch_bias,
                "mlp_type='swiglu'": style != "dinov2" and cfg.mlp_type == "swiglu",
                f"mlp_dim={cfg.mlp_dim} (no integer DINOv2 mlp_ratio gives it)": style == "dinov2"
                and _dinov2_ratio(cfg) is None,
                "LayerScale": style != "dinov2" and cfg.layer_scale is not None,
                "head_bias=True (CLIP's projection has no bias)": model_type == "clip_vision_model"
                and cfg.num_classes > 0
                and cfg.head_bias,
                "head_bias=False": model_type != "clip_vision_model" and cfg.num_classes > 0 and not cfg.head_bias,
                "registers without posemb_prefix=False": cfg.reg_tokens > 0 and cfg.posemb_prefix,
            },
        )

    def complete_options(self, options, source) -> HfWriteOptions:
        """A source read from a ``vit_mae`` or ``vit_msn`` folder is written as its own model type where
        ``options`` name none and that type holds the model."""
        mt = getattr(source, "model_type", "")
        if isinstance(options, HfWriteOptions) and options.model_type is None and mt in ("vit_mae", "vit_msn"):
            if source.config is not None and family_for(source.config, mt) is not None:
                return dataclasses.replace(options, model_type=mt)
        return options

    def encode(self, cfg: ViTConfig, state, path, options, assumed=()) -> Encoded:
        refuse("hf_family", self.cannot_hold(cfg, options.model_type))
        if options.spelling not in ("v4", "v5"):
            raise ValueError(f"spelling={options.spelling!r}: expected 'v4' or 'v5'")
        model_type, arch = family_for(cfg, options.model_type)
        fam = FAMILIES[model_type]
        spelling = options.spelling if options.spelling in BLOCK_KEYS[fam.style] else "v4"
        cfg, state, notes = materialize_posemb(cfg, state, prefix_rows=not cfg.reg_tokens)
        prefix, head = fam.architectures[arch]
        config = config_json(cfg, model_type, arch) | ({ASSUMED_KEY: sorted(assumed)} if assumed else {})
        tensors = from_canonical(rules(cfg, fam.style, spelling, prefix, prefix, head), state)
        tensors = pack_in_proj(tensors, prefix)
        if cfg.reg_tokens:
            tensors = unfold_class_row(tensors, prefix)
        if fam.style == "dinov2":
            any_param = np.asarray(state["cls_token"])
            tensors[prefix + "embeddings.mask_token"] = np.zeros((1, cfg.width), any_param.dtype)
            notes.append(
                "embeddings.mask_token written as zeros (transformers' DINOv2 builds one; images never use it)"
            )
        if spelling != options.spelling:
            notes.append(f"{model_type} has one key spelling; written in it")
        return Encoded(cfg, state, tensors, config, None, notes)

    def decode(self, enc: Encoded) -> Decoded:
        return read_family(enc.tensors, enc.config_json, context="hf_family read-back")

    def load_call(self, path, cfg: ViTConfig) -> str:
        arch = io.read_json(Path(path) / "config.json")["architectures"][0]  # the folder just written
        return "\n".join(
            [
                "import transformers",
                f"model, info = transformers.{arch}.from_pretrained({str(path)!r}, output_loading_info=True)",
                "assert not any(info.values()), info  # no missing, unexpected or mismatched tensor",
            ]
        )


FORMAT = HfFamilies()
