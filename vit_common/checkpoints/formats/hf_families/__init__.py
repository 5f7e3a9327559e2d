"""Hugging Face transformers vision towers beyond ViT and DeiT: SigLIP (and NaFlex SigLIP 2), CLIP, DINOv2
(with registers), ViT-MAE, ViT-MSN, I-JEPA, AIMv2 and RADIO folders (config.json + weights) <-> the canonical
state: the hf_family format's ``FORMAT``, one object that dispatches by config.json ``model_type``.

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
siglip2_vision_model    Siglip2VisionModel (NaFlex: flattened       ``patch_embedding`` [D, P*P*C] = the
                        patches, a patch mask, each image's grid;  patch convolution; image_size
                        read only)                                 sqrt(num_patches) P; per-image
                                                                   posemb_resample 'bilinear_aa'
siglip2                 Siglip2Model: ``vision_model.*`` as above; Siglip2ForImageClassification (masked mean)
aimv2_vision_model      Aimv2VisionModel (output: the attention    RMSNorm, patch_norm, SwiGLU ``ffn``,
                        probe ``head.*`` where ``use_head``, else  q/k/v/out biases as ``qkv_bias``;
                        every token)                               ``is_native``: posemb 'sincos2d_mae'
aimv2                   Aimv2Model: ``vision_model.*`` and the bias-free ``visual_projection`` on the probe;
                        the text tower and ``logit_scale`` are ignored
radio                   RadioModel (output: ``summary``, the class   NVIDIA's names under ``radio_model.``;
                        tokens at ``summary_idxs`` concatenated)    no final norm, input_mean/input_std,
                                                                   pool 'summary', posemb_resample
                                                                   'bilinear_crop' (``radio``)
======================= ========================================== =====================================

One table of block key spellings serves them all (``hf_common.BLOCK_KEYS``): the v4 names ``save_pretrained``
writes and the v5 module names of transformers 5 ``state_dict()``, as transformers' own
``conversion_mapping.py`` renames them; SigLIP and CLIP have one spelling. A DINOv2 SwiGLU FFN is
``mlp.weights_in`` [2F, D] (v4: gate rows first, as our fc1) or ``mlp.gate_proj`` + ``mlp.up_proj`` (v5),
and ``mlp.weights_out`` / ``mlp.down_proj``. Position embeddings are resampled as transformers'
``interpolate_pos_encoding`` does: bicubic without antialias, but with it for dinov2_with_registers.
Written (``family_for``): the family that holds the model, a two-tower folder as its vision tower (but
SigLIP's and SigLIP 2's classifiers: ``SiglipForImageClassification`` / ``Siglip2ForImageClassification``,
a ``siglip`` / ``siglip2`` config.json nesting the ``vision_config``), DINOv2 with a zero ``mask_token`` and
(registers) a zero class position row. A plain ViT (class token pooling) is the hf format's unless written
as ``vit_mae`` (``ViTMAEModel``, ``mask_ratio`` 0) or ``vit_msn``, a mean-pooled classifier without a
class token I-JEPA's unless written as ``siglip`` or ``siglip2``: ``HfWriteOptions.model_type``
(``--hf-model-type``), which ``complete_options`` sets from a source read from such a folder (or from its
family's vision model folder, given classes and mean pooling). Still
refused by name: CLIPForImageClassification (a mean of un-normalised tokens), ViTMAEForPreTraining (its
decoder), and in ``hf_vit`` relative position bias (BEiT, data2vec-vision) and rotary embeddings (DINOv3,
Perception Encoder).

One module per family holds its model types' rules (``siglip``, ``siglip2``, ``clip``, ``dinov2``, ``vit_mae``,
``vit_msn``, ``ijepa``, ``aimv2``, ``radio``: a table ``FAMILIES`` of ``family.Family`` objects); ``layout``
holds the tensor layouts by block style. A new family is one module and one entry in ``FAMILIES`` below (and its model
types in ``hf_common.FAMILY_MODEL_TYPES``, which the hf format refuses with a pointer here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf import HfWriteOptions, HuggingFace
from vit_common.checkpoints.formats.hf_common import BLOCK_KEYS, GELU_TO_ACT, size_pair
from vit_common.checkpoints.formats.hf_families import (
    aimv2,
    clip,
    dinov2,
    ijepa,
    radio,
    siglip,
    siglip2,
    vit_mae,
    vit_msn,
)
from vit_common.checkpoints.formats.hf_families.dinov2 import dinov2_ratio
from vit_common.checkpoints.formats.hf_families.family import Family, FamilyConfig
from vit_common.checkpoints.formats.hf_families.layout import (
    find_layer_prefix,
    find_spelling,
    fold_class_row,
    pack_in_proj,
    split_in_proj,
    unfold_class_row,
)
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
    Rule,
    from_canonical,
    materialize_posemb,
    refuse,
    rope_family_fields,
    to_canonical,
    unsupported,
)
from vit_common.checkpoints.metadata import Declared
from vit_common.config import ViTConfig
from vit_common.system import io

# Every model type, in the order the format's signature names them and ``family_for`` prefers them.
FAMILIES: dict[str, Family] = (
    aimv2.FAMILIES  # first: it alone holds RMSNorm models, which SigLIP's holds() does not look at
    | siglip.FAMILIES
    | siglip2.FAMILIES
    | clip.FAMILIES
    | dinov2.FAMILIES
    | vit_mae.FAMILIES
    | vit_msn.FAMILIES
    | ijepa.FAMILIES
    | radio.FAMILIES
)
# the layout line of a style whose key names transformers 4 and 5 share (one spelling in BLOCK_KEYS)
ONE_SPELLING = "key names of transformers 4 and 5"
_REFUSED_ARCHITECTURES = {arch: why for fam in FAMILIES.values() for arch, why in fam.refused.items()}


def is_family(config: Mapping[str, Any] | None) -> bool:
    """True if an HF config.json names one of ``FAMILIES``' model types (``hf_common.FAMILY_MODEL_TYPES``)."""
    return (
        isinstance(config, Mapping) and isinstance(config.get("model_type"), str) and config["model_type"] in FAMILIES
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
    cj = FamilyConfig(vc, fam.defaults, context)
    patch_key = fam.patch_key()
    prefix = next((p for p in dict.fromkeys((declared_prefix, "vision_model.", "")) if p + patch_key in tensors), None)
    if prefix is None:
        raise FormatError(f"{context}: no {declared_prefix}{patch_key}, so not a transformers {arch}")
    refuse_unsupported(tensors, context)
    shape = positive_dims(np.shape(tensors[prefix + patch_key]), prefix + patch_key, context)
    d, c, ph, pw = fam.patch_dims(cj, shape, prefix + patch_key)
    type_origin = declared(f"model_type {model_type!r}")
    f: dict[str, Any] = fam.fixed()
    prov: dict[str, Origin] = {k: type_origin for k in f}
    for name, key in (("width", "hidden_size"), ("depth", "num_hidden_layers"), ("num_heads", "num_attention_heads")):
        f[name], prov[name] = cj.get(key, (int,))
    f["in_chans"], prov["in_chans"] = cj.get("num_channels", (int,))
    size, prov["image_size"] = fam.read_image_size(cj)
    f["image_size"] = size_pair(size, "image_size", context)
    cp, prov["patch_size"] = cj.get("patch_size", (int, list))
    f["patch_size"] = size_pair(cp, "patch_size", context)
    if f["patch_size"] != (ph, pw):
        raise FormatError(f"{context}: config.json patch_size={cp!r} but {prefix + patch_key} has patch {ph}x{pw}")
    if fam.style == "clip":
        f["qkv_bias"], prov["qkv_bias"] = True, type_origin
    else:
        f["qkv_bias"], prov["qkv_bias"] = cj.get("qkv_bias", (bool,))
    mlp, mlp_origins = fam.read_mlp(cj, f["width"], type_origin)
    f.update(mlp)
    prov.update(mlp_origins)
    f["reg_tokens"], prov["reg_tokens"] = fam.read_registers(cj, type_origin)
    f["posemb_prefix"] = not f["reg_tokens"]  # registers: the class row is folded into cls_token
    prov["posemb_prefix"] = type_origin
    block, block_origins = fam.read_block(cj, f, type_origin)
    f.update(block)
    prov.update(block_origins)
    held, held_origins, unread = fam.read_tensors(cj, tensors, prefix)
    f.update(held)
    prov.update(held_origins)
    spelling = find_spelling(fam.style, tensors, prefix)
    layer_prefix = find_layer_prefix(prefix, tensors, BLOCK_KEYS[fam.style][spelling][0])
    dropped: list[tuple[str, str]] = [(k, why) for k, why in unread.items() if why]
    mine = (prefix,) if prefix else ()
    if fam.two_tower or (prefix and head != "project"):
        keep = mine + ((layer_prefix,) if layer_prefix else ()) + ("visual_projection.", "classifier.")
        dropped += [
            (k, "the text tower and the contrastive logit scale (not the image tower)")
            for k in tensors
            if not k.startswith(keep) and (k.startswith("text_") or k.startswith("logit_"))
        ]
    has_head = any(k.startswith(prefix + "head.") for k in tensors)
    f["pool"], prov["pool"], unused_head = fam.read_pool(cj, arch, head, arch_origin, type_origin, has_head)
    if unused_head:  # SigLIP's MAP head
        dropped += [(k, unused_head) for k in tensors if k.startswith(prefix + "head.")]
    mask = prefix + "embeddings.mask_token"
    if mask in tensors:
        dropped.append((mask, "mask token of masked-image modelling; unused for images"))
    if fam.note:
        notes.append(fam.note)
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
    f.setdefault("dynamic_img_size", False)
    dt = common_float_dtype({k: v for k, v in tensors.items() if k.startswith(mine) or not mine})
    if dt in ("float32", "float64", "bfloat16", "float16"):
        f["param_dtype"] = dt
    cfg = build_config(f, prov, dict(overrides), context, tensors)
    ignored = {k for k, _ in dropped} | set(unread)
    kept = fam.unpack(cfg, split_in_proj({k: v for k, v in tensors.items() if k not in ignored}, prefix), prefix)
    if cfg.reg_tokens and fam.style == "dinov2":
        kept = fold_class_row(kept, prefix)
        notes.append("position embedding's class row added to cls_token (registers follow the position embedding)")
    state = to_canonical(fam.rules(cfg, spelling, prefix, layer_prefix, head), kept, context)
    names = f"{spelling} key names" if len(BLOCK_KEYS[fam.style]) > 1 else ONE_SPELLING
    return Decoded(cfg, state, f"{arch}, {names}", prov, dropped, notes, conflicts, model_type)


def _holders(cfg: ViTConfig) -> dict[str, str]:
    """model_type -> architecture of each model type that holds ``cfg``'s outputs (``Family.holds``, one of
    its own architectures: a two-tower type only as its classifier), in ``FAMILIES`` order, which
    ``family_for`` prefers (CLIP before DINOv2; the others exclude each other)."""
    return {mt: arch for mt, fam in FAMILIES.items() if (arch := fam.holds(cfg)) in fam.architectures}


def family_for(cfg: ViTConfig, model_type: str | None = None) -> tuple[str, str] | None:
    """(model_type, architecture) of the transformers family that holds ``cfg`` (``_holders``), or None:
    ``model_type`` where given and it holds the model, else the first of CLIP, SigLIP, DINOv2 and I-JEPA
    (a plain ViT is the hf format's unless ``vit_mae`` or ``vit_msn`` is asked for, a mean-pooled classifier
    I-JEPA's unless ``siglip`` or ``siglip2`` is: ``Family.on_request``)."""
    holders = _holders(cfg)
    if model_type is not None:
        return (model_type, holders[model_type]) if model_type in holders else None
    return next(((mt, a) for mt, a in holders.items() if not FAMILIES[mt].on_request), None)


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
        "hidden_act": GELU_TO_ACT[cfg.gelu],
        "layer_norm_eps": cfg.ln_eps,
        "dtype": cfg.param_dtype,
    }
    config = FAMILIES[model_type].config_json(cfg, config)
    if "ForImageClassification" in arch:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_classes)}
    return config


