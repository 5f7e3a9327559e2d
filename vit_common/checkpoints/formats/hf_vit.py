"""Hugging Face transformers ViT and DeiT folders for the hf format (``vit_common.checkpoints.formats.hf``,
which holds its ``FORMAT`` and describes the layout; this module has none): the model types and
architectures read, the file <-> canonical rules, reading a state_dict with its config.json
(``read_tensors``) and the config.json written (``config_json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf_common import ACT_TO_GELU, BLOCK_KEYS, FAMILY_MODEL_TYPES, GELU_TO_ACT, size_pair
from vit_common.checkpoints.formats.protocol import Decoded
from vit_common.checkpoints.formats.provenance import (
    ASSUMED_KEY,
    Origin,
    assumed,
    build_config,
    carried_assumptions,
    common_float_dtype,
    declared,
    derived,
    guess_num_heads,
    posemb_layout,
    positive_dims,
    refuse_unsupported,
    square_grid_origin,
)
from vit_common.checkpoints.formats.rules import LAYERNORM_ALL_BIASES, Piece, Rule, copy, to_canonical
from vit_common.config import ViTConfig

_NAMES = BLOCK_KEYS["vit"]
_PATCH_KEY = "embeddings.patch_embeddings.projection.weight"
MODEL_TYPES = ("vit", "deit")
# architecture -> (model_type, head): 'backbone' | 'classify' | 'teacher'
ARCHITECTURES = {
    "ViTModel": ("vit", "backbone"),
    "ViTForImageClassification": ("vit", "classify"),
    "DeiTModel": ("deit", "backbone"),
    "DeiTForImageClassification": ("deit", "classify"),
    "DeiTForImageClassificationWithTeacher": ("deit", "teacher"),
}
_REFUSED_ARCHITECTURES = {
    "ViTForMaskedImageModeling": "a masked-image-modelling decoder",
    "DeiTForMaskedImageModeling": "a masked-image-modelling decoder",
}
_REFUSED_MODEL_TYPES = {
    "beit": "relative position tables and q/v biases",
    "data2vec-vision": "relative position tables and q/v biases",
    "vit_hybrid": "a convolutional stem",
    "perception_lm": "rotary position embeddings (Perception Encoder)",
    "pe_video": "rotary position embeddings (Perception Encoder)",
}


def is_hf(keys) -> bool:
    """True if the key names are a transformers ViT or DeiT state_dict."""
    return any(k in (_PATCH_KEY, "vit." + _PATCH_KEY, "deit." + _PATCH_KEY) for k in keys)


class _Config:
    """config.json values with provenance: a missing key takes transformers' default (declared too:
    that is what transformers builds from the folder)."""

    def __init__(self, config: Mapping[str, Any], context: str):
        self.config, self.context = config, context

    def get(self, key: str, default: Any, types: tuple) -> tuple[Any, Origin]:
        if key not in self.config or self.config[key] is None and default is None:
            return default, declared(f"transformers' default for a missing {key}")
        v = self.config[key]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise FormatError(
                f"{self.context}: config.json {key}={v!r} is not a {' or '.join(t.__name__ for t in types)}"
            )
        return v, declared(f"config.json {key}")


def _architecture(config: Mapping[str, Any] | None, tensors: Mapping[str, np.ndarray], context: str):
    """(model_type, architecture, head kind, origin, notes) from config.json, else from the tensors."""
    has_dist = any(k.endswith("embeddings.distillation_token") for k in tensors)
    by_tensors = (
        "teacher"
        if "cls_classifier.weight" in tensors
        else "classify"
        if "classifier.weight" in tensors
        else "backbone"
    )
    notes = []
    model_type = (config or {}).get("model_type")
    if model_type is None:
        model_type = "deit" if has_dist else "vit"
        if config is not None:
            notes.append(f"config.json has no model_type: {model_type} read from the tensors")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        what = _REFUSED_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
        if model_type in FAMILY_MODEL_TYPES:
            raise FormatError(f"{context}: model_type={model_type!r} is the hf_family format's (--from hf_family)")
        raise FormatError(
            f"{context}: config.json model_type={model_type!r} is not supported"
            + (f" (the twins lack {what})" if what else "")
            + f"; supported: {', '.join(MODEL_TYPES)} (hf) and {', '.join(FAMILY_MODEL_TYPES)} (hf_family)"
        )
    archs = (config or {}).get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch in _REFUSED_ARCHITECTURES:
        raise FormatError(
            f"{context}: architecture {arch} is not supported (the twins lack {_REFUSED_ARCHITECTURES[arch]})"
        )
    if arch is not None:
        if arch not in ARCHITECTURES or ARCHITECTURES[arch][0] != model_type:
            known = [a for a, (mt, _) in ARCHITECTURES.items() if mt == model_type]
            raise FormatError(
                f"{context}: architecture {arch!r} is not supported for model_type {model_type!r}; "
                f"supported: {', '.join(known)}"
            )
        return model_type, arch, ARCHITECTURES[arch][1], declared("config.json architectures"), notes
    arch = next(a for a, (mt, h) in ARCHITECTURES.items() if mt == model_type and h == by_tensors)
    why = "config.json names no architecture" if config is not None else "no config.json"
    notes.append(f"{why}: read as {arch} from its tensors")
    return model_type, arch, by_tensors, derived("the head tensors present"), notes


def rules(cfg: ViTConfig, spelling: str = "v4", prefix: str = "", head: str = "classify") -> list[Rule]:
    """File <-> canonical rules for an HF ViT/DeiT with ``cfg``; ``prefix`` is 'vit.' or 'deit.' for task
    models; ``head`` is 'backbone', 'classify' or 'teacher'."""
    d = cfg.width
    layer, n1, q, k, v, o, n2, fc1, fc2 = _NAMES[spelling]
    e = prefix + "embeddings."
    ph, pw = cfg.patch_size
    r = [
        copy(e + "cls_token", "cls_token", (1, 1, d)),
        copy(e + "position_embeddings", "pos_embed", (1, cfg.posemb_len, d)),
        copy(e + "patch_embeddings.projection.weight", "patch_embed.proj.weight", (d, cfg.in_chans, ph, pw)),
        copy(e + "patch_embeddings.projection.bias", "patch_embed.proj.bias", (d,)),
    ]
    if cfg.dist_token:
        r.append(copy(e + "distillation_token", "dist_token", (1, 1, d)))
    for i in range(cfg.depth):
        lp, b = prefix + layer.format(i=i), f"blocks.{i}."
        r += [copy(f"{lp}{n1}.{w}", f"{b}norm1.{w}", (d,)) for w in ("weight", "bias")]
        r.append(Rule(b + "attn.qkv.weight", tuple(Piece(f"{lp}{n}.weight", (d, d)) for n in (q, k, v))))
        if cfg.qkv_bias:
            r.append(Rule(b + "attn.qkv.bias", tuple(Piece(f"{lp}{n}.bias", (d,)) for n in (q, k, v))))
        r += [
            copy(f"{lp}{o}.weight", b + "attn.proj.weight", (d, d)),
            copy(f"{lp}{o}.bias", b + "attn.proj.bias", (d,)),
        ]
        r += [copy(f"{lp}{n2}.{w}", f"{b}norm2.{w}", (d,)) for w in ("weight", "bias")]
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
        names = (("cls_classifier", "head"), ("distillation_classifier", "head_dist"))
        for src, dst in names if head == "teacher" else (("classifier", "head"),):
            r += [
                copy(f"{src}.weight", f"{dst}.weight", (cfg.num_classes, cfg.features_dim)),
                copy(f"{src}.bias", f"{dst}.bias", (cfg.num_classes,)),
            ]
    return r


def read_tensors(
    tensors: Mapping[str, np.ndarray],
    config: Mapping[str, Any] | None,
    *,
    source_image_size: tuple[int, int] | None = None,
    overrides: Mapping[str, Any] = (),
    context: str = "Hugging Face folder",
) -> Decoded:
    """Canonical state, config and provenance of an HF ViT/DeiT state_dict and its config.json (None if
    there is none: then the config is read off the tensors, with the head count, GELU, eps and a square
    grid assumed).

    Raises:
        FormatError: not a transformers ViT/DeiT the twins implement (model type, architecture,
            activation named), or an invalid config.
        StateMismatchError: tensors missing, unexpected or of the wrong shape for the declared config.
    """
    overrides = dict(overrides)
    model_type, arch, head, arch_origin, notes = _architecture(config, tensors, context)
    prefix = f"{model_type}." if f"{model_type}.{_PATCH_KEY}" in tensors else ""
    patch = tensors.get(prefix + _PATCH_KEY)
    if patch is None or np.ndim(patch) != 4:
        raise FormatError(f"{context}: no 4-D {prefix + _PATCH_KEY}, so not a transformers {arch}")
    refuse_unsupported(tensors, context)
    spelling = "v5" if any(k.startswith(f"{prefix}layers.") for k in tensors) else "v4"
    d, c, ph, pw = positive_dims(np.shape(patch), prefix + _PATCH_KEY, context)
    layer = prefix + _NAMES[spelling][0]
    dropped = []
    arch_prov = {
        "class_token": arch_origin,
        "dist_token": declared("model_type") if config and "model_type" in config else arch_origin,
        "head_dist": arch_origin,
        "pool": arch_origin,
        "pool_include_prefix": arch_origin,
        "reg_tokens": arch_origin,
        "posemb": arch_origin,
        "posemb_prefix": arch_origin,
        "norm_pre": arch_origin,
        "fc_norm": arch_origin,
        "patch_bias": arch_origin,
        "qk_norm": arch_origin,
        "mlp_type": arch_origin,
        "head_bias": arch_origin,
    } | {k: arch_origin for k in LAYERNORM_ALL_BIASES}
    f: dict[str, Any] = dict(
        class_token=True,
        dist_token=model_type == "deit",
        head_dist=head == "teacher",
        pool="token",
        pool_include_prefix=False,
        reg_tokens=0,
        posemb="learn",
        posemb_prefix=True,
        norm_pre=False,
        fc_norm=False,
        patch_bias=True,
        qk_norm=False,
        mlp_type="plain",
        head_bias=True,
        **LAYERNORM_ALL_BIASES,
    )
    prov: dict[str, Origin] = dict(arch_prov)
    if config is not None:
        cj = _Config(config, context)
        for name, key, default in (
            ("width", "hidden_size", 768),
            ("depth", "num_hidden_layers", 12),
            ("num_heads", "num_attention_heads", 12),
            ("mlp_dim", "intermediate_size", 3072),
            ("in_chans", "num_channels", 3),
        ):
            f[name], prov[name] = cj.get(key, default, (int,))
        f["qkv_bias"], prov["qkv_bias"] = cj.get("qkv_bias", True, (bool,))
        act, prov["gelu"] = cj.get("hidden_act", "gelu", (str,))
        if act not in ACT_TO_GELU:
            raise FormatError(
                f"{context}: config.json hidden_act={act!r}: the twins implement {', '.join(ACT_TO_GELU)}"
            )
        f["gelu"] = ACT_TO_GELU[act]
        f["ln_eps"], prov["ln_eps"] = cj.get("layer_norm_eps", 1e-12, (float, int))
        size, prov["image_size"] = cj.get("image_size", 224, (int, list))
        ih, iw = size_pair(size, "image_size", context)
        cp, prov["patch_size"] = cj.get("patch_size", 16, (int, list))
        f["patch_size"] = size_pair(cp, "patch_size", context)
        f["image_size"] = (ih, iw)
        pooler_act, _ = cj.get("pooler_act", "tanh", (str,))
        pooler_size, pooler_origin = cj.get("pooler_output_size", None, (int,))
        labels, _ = cj.get("id2label", None, (dict,))
        n_labels, labels_origin = (
            (len(labels), declared("config.json id2label")) if labels is not None else cj.get("num_labels", 2, (int,))
        )
        if f["patch_size"] != (ph, pw):
            raise FormatError(f"{context}: config.json patch_size={cp!r} but {prefix + _PATCH_KEY} has patch {ph}x{pw}")
    else:
        depth = 0
        while f"{layer.format(i=depth)}layernorm_before.weight" in tensors:
            depth += 1
        fc1 = tensors.get(f"{layer.format(i=0)}{_NAMES[spelling][7]}.weight")
        if depth == 0 or fc1 is None or np.ndim(fc1) != 2:
            raise FormatError(f"{context}: no {layer.format(i=0)}layernorm_before.weight / 2-D fc1 weight")
        f.update(width=d, depth=depth, mlp_dim=np.shape(fc1)[0], in_chans=c, patch_size=(ph, pw))
        f["qkv_bias"] = f"{layer.format(i=0)}{_NAMES[spelling][2]}.bias" in tensors
        prov.update({k: derived("tensor shapes") for k in ("width", "depth", "mlp_dim", "in_chans", "patch_size")})
        prov["qkv_bias"] = derived("tensors present")
        if "num_heads" not in overrides:  # given: no guess, and no refusal where no rule guesses one
            f["num_heads"], prov["num_heads"] = guess_num_heads(d)
        f["gelu"], prov["gelu"] = "exact", assumed("no config.json; transformers' default hidden_act='gelu'")
        f["ln_eps"], prov["ln_eps"] = 1e-12, assumed("no config.json; transformers' default layer_norm_eps")
        pe = tensors.get(prefix + "embeddings.position_embeddings")
        if pe is None or np.ndim(pe) != 3:
            raise FormatError(f"{context}: no config.json and no 3-D {prefix}embeddings.position_embeddings")
        grid = (source_image_size[0] // ph, source_image_size[1] // pw) if source_image_size else None
        num_prefix = 2 if f["dist_token"] else 1
        (gh, gw), _, _ = posemb_layout(np.shape(pe)[1], num_prefix, grid, "position_embeddings", context)
        f["image_size"] = (gh * ph, gw * pw)
        prov["image_size"] = derived("the given size") if grid else square_grid_origin((gh, gw), "position_embeddings")
        pooler_act, pooler_size, pooler_origin = "tanh", None, derived("pooler tensors")
        n_labels, labels_origin = None, derived("classifier shape")
    pooler = f"{prefix}pooler.dense.weight"
    f["rep_size"], prov["rep_size"] = 0, arch_origin
    if pooler in tensors or f"{prefix}pooler.dense.bias" in tensors:
        if head != "backbone":
            dropped += [
                (k, f"a pooler is not part of {arch} (transformers builds it without one)")
                for k in (pooler, f"{prefix}pooler.dense.bias")
                if k in tensors
            ]
        else:
            if pooler_act != "tanh":
                raise FormatError(f"{context}: config.json pooler_act={pooler_act!r}: the twins' pooler is tanh")
            f["rep_size"] = pooler_size or f["width"]
            prov["rep_size"] = pooler_origin if pooler_size else declared("config.json hidden_size (pooler size)")
    elif head == "backbone":
        notes.append(
            f"{arch} without pooler tensors: the backbone only (load it in transformers with add_pooling_layer=False)"
        )
    if prefix + "embeddings.mask_token" in tensors:
        dropped.append((prefix + "embeddings.mask_token", "mask token of masked-image modelling; unused for images"))
    classifier = tensors.get("cls_classifier.weight" if head == "teacher" else "classifier.weight")
    rows = np.shape(classifier)[0] if classifier is not None and np.ndim(classifier) == 2 else 0
    conflicts = []
    if head == "backbone":
        f["num_classes"], prov["num_classes"] = 0, arch_origin
    else:
        f["num_classes"], prov["num_classes"] = rows, labels_origin
        if n_labels is not None and classifier is not None and n_labels != rows:
            conflicts.append(f"config.json has {n_labels} labels but the classifier has {rows} rows")
    if config is not None:
        carried_assumptions(config.get(ASSUMED_KEY), prov, context)
    f["posemb_resample"] = "bicubic"  # transformers' interpolate_pos_encoding: bicubic, no antialias
    dt = common_float_dtype(tensors)
    if dt in ("float32", "float64", "bfloat16", "float16"):
        f["param_dtype"] = dt
    cfg = build_config(f, prov, overrides, context, tensors)
    ignored = {k for k, _ in dropped}
    kept = {k: v for k, v in tensors.items() if k not in ignored}
    state = to_canonical(rules(cfg, spelling, prefix, head), kept, context)
    return Decoded(cfg, state, f"{arch}, {spelling} key names", prov, dropped, notes, conflicts, model_type)


def config_json(cfg: ViTConfig) -> dict[str, Any]:
    """The config.json of an HF ViT / DeiT folder for ``cfg``: also the keyword arguments of
    ``transformers.ViTConfig`` (``DeiTConfig`` with a distillation token) that build the same model."""
    head = "teacher" if cfg.head_dist else "classify" if cfg.num_classes > 0 else "backbone"
    model_type = "deit" if cfg.dist_token else "vit"
    arch = next(a for a, v in ARCHITECTURES.items() if v == (model_type, head))
    (ih, iw), (ph, pw) = cfg.image_size, cfg.patch_size
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": GELU_TO_ACT[cfg.gelu],
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
    if head != "backbone":
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_classes)}
    return config
