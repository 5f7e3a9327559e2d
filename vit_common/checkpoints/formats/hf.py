"""Hugging Face transformers ViT and DeiT folders (config.json + weights) <-> the canonical state.

config.json decides the model: ``model_type`` 'vit' or 'deit' (DeiT adds a distillation token after the
class token) and ``architectures`` which head reads it:

================================================ ==================================================
architecture                                     output
================================================ ==================================================
ViTModel, DeiTModel                              backbone; with ``pooler.dense`` tensors the pooler
                                                 (dense + tanh on the class token: our pre-logits)
ViTForImageClassification,                       ``classifier`` on the class token; a ``pooler`` in
DeiTForImageClassification                       the file is not part of the model: ignored, reported
DeiTForImageClassificationWithTeacher            mean of ``cls_classifier`` (class token) and
                                                 ``distillation_classifier`` (distillation token):
                                                 our head and head_dist
================================================ ==================================================

Every structural field comes from config.json (a missing key means transformers' default, as it does
when transformers loads the folder) and is checked against the tensors, which must all be there: a layer
absent from every shard is an error, never a shallower model. Sharded folders are read through their
index. Two key spellings exist. ``save_pretrained`` writes the v4 one in transformers 4 and 5; the v5
module names appear in ``state_dict()`` of transformers 5 models and in files saved from it directly:

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

Embeddings are ``embeddings.{cls_token, distillation_token, position_embeddings,
patch_embeddings.projection}``, the final norm ``layernorm``; task models prefix these with ``vit.`` or
``deit.``. ``hidden_act`` 'gelu' / 'gelu_python' = exact erf, 'gelu_pytorch_tanh' / 'gelu_new' = the tanh
approximation, 'quick_gelu' = x sigmoid(1.702 x); LayerNorm eps defaults to 1e-12. SigLIP, CLIP, DINOv2,
ViT-MAE, ViT-MSN and I-JEPA folders are the ``hf_family`` format's (``hf_families.py``); other model types
(BEiT, data2vec-vision, DINOv3, SigLIP2, AIMv2, ...) and masked-image-modelling heads are refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Format, Reference, Source, WriteOptions
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
from vit_common.checkpoints.formats.timm_state import is_timm
from vit_common.checkpoints.metadata import (
    Declared,
    hf_classes,
    hf_labels,
    hf_preprocess_file,
    hf_preprocessor_config,
)
from vit_common.config import ViTConfig
from vit_common.data.images import PRESETS
from vit_common.system import io

_ACT_TO_GELU = {
    "gelu": "exact",
    "gelu_python": "exact",
    "gelu_pytorch_tanh": "tanh",
    "gelu_new": "tanh",
    "quick_gelu": "quick",
}
_GELU_TO_ACT = {"exact": "gelu", "tanh": "gelu_pytorch_tanh", "quick": "quick_gelu"}
# The one table of block key spellings of the HF ViT-family model types (this format's ViT and DeiT, and
# hf_families.py's): style -> spelling -> (layer prefix, norm1, q, k, v, o, norm2, fc1, fc2). 'vit' is
# ViT, DeiT, ViT-MAE, ViT-MSN and I-JEPA; 'dinov2' both DINOv2 types; 'clip' SigLIP and CLIP (one
# spelling). v4 is what save_pretrained writes, v5 the transformers 5 module names, as transformers'
# conversion_mapping.py renames them (ViTModel, Dinov2Model, ViTMAEForPreTraining entries).
BLOCK_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "vit": {
        "v4": (
            "encoder.layer.{i}.",
            "layernorm_before",
            "attention.attention.query",
            "attention.attention.key",
            "attention.attention.value",
            "attention.output.dense",
            "layernorm_after",
            "intermediate.dense",
            "output.dense",
        ),
        "v5": (
            "layers.{i}.",
            "layernorm_before",
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.o_proj",
            "layernorm_after",
            "mlp.fc1",
            "mlp.fc2",
        ),
    },
    "dinov2": {
        "v4": (
            "encoder.layer.{i}.",
            "norm1",
            "attention.attention.query",
            "attention.attention.key",
            "attention.attention.value",
            "attention.output.dense",
            "norm2",
            "mlp.fc1",
            "mlp.fc2",
        ),
        "v5": (
            "encoder.layer.{i}.",
            "norm1",
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.o_proj",
            "norm2",
            "mlp.fc1",
            "mlp.fc2",
        ),
    },
    "clip": {
        "v4": (
            "encoder.layers.{i}.",
            "layer_norm1",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.out_proj",
            "layer_norm2",
            "mlp.fc1",
            "mlp.fc2",
        ),
    },
}
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
    "dinov3_vit": "rotary position embeddings (DINOv3)",
    "perception_lm": "rotary position embeddings (Perception Encoder)",
    "pe_video": "rotary position embeddings (Perception Encoder)",
    "siglip2": "NaFlex variable-resolution patches (SigLIP2)",
    "siglip2_vision_model": "NaFlex variable-resolution patches (SigLIP2)",
    "aimv2": "RMSNorm (AIMv2)",
    "aimv2_vision_model": "RMSNorm (AIMv2)",
}
# Model types another format reads (``hf_families.FAMILIES``: that module imports this one).
_FAMILY_MODEL_TYPES = (
    "siglip_vision_model",
    "siglip",
    "clip_vision_model",
    "clip",
    "dinov2",
    "dinov2_with_registers",
    "vit_mae",
    "vit_msn",
    "ijepa",
)


def is_hf(keys) -> bool:
    """True if the key names are a transformers ViT or DeiT state_dict."""
    return any(k in (_PATCH_KEY, "vit." + _PATCH_KEY, "deit." + _PATCH_KEY) for k in keys)


def _pair(v: Any, name: str, context: str) -> tuple[int, int]:
    pair = [v, v] if not isinstance(v, (list, tuple)) else list(v)
    if len(pair) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in pair):
        return pair[0], pair[1]
    raise FormatError(f"{context}: config.json {name}={v!r} is not a positive int or [H, W]")


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
        if model_type in _FAMILY_MODEL_TYPES:
            raise FormatError(f"{context}: model_type={model_type!r} is the hf_family format's (--from hf_family)")
        raise FormatError(
            f"{context}: config.json model_type={model_type!r} is not supported"
            + (f" (the twins lack {what})" if what else "")
            + f"; supported: {', '.join(MODEL_TYPES)}"
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
    }
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
        if act not in _ACT_TO_GELU:
            raise FormatError(
                f"{context}: config.json hidden_act={act!r}: the twins implement {', '.join(_ACT_TO_GELU)}"
            )
        f["gelu"] = _ACT_TO_GELU[act]
        f["ln_eps"], prov["ln_eps"] = cj.get("layer_norm_eps", 1e-12, (float, int))
        size, prov["image_size"] = cj.get("image_size", 224, (int, list))
        ih, iw = _pair(size, "image_size", context)
        cp, prov["patch_size"] = cj.get("patch_size", 16, (int, list))
        f["patch_size"] = _pair(cp, "patch_size", context)
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
    cfg = build_config(f, prov, overrides, context)
    ignored = {k for k, _ in dropped}
    kept = {k: v for k, v in tensors.items() if k not in ignored}
    state = to_canonical(rules(cfg, spelling, prefix, head), kept, context)
    return Decoded(cfg, state, f"{arch}, {spelling} key names", prov, dropped, notes, conflicts, model_type)


# The model types an hf_family folder is written as (``--hf-model-type``): the two-tower ones are written
# as their vision tower's.
WRITTEN_FAMILY_TYPES = tuple(t for t in _FAMILY_MODEL_TYPES if t not in ("siglip", "clip"))


@dataclass(frozen=True)
class HfWriteOptions(WriteOptions):
    """How an HF folder is written: ``spelling`` of the tensor names; ``model_type`` of an hf_family
    folder (None: the source folder's where it holds the model, else the family that holds it)."""

    spelling: str = field(
        default="v4",
        metadata={
            "flag": "--hf-spelling",
            "choices": tuple(_NAMES),
            "help": "HF key names to write: v4 (what save_pretrained writes; loads in transformers 4 and 5) "
            "or v5 (transformers 5 module names)",
        },
    )
    model_type: str | None = field(
        default=None,
        metadata={
            "flag": "--hf-model-type",
            "choices": WRITTEN_FAMILY_TYPES,
            "help": "transformers model_type of an hf_family folder (a plain ViT as vit_mae or vit_msn; "
            "default: the source folder's model_type where it holds the model, else the family that holds it)",
        },
    )


class HuggingFace(Format):
    name = "hf"
    description = "Hugging Face transformers ViT or DeiT folder (config.json + weights)"
    folder = True
    signature = "embeddings.patch_embeddings.projection.weight, or a folder with config.json"
    reference = Reference("transformers", "from_pretrained")
    write_options = HfWriteOptions
    assumed_preprocess = PRESETS["hf_vit"]
    assumed_why = "no preprocessor_config.json; transformers ViTImageProcessor defaults"

    def detect(self, src: Source) -> bool:
        if src.container not in ("hf_folder", "safetensors", "torch"):
            return False
        return is_hf(src.tensors) or (src.container == "hf_folder" and not is_timm(src.tensors))

    def read(self, src: Source, opts) -> Decoded:
        return read_tensors(
            src.tensors,
            src.config,
            source_image_size=opts.source_image_size,
            overrides=opts.overrides,
            context=src.context,
        )

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        return unsupported(
            "Hugging Face ViT",
            {
                "class_token=False (HF ViT always has a class token)": not cfg.class_token,
                f"reg_tokens={cfg.reg_tokens}": cfg.reg_tokens > 0,
                f"pool={cfg.pool!r} (HF ViT pools the class token)": cfg.pool != "token",
                "LayerScale": cfg.layer_scale is not None,
                "qk_norm": cfg.qk_norm,
                "fc_norm": cfg.fc_norm,
                "norm_pre": cfg.norm_pre,
                "patch_bias=False": not cfg.patch_bias,
                "posemb='none'": cfg.posemb == "none",
                "mlp_type='swiglu'": cfg.mlp_type == "swiglu",
                "head_bias=False (the classifier has a bias)": not cfg.head_bias,
                "both rep_size and a head (ViTModel has the pooler, ViTForImageClassification the classifier)": (
                    cfg.rep_size > 0 and cfg.num_classes > 0
                ),
                "head_dist without classes (DeiTModel has no distilled output)": cfg.head_dist and not cfg.num_classes,
            },
        )

    def declared(self, src: Source) -> Declared:
        """The safetensors metadata's entries (a weights file given alone), then the folder's
        preprocessor_config.json and config.json ``id2label`` (``src.config``; LABEL_i names none)."""
        found = super().declared(src)
        folder = src.path if src.path.is_dir() else src.path.parent
        model_type = (src.config or {}).get("model_type")
        pre, pre_where = hf_preprocess_file(folder, model_type), str(folder / "preprocessor_config.json")
        if pre is None:
            pre, pre_where = found.preprocess, found.preprocess_where
        classes, classes_where = found.classes, found.classes_where
        if classes is None and hf_classes(src.config or {}) is not None:
            classes, classes_where = list(hf_classes(src.config)), str(folder / "config.json")
        return Declared(pre, pre_where, classes, classes_where)

    def record_info(self, enc: Encoded, preprocess, classes) -> list[str]:
        """Class names as config.json ``id2label``/``label2id``, preprocessing as preprocessor_config.json."""
        if classes is not None and enc.cfg.num_classes:
            enc.config_json |= hf_labels(classes, enc.cfg.num_classes)
        notes: list[str] = []
        if preprocess is not None:
            pre, notes = hf_preprocessor_config(preprocess, enc.cfg.image_size, enc.cfg.in_chans)
            enc.json_files["preprocessor_config.json"] = pre
        return notes

    def encode(self, cfg: ViTConfig, state, path: Path, options: HfWriteOptions, assumed=()) -> Encoded:
        refuse("Hugging Face ViT", self.cannot_hold(cfg))
        spelling = options.spelling
        if spelling not in _NAMES:
            raise ValueError(f"spelling={spelling!r}: expected 'v4' or 'v5'")
        if options.model_type is not None:
            raise ValueError(
                f"model_type={options.model_type!r}: hf folders are vit or deit; write that model type --to hf_family"
            )
        cfg, state, notes = materialize_posemb(cfg, state, prefix_rows=True)
        config = config_json(cfg) | ({ASSUMED_KEY: sorted(assumed)} if assumed else {})  # transformers keeps it
        arch = config["architectures"][0]
        _, head = ARCHITECTURES[arch]
        prefix = f"{config['model_type']}." if head != "backbone" else ""
        return Encoded(cfg, state, from_canonical(rules(cfg, spelling, prefix, head), state), config, None, notes)

    def decode(self, enc: Encoded) -> Decoded:
        return read_tensors(enc.tensors, enc.config_json, context="hf read-back")

    def write(self, path: Path, enc: Encoded, writers) -> None:
        def write_folder(tmp: Path) -> None:
            names = ["config.json", "model.safetensors", *enc.json_files]
            io.write_json(tmp / "config.json", io.folder_mark(enc.config_json, names), sort_keys=True)
            io.save_safetensors(tmp / "model.safetensors", enc.tensors, {"format": "pt"})
            for name, obj in enc.json_files.items():
                io.write_json(tmp / name, obj, sort_keys=True, mark=False)

        io.atomic_write_dir(path, write_folder)

    def export_name(self, source: Path | None = None) -> str:
        return "model_hf"

    def load_call(self, path: Path, cfg: ViTConfig) -> str:
        arch = config_json(cfg)["architectures"][0]
        extra = ", add_pooling_layer=False" if ARCHITECTURES[arch][1] == "backbone" and not cfg.rep_size else ""
        return "\n".join(
            [
                "import transformers",
                f"model, info = transformers.{arch}.from_pretrained({str(path)!r}, output_loading_info=True{extra})",
                "assert not any(info.values()), info  # no missing, unexpected or mismatched tensor",
            ]
        )


FORMAT = HuggingFace()


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
    if head != "backbone":
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_classes)}
    return config