class HfFamilies(HuggingFace):
    """transformers folders of the model types in ``FAMILIES``: read, and written as the family that
    holds the model (``family_for``) with HF ViT's folder layout, preprocessing and class names."""

    name = "hf_family"
    description = "Hugging Face transformers SigLIP, CLIP, DINOv2, ViT-MAE, ViT-MSN, I-JEPA, AIMv2 or RADIO folder"
    signature = "a folder whose config.json model_type is " + ", ".join(FAMILIES)

    def export_name(self, source=None) -> str:
        return "model_hf_family"

    def detect(self, src: Source) -> bool:
        return src.container == "hf_folder" and is_family(src.config)

    def declared(self, src: Source) -> Declared:
        """As the hf format's; a RADIO folder without preprocessing of its own declares mean 0 and std 1
        (``RadioModel`` normalises its input itself: input_mean / input_std), the format's usual geometry."""
        found = super().declared(src)
        if found.preprocess is None and (src.config or {}).get("model_type") == "radio":
            pre = self.assumed_preprocess.replace(mean=(0.0,), std=(1.0,))
            return dataclasses.replace(found, preprocess=pre, preprocess_where="RadioModel's own input normaliser")
        return found

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
                "(a plain ViT is written as hf, or as hf_family with model type vit_mae or vit_msn; "
                "other models as timm or canonical)"
            ]
        model_type, arch = found
        fam = FAMILIES[model_type]
        style, head = fam.style, fam.architectures[arch][1]
        (ih, iw), (ph, pw) = cfg.image_size, cfg.patch_size
        return rope_family_fields(cfg.replace(final_norm=cfg.final_norm or style == "radio")) + unsupported(
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
                "patch_bias=False": fam.patch_bias and not cfg.patch_bias,
                "mlp_type='swiglu'": style not in ("dinov2", "aimv2", "radio") and cfg.mlp_type == "swiglu",
                f"mlp_dim={cfg.mlp_dim} (no integer DINOv2 mlp_ratio gives it)": style == "dinov2"
                and dinov2_ratio(cfg) is None,
                "LayerScale": style not in ("dinov2", "radio") and cfg.layer_scale is not None,
                "head_bias=True (CLIP's projection has no bias)": head == "project"
                and cfg.num_classes > 0
                and cfg.head_bias,
                "head_bias=False": head != "project" and cfg.num_classes > 0 and not cfg.head_bias,
                "registers without posemb_prefix=False": cfg.reg_tokens > 0 and cfg.posemb_prefix,
            }
            | fam.checks(cfg),
        )

    def complete_options(self, options, source) -> HfWriteOptions:
        """A source read from a folder of a model type written only on request (``Family.on_request``:
        ``vit_mae``, ``vit_msn``, ``siglip2_vision_model``, the ``siglip`` and ``siglip2`` classifiers) is
        written as its own model type where ``options`` name none and that type holds the model; where it
        does not, as the other type of its family that does: a two-tower folder as its vision model type, a
        vision model given classes and mean pooling as its two-tower type's classifier (a
        ``Siglip2VisionModel`` as ``Siglip2ForImageClassification``, not as an I-JEPA). A NaFlex source
        of no family's folder (big_vision naflex_vit, timm NaFlexVit: a table resized to each input's grid
        bilinearly with antialias) is written as ``siglip2_vision_model`` where that holds it."""
        mt = getattr(source, "model_type", "")
        cfg = getattr(source, "config", None)
        if mt not in FAMILIES and cfg is not None and cfg.dynamic_img_size and cfg.posemb_resample == "bilinear_aa":
            mt = "siglip2_vision_model"
        if mt in FAMILIES and (cfg is None or family_for(cfg, mt) is None):
            other = f"{mt}_vision_model" if FAMILIES[mt].two_tower else mt.removesuffix("_vision_model")
            if other in FAMILIES and (FAMILIES[mt].two_tower or (cfg is not None and family_for(cfg, other))):
                mt = other
        on_request = mt in FAMILIES and FAMILIES[mt].on_request
        if isinstance(options, HfWriteOptions) and options.model_type is None and on_request:
            if cfg is not None and family_for(cfg, mt) is not None:
                return dataclasses.replace(options, model_type=mt)
        return options

    def encode(self, cfg: ViTConfig, state, path, options, assumed=()) -> Encoded:
        refuse("hf_family", self.cannot_hold(cfg, options.model_type))
        if options.spelling not in ("v4", "v5"):
            raise ValueError(f"spelling={options.spelling!r}: expected 'v4' or 'v5'")
        model_type, arch = family_for(cfg, options.model_type)
        fam = FAMILIES[model_type]
        spelling = options.spelling if options.spelling in BLOCK_KEYS[fam.style] else "v4"
        notes = []
        if not fam.keeps_posemb(cfg):
            cfg, state, notes = materialize_posemb(cfg, state, prefix_rows=not cfg.reg_tokens)
        prefix, head = fam.architectures[arch]
        config = config_json(cfg, model_type, arch) | ({ASSUMED_KEY: sorted(assumed)} if assumed else {})
        tensors = from_canonical(self.tensor_rules(cfg, options), state)
        tensors = fam.pack(cfg, pack_in_proj(tensors, prefix), prefix)
        if cfg.reg_tokens and fam.style == "dinov2":
            tensors = unfold_class_row(tensors, prefix)
        if fam.style == "dinov2":
            any_param = np.asarray(state["cls_token"])
            tensors[prefix + "embeddings.mask_token"] = np.zeros((1, cfg.width), any_param.dtype)
            notes.append(
                "embeddings.mask_token written as zeros (transformers' DINOv2 builds one; images never use it)"
            )
        if spelling != options.spelling:
            notes.append(f"{model_type} has one key spelling; written in it")
        return Encoded(cfg, state, tensors, config, None, notes, shard_size=options.shard_bytes)

    def tensor_rules(self, cfg: ViTConfig, options: HfWriteOptions) -> list[Rule]:
        """The file <-> canonical rules ``encode`` writes ``cfg`` with: the family that holds it
        (``family_for``), its architecture's prefix and head, ``options.spelling`` where the family has it."""
        model_type, arch = family_for(cfg, options.model_type)
        fam = FAMILIES[model_type]
        spelling = options.spelling if options.spelling in BLOCK_KEYS[fam.style] else "v4"
        prefix, head = fam.architectures[arch]
        return fam.rules(cfg, spelling, prefix, prefix, head)

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
