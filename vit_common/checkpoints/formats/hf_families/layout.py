"""The tensor layouts of the hf_family format's model types (``vit_common.checkpoints.formats.hf_families``,
which holds its ``FORMAT``; this module has none), by block style: the file <-> canonical rules
(``rules``), which key spelling a file uses, where its blocks are, and the packings transformers uses
that the canonical state does not (SigLIP's MAP ``in_proj``, the class row of dinov2_with_registers'
position embedding).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from vit_common.checkpoints.formats.hf_common import BLOCK_KEYS
from vit_common.checkpoints.formats.rules import Piece, Rule, copy
from vit_common.config import ViTConfig

# DINOv2's SwiGLU FFN per spelling: (packed [gate; up] or the two halves, down)
_SWIGLU_KEYS = {
    "v4": (("mlp.weights_in",), "mlp.weights_out"),
    "v5": (("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj"),
}


def find_spelling(style: str, tensors: Mapping[str, np.ndarray], prefix: str) -> str:
    """The key spelling (``BLOCK_KEYS[style]``) of the blocks under ``prefix``: 'v5' where transformers 5
    module names are found, else 'v4'."""
    if style == "vit" and any(k.startswith(f"{prefix}layers.") for k in tensors):
        return "v5"
    if style == "dinov2" and any(".attention.q_proj." in k for k in tensors):
        return "v5"
    return "v4"


def find_layer_prefix(prefix: str, tensors: Mapping[str, np.ndarray], layer: str) -> str:
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
