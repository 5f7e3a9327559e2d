"""Hugging Face transformers ViT folders (config.json + weights) <-> the canonical state.

Two key spellings exist. Published files and every ``save_pretrained`` (transformers 4.x, and 5.x,
which renames on save) use the v4 one; the v5 module names appear in ``state_dict()`` of transformers
5.x models and files saved from it directly:

===================== =============================================== ===================================
canonical             v4 (files)                                      v5 (transformers 5 modules)
===================== =============================================== ===================================
blocks.i.norm1        encoder.layer.i.layernorm_before                layers.i.layernorm_before
blocks.i.attn.qkv     encoder.layer.i.attention.attention.{query,     layers.i.attention.{q,k,v}_proj
                      key,value} (concatenated, rows [q; k; v])
blocks.i.attn.proj    encoder.layer.i.attention.output.dense          layers.i.attention.o_proj
blocks.i.norm2        encoder.layer.i.layernorm_after                 layers.i.layernorm_after
blocks.i.mlp.fc1/fc2  encoder.layer.i.intermediate.dense /            layers.i.mlp.fc1 / fc2
                      encoder.layer.i.output.dense
===================== =============================================== ===================================

Embeddings are ``embeddings.{cls_token, position_embeddings, patch_embeddings.projection}``, the final
norm ``layernorm``; ``ViTForImageClassification`` prefixes all of these with ``vit.`` and adds
``classifier`` (our ``head``); ``ViTModel`` may add ``pooler.dense`` (dense + tanh on the class token:
our ``pre_logits.fc`` with rep_size = pooler_output_size). config.json gives the LayerNorm eps (HF's
default is 1e-12) and the GELU variant (``hidden_act`` 'gelu' = exact erf; 'gelu_pytorch_tanh' and
'gelu_new' = tanh approximation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from vit_common.config import ViTConfig
from vit_common.formats.base import (
    Decoded,
    FormatError,
    Piece,
    Rule,
    build_config,
    common_float_dtype,
    copy,
    from_canonical,
    guess_num_heads,
    materialize_posemb,
    posemb_layout,
    positive_dims,
    shape_fields,
    to_canonical,
    unsupported,
)

_ACT_TO_GELU = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}
_GELU_TO_ACT = {"exact": "gelu", "tanh": "gelu_pytorch_tanh"}
_NAMES = {  # spelling -> (layer prefix, q, k, v, o, fc1, fc2)
    "v4": (
        "encoder.layer.{i}.",
        "attention.attention.query",
        "attention.attention.key",
        "attention.attention.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    ),
    "v5": (
        "layers.{i}.",
        "attention.q_proj",
        "attention.k_proj",
        "attention.v_proj",
        "attention.o_proj",
        "mlp.fc1",
        "mlp.fc2",
    ),
}
_PATCH_KEY = "embeddings.patch_embeddings.projection.weight"
_MASK_TOKEN = "embeddings.mask_token"


def is_hf(keys) -> bool:
    """True if the key names are a transformers ViTModel / ViTForImageClassification state_dict."""
    return any(k in (_PATCH_KEY, "vit." + _PATCH_KEY) for k in keys)


def _pair(v: Any, name: str, context: str) -> tuple[int, int]:
    pair = [v, v] if not isinstance(v, (list, tuple)) else list(v)
    if len(pair) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in pair):
        return pair[0], pair[1]
    raise FormatError(f"{context}: config.json {name}={v!r} is not a positive int or [H, W]")


def _get(config: Mapping[str, Any], key: str, default: Any, types: tuple, context: str) -> Any:
    v = config.get(key, default)
    if not isinstance(v, types) or isinstance(v, bool) and bool not in types:
        raise FormatError(f"{context}: config.json {key}={v!r} is not a {' or '.join(t.__name__ for t in types)}")
    return v


def rules(cfg: ViTConfig, spelling: str = "v4", prefix: str = "") -> list[Rule]:
    """File <-> canonical rules for an HF ViT with ``cfg``; ``prefix`` is 'vit.' for classification."""
    d = cfg.width
    layer, q, k, v, o, fc1, fc2 = _NAMES[spelling]
    e = prefix + "embeddings."
    ph, pw = cfg.patch_size
    r = [
        copy(e + "cls_token", "cls_token", (1, 1, d)),
        copy(e + "position_embeddings", "pos_embed", (1, cfg.posemb_len, d)),
        copy(e + "patch_embeddings.projection.weight", "patch_embed.proj.weight", (d, cfg.in_chans, ph, pw)),
        copy(e + "patch_embeddings.projection.bias", "patch_embed.proj.bias", (d,)),
    ]
    for i in range(cfg.depth):
        lp, b = prefix + layer.format(i=i), f"blocks.{i}."
        r += [copy(f"{lp}layernorm_before.{w}", f"{b}norm1.{w}", (d,)) for w in ("weight", "bias")]
        r.append(Rule(b + "attn.qkv.weight", tuple(Piece(f"{lp}{n}.weight", (d, d)) for n in (q, k, v))))
        if cfg.qkv_bias:
            r.append(Rule(b + "attn.qkv.bias", tuple(Piece(f"{lp}{n}.bias", (d,)) for n in (q, k, v))))
        r += [
            copy(f"{lp}{o}.weight", b + "attn.proj.weight", (d, d)),
            copy(f"{lp}{o}.bias", b + "attn.proj.bias", (d,)),
        ]
        r += [copy(f"{lp}layernorm_after.{w}", f"{b}norm2.{w}", (d,)) for w in ("weight", "bias")]
        r += [
            copy(f"{lp}{fc1}.weight", b + "mlp.fc1.weight", (cfg.mlp_dim, d)),
            copy(f"{lp}{fc1}.bias", b + "mlp.fc1.bias", (cfg.mlp_dim,)),
            copy(f"{lp}{fc2}.weight", b + "mlp.fc2.weight", (d, cfg.mlp_dim)),
            copy(f"{lp}{fc2}.bias", b + "mlp.fc2.bias", (d,)),
        ]
    r += [copy(f"{prefix}layernorm.{w}", f"norm.{w}", (d,)) for w in ("weight", "bias")]
    if cfg.rep_size:
        r += [
            copy(f"{prefix}pooler.dense.weight", "pre_logits.fc.weight", (cfg.rep_size, d)),
            copy(f"{prefix}pooler.dense.bias", "pre_logits.fc.bias", (cfg.rep_size,)),
        ]
    if cfg.num_classes:
        r += [
            copy("classifier.weight", "head.weight", (cfg.num_classes, cfg.features_dim)),
            copy("classifier.bias", "head.bias", (cfg.num_classes,)),
        ]
    return r


def read(
    tensors: Mapping[str, np.ndarray],
    config: Mapping[str, Any] | None,
    *,
    source_image_size: tuple[int, int] | None = None,
    overrides: Mapping[str, Any] = (),
    context: str = "Hugging Face folder",
) -> Decoded:
    """Canonical state and config of an HF ViT state_dict and its config.json (None if absent).

    Raises:
        FormatError: not an HF ViT (model_type, hidden_act or shapes), or an invalid inferred config.
        StateMismatchError: tensors missing, unexpected or of the wrong shape (file names).
    """
    overrides = dict(overrides)
    prefix = "vit." if "vit." + _PATCH_KEY in tensors else ""
    if prefix + _PATCH_KEY not in tensors or np.ndim(tensors[prefix + _PATCH_KEY]) != 4:
        raise FormatError(f"{context}: no 4-D {prefix + _PATCH_KEY}, so not a transformers ViT")
    spelling = "v5" if f"{prefix}layers.0.layernorm_before.weight" in tensors else "v4"
    d, c, ph, pw = positive_dims(np.shape(tensors[prefix + _PATCH_KEY]), prefix + _PATCH_KEY, context)
    grid = (source_image_size[0] // ph, source_image_size[1] // pw) if source_image_size else None
    layer = prefix + _NAMES[spelling][0]
    depth = 0
    while f"{layer.format(i=depth)}layernorm_before.weight" in tensors:
        depth += 1
    fc1 = f"{layer.format(i=0)}{_NAMES[spelling][5]}.weight"
    if depth == 0 or fc1 not in tensors or np.ndim(tensors[fc1]) != 2:
        raise FormatError(f"{context}: no {layer.format(i=0)}layernorm_before.weight / {fc1}")
    src = "config.json" if config is not None else "tensor shapes"
    f, inferred = shape_fields(
        patch_size=(ph, pw),
        in_chans=c,
        width=d,
        depth=depth,
        mlp_dim=np.shape(tensors[fc1])[0],
        qkv_bias=f"{layer.format(i=0)}{_NAMES[spelling][1]}.bias" in tensors,
    )
    dropped, notes = [], []
    pe = tensors.get(prefix + "embeddings.position_embeddings")
    pe = pe if pe is not None and np.ndim(pe) == 3 else None
    rows = np.shape(pe)[1] if pe is not None else 0
    if config is not None:
        if config.get("model_type", "vit") != "vit":
            raise FormatError(f"{context}: config.json model_type={config.get('model_type')!r}, expected 'vit'")
        act = _get(config, "hidden_act", "gelu", (str,), context)
        if act not in _ACT_TO_GELU:
            raise FormatError(f"{context}: config.json hidden_act={act!r}; expected one of {tuple(_ACT_TO_GELU)}")
        f["gelu"], f["ln_eps"] = (
            _ACT_TO_GELU[act],
            _get(config, "layer_norm_eps", 1e-12, (float, int), context),
        )
        inferred["gelu"] = f"config.json hidden_act={act!r}"
        inferred["ln_eps"] = "config.json layer_norm_eps"
        if "num_heads" not in overrides:
            f["num_heads"] = _get(config, "num_attention_heads", 12, (int,), context)
            inferred["num_heads"] = src
        ih = _pair(config.get("image_size", 224), "image_size", context)
        cp = _pair(config.get("patch_size", 16), "patch_size", context)
        grid = grid or (ih[0] // cp[0], ih[1] // cp[1])
        labels = config.get("id2label")
        n_labels = len(labels) if isinstance(labels, dict) else config.get("num_labels")
        n_labels = n_labels if isinstance(n_labels, int) else None
    else:
        f["gelu"], f["ln_eps"] = "exact", 1e-12
        inferred["gelu"] = inferred["ln_eps"] = "format default (no config.json): transformers ViTConfig"
        if "num_heads" not in overrides:
            f["num_heads"], inferred["num_heads"] = guess_num_heads(d)
        n_labels = None
        notes.append("no config.json beside the weights: config inferred from tensor shapes")
    if pe is None and grid is None:
        raise FormatError(f"{context}: no {prefix}embeddings.position_embeddings and no config.json image size")
    (gh, gw), _ = posemb_layout(rows, 1, grid, f"{context}: position_embeddings") if pe is not None else (grid, True)
    f["image_size"], inferred["image_size"] = (gh * ph, gw * pw), src
    f["posemb_prefix"] = True
    f["posemb_resample"] = "bicubic"
    inferred["posemb_resample"] = "format default: transformers interpolate_pos_encoding (bicubic, no antialias)"
    f["rep_size"] = (
        np.shape(tensors[prefix + "pooler.dense.weight"])[0] if prefix + "pooler.dense.weight" in tensors else 0
    )
    head = tensors.get("classifier.weight")
    f["num_classes"] = np.shape(head)[0] if head is not None and np.ndim(head) == 2 else 0
    inferred["num_classes"] = "classifier shape"
    conflicts = []
    if n_labels is not None and head is not None and n_labels != f["num_classes"]:
        conflicts.append(f"config.json has {n_labels} labels but classifier.weight has {f['num_classes']} rows")
    if prefix + _MASK_TOKEN in tensors:
        dropped.append((prefix + _MASK_TOKEN, "mask token of masked-image-modelling pretraining; unused for images"))
    dt = common_float_dtype(tensors)
    if dt in ("float32", "float64", "bfloat16", "float16"):
        f["param_dtype"] = dt
    cfg = build_config(f, inferred, overrides, context)
    kept = {k: v for k, v in tensors.items() if k != prefix + _MASK_TOKEN}
    state = to_canonical(rules(cfg, spelling, prefix), kept, context)
    arch = "ViTForImageClassification" if prefix else "ViTModel"
    return Decoded(cfg, state, f"{arch}, {spelling} key names", inferred, dropped, notes, conflicts)


def prepare(cfg: ViTConfig, state: Mapping[str, np.ndarray]) -> tuple[ViTConfig, dict[str, np.ndarray], list[str]]:
    """Config and tensors as an HF ViT holds them (raises ValueError naming what it cannot hold)."""
    unsupported(
        "Hugging Face ViT",
        cfg,
        {
            "class_token=False (HF ViT always has a class token)": not cfg.class_token,
            f"reg_tokens={cfg.reg_tokens}": cfg.reg_tokens > 0,
            f"pool={cfg.pool!r} (HF ViT pools the class token)": cfg.pool != "token",
            "LayerScale": cfg.layer_scale is not None,
            "qk_norm": cfg.qk_norm,
            "fc_norm": cfg.fc_norm,
            "posemb='none'": cfg.posemb == "none",
            "both rep_size and a head (ViTModel has the pooler, ViTForImageClassification the classifier)": (
                cfg.rep_size > 0 and cfg.num_classes > 0
            ),
        },
    )
    return materialize_posemb(cfg, state, prefix_rows=True)


def write(
    cfg: ViTConfig, state: Mapping[str, np.ndarray], spelling: str = "v4"
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json dict, file tensors) of an already ``prepare``d state.

    ``num_classes > 0`` gives ViTForImageClassification, otherwise ViTModel (with the pooler when
    rep_size > 0; without it, load with ``ViTModel.from_pretrained(path, add_pooling_layer=False)``).
    ``spelling`` 'v4' (what save_pretrained writes; loads in transformers 4 and 5) or 'v5'.
    """
    if spelling not in _NAMES:
        raise ValueError(f"spelling={spelling!r}: expected 'v4' or 'v5'")
    prefix = "vit." if cfg.num_classes > 0 else ""
    return config_json(cfg), from_canonical(rules(cfg, spelling, prefix), state)


def config_json(cfg: ViTConfig) -> dict[str, Any]:
    """The config.json of an HF ViT folder for ``cfg``: also the keyword arguments of
    ``transformers.ViTConfig`` that build the same model."""
    classify = cfg.num_classes > 0
    (ih, iw), (ph, pw) = cfg.image_size, cfg.patch_size
    config: dict[str, Any] = {
        "architectures": ["ViTForImageClassification" if classify else "ViTModel"],
        "model_type": "vit",
        "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": _GELU_TO_ACT[cfg.gelu],
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attn_dropout,
        "initializer_range": 0.02,
        "layer_norm_eps": cfg.ln_eps,
        "image_size": ih if ih == iw else [ih, iw],
        "patch_size": ph if ph == pw else [ph, pw],
        "num_channels": cfg.in_chans,
        "qkv_bias": cfg.qkv_bias,
        "encoder_stride": ph,
        "pooler_output_size": cfg.rep_size or cfg.width,
        "pooler_act": "tanh",
        "dtype": cfg.param_dtype,
    }
    if classify:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_classes)}
    return config
