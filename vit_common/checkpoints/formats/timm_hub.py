"""timm hub folders are what timm's ``save_for_hf`` / ``push_to_hub`` write and ``timm.create_model(
"local-dir:PATH")`` / ``"hf-hub:ORG/NAME"`` read (timm ``models/_hub.py``): ``config.json`` beside
``model.safetensors`` (or ``pytorch_model.bin``). timm 1.0.31's ``save_config_for_hf`` writes::

    {"architecture": "vit_base_patch16_clip_224",      # the timm model name, which fixes its defaults
     "num_classes": 1000, "num_features": 768, "global_pool": "token",   # informational
     "model_args": {"embed_dim": 768, "img_size": [224, 224], ...},      # create_model keywords (1.0.x)
     "label_names": [...],                                                # optional
     "pretrained_cfg": {"input_size": [3, 224, 224], "interpolation": "bicubic", "crop_pct": 0.95,
                        "crop_mode": "center", "mean": [...], "std": [...], "num_classes": 1000, ...}}

Older exports have no ``model_args`` (the name alone builds the model), the oldest put every key at the
top level without ``pretrained_cfg`` (``_parse_model_cfg`` reads both). Such a folder's config is
**declared** by the model timm builds from it: the caller's ``readers["timm"](folder) -> ViTConfig | None``
(``vit_torch.formats.READERS``; ``vit_jax.formats.READERS`` runs it in a child process, since vit_jax
never imports torch) builds ``timm.create_model("local-dir:PATH", pretrained=False)`` on the meta device
and reads its fields, so what the name implies (CLIP's LayerNorm eps 1e-5, pre_norm) is declared too.
Without timm (no reader, or it returns None) a folder we wrote reads its header's config; any other
declares what config.json states (``declared_fields``) and what its architecture implies (the table of
timm's architectures, ``timm_names``: ``architecture_defaults``), checks it against the tensors
(``check_fields``) and infers the rest as for a timm file, assumed where shapes cannot tell.
``pretrained_cfg`` declares the preprocessing (``hub_preprocess``; timm ``data/config.py``
``resolve_data_config`` defaults for missing keys), ``label_names`` the class names. ``vit convert --to
timm DIR`` (a destination without a file suffix) writes such a folder, which ``timm.create_model(
"local-dir:DIR", pretrained=True)`` loads strictly: the architecture that matches the model
(``hub_architecture``), with every keyword of ``timm_kwargs`` in ``model_args``.

This module reads and writes those folders for the timm format (``vit_common.checkpoints.formats.timm``,
which holds its ``FORMAT``; this module has none).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded, Source
from vit_common.checkpoints.formats.provenance import ASSUMED_KEY, common_float_dtype, declared
from vit_common.checkpoints.formats.rules import refuse, unsupported
from vit_common.checkpoints.formats.stored_config import config_from_json, decode_stored
from vit_common.checkpoints.formats.timm_eva import eva_kwargs, eva_name, eva_to_canonical, is_eva, layout_note
from vit_common.checkpoints.formats.timm_naflex import (
    check_naflex_grid,
    infer_naflex,
    is_naflex,
    is_naflex_name,
    naflex_kwargs,
    naflex_state,
)
from vit_common.checkpoints.formats.timm_names import architecture_config, matching_name, timm_version
from vit_common.checkpoints.formats.timm_state import (
    GELU_TO_TIMM,
    POOL_TO_TIMM,
    infer,
    normalise_keys,
    timm_kwargs,
    timm_model_name,
)
from vit_common.config import ViTConfig
from vit_common.data.images import CROP_MODES, INTERPOLATIONS, Preprocess
from vit_common.system.validate import check_declared_sizes

HUB_WEIGHTS = "model.safetensors"
# timm data/constants.py: what resolve_data_config takes where pretrained_cfg has no value.
IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875
DEFAULT_CROP_MODE = "center"
DEFAULT_INTERPOLATION = "bicubic"
# The architecture a written folder names, by LayerNorm eps (timm vision_transformer.py: the CLIP entry
# points build LayerNorm with eps 1e-5, the others timm's 1e-6); model_args override every other default.
HUB_ARCHITECTURES = {1e-6: "vit_base_patch16_224", 1e-5: "vit_base_patch16_clip_224"}
HUB_DISTILLED = "deit_base_distilled_patch16_224"

_POOL_FROM_TIMM = {v: k for k, v in POOL_TO_TIMM.items()}
_GELU_FROM_TIMM = {v: k for k, v in GELU_TO_TIMM.items()} | {"gelu_pytorch_tanh": "tanh"}
# model_args that a reader without timm checks against the tensors: key -> ViTConfig field.
_CHECKED = {
    "embed_dim": "width",
    "depth": "depth",
    "in_chans": "in_chans",
    "num_classes": "num_classes",
    "qkv_bias": "qkv_bias",
    "qk_norm": "qk_norm",
    "class_token": "class_token",
    "reg_tokens": "reg_tokens",
    "pre_norm": "norm_pre",
    "proj_bias": "proj_bias",
    "final_norm": "final_norm",
}
# model_args read (declared or checked) without timm, or that change nothing a trained model computes.
_KNOWN = frozenset(_CHECKED) | {
    "num_heads",
    "global_pool",
    "pool_include_prefix",
    "dynamic_img_size",
    "dynamic_img_pad",
    "no_embed_class",
    "img_size",
    "patch_size",
    "act_layer",
    "mlp_ratio",
    "init_values",
    "fc_norm",
    "pos_embed",
    "weight_init",
    "fix_init",
    "drop_rate",
    "pos_drop_rate",
    "patch_drop_rate",
    "proj_drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
    "strict_img_size",
}


@dataclass(frozen=True)
class HubConfig:
    """A timm hub folder's config.json as timm's ``_parse_model_cfg`` splits it: ``architecture`` (the
    timm model name), ``num_classes`` (K, or None where unstated), ``global_pool`` (the informational
    top-level key, or None), ``model_args`` (create_model keywords), ``pretrained_cfg`` (preprocessing),
    ``label_names`` (K class names, or None), ``assumed`` (our ``vit_assumed`` list, or None)."""

    architecture: str
    num_classes: int | None = None
    global_pool: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    pretrained_cfg: dict[str, Any] = field(default_factory=dict)
    label_names: tuple[str, ...] | None = None
    assumed: list[str] | None = None


def is_hub_config(config: Mapping | None) -> bool:
    """True if an HF-style config.json is a timm one (``architecture``, no transformers ``model_type``)."""
    return isinstance(config, Mapping) and isinstance(config.get("architecture"), str) and "model_type" not in config


def hub_config(config: Mapping[str, Any], where: str) -> HubConfig:
    """The parts of a timm hub config.json (either layout, see the module docstring).

    Raises:
        FormatError: a missing architecture or a key of the wrong type (names the key and ``where``).
    """
    config = dict(config)
    if "pretrained_cfg" not in config:  # the oldest exports: one flat dict
        config = {"architecture": config.pop("architecture", None), "pretrained_cfg": config}
    arch, pcfg, args = config.get("architecture"), config.get("pretrained_cfg"), config.get("model_args", {})
    if not isinstance(arch, str) or not arch:
        raise FormatError(f"{where}: no 'architecture' (the timm model name) in a timm hub config.json")
    for key, value in (("pretrained_cfg", pcfg), ("model_args", args)):
        if not isinstance(value, dict):
            raise FormatError(f"{where}: {key}={value!r} is not a JSON object")
    k = config.get("num_classes", pcfg.get("num_classes"))
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
        raise FormatError(f"{where}: num_classes={k!r} is not a class count")
    pool = config.get("global_pool")
    if pool is not None and pool not in _POOL_FROM_TIMM:
        raise FormatError(f"{where}: global_pool={pool!r}; the twins pool {sorted(_POOL_FROM_TIMM)}")
    return HubConfig(arch, k, pool, dict(args), dict(pcfg), _labels(config, pcfg, where), config.get(ASSUMED_KEY))


def _labels(config: Mapping, pcfg: Mapping, where: str) -> tuple[str, ...] | None:
    names = config.get("label_names", pcfg.get("label_names", pcfg.get("labels")))
    if names is None:
        return None
    if isinstance(names, dict):  # id -> name where ids have gaps (timm save_config_for_hf)
        try:
            keys = sorted(names, key=int)
        except (TypeError, ValueError):
            raise FormatError(f"{where}: label_names keys {list(names)[:4]} are not class ids") from None
        if [int(i) for i in keys] != list(range(len(keys))):
            raise FormatError(f"{where}: label_names leave class ids unnamed ({keys[:4]}...)")
        names = [names[i] for i in keys]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise FormatError(f"{where}: label_names is not a list of class names")
    return tuple(names)


def _size(value: Any, name: str, where: str) -> tuple[int, int]:
    h, w = (value, value) if isinstance(value, int) else (tuple(value) if isinstance(value, list) else (None, None))
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (h, w)):
        raise FormatError(f"{where}: {name}={value!r} is not a size in pixels (an integer or [H, W])")
    return h, w


def declared_fields(hub: HubConfig, where: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(ViTConfig fields, the key each came from, model_args not read) that config.json states without
    timm: the fields the tensors cannot give (num_heads, pooling, pool_include_prefix, the image size,
    whether the position table has prefix rows, the GELU ``act_layer`` names, dynamic size and padding).
    What the tensors give is checked against ``model_args`` by ``check_fields``; model_args only timm can
    interpret (``norm_layer``, ``mlp_layer``, ...) are listed.

    Raises:
        FormatError: a value the twins cannot take (an unknown pooling or activation; named).
    """
    a, out, keys = hub.model_args, {}, {}

    def put(name: str, value: Any, key: str) -> None:
        out[name], keys[name] = value, key

    if "num_heads" in a:
        put("num_heads", a["num_heads"], "model_args num_heads")
    pool = a.get("global_pool", hub.global_pool)
    if pool is not None:
        if pool not in _POOL_FROM_TIMM:
            raise FormatError(f"{where}: global_pool={pool!r}; the twins pool {sorted(_POOL_FROM_TIMM)}")
        put("pool", _POOL_FROM_TIMM[pool], "model_args global_pool" if "global_pool" in a else "global_pool")
    for key in ("pool_include_prefix", "dynamic_img_size", "dynamic_img_pad"):
        if key in a:
            put(key, bool(a[key]), f"model_args {key}")
    if "no_embed_class" in a:
        put("posemb_prefix", not a["no_embed_class"], "model_args no_embed_class")
    if "img_size" in a:
        put("image_size", _size(a["img_size"], "img_size", where), "model_args img_size")
    elif hub.pretrained_cfg.get("fixed_input_size") and hub.pretrained_cfg.get("input_size"):
        put("image_size", _size(hub.pretrained_cfg["input_size"][1:], "input_size", where), "pretrained_cfg input_size")
    act = a.get("act_layer")
    if isinstance(act, str):
        if act not in _GELU_FROM_TIMM:
            raise FormatError(
                f"{where}: model_args act_layer={act!r}; the twins have {sorted(_GELU_FROM_TIMM)} (exact, tanh, quick)"
            )
        put("gelu", _GELU_FROM_TIMM[act], "model_args act_layer")
    unread = [f"{k}={v!r}" for k, v in a.items() if k not in _KNOWN or (k == "act_layer" and not isinstance(v, str))]
    return out, keys, unread


# What an architecture name fixes that tensor shapes cannot show (timm's entry point defaults).
NAME_IMPLIES = (
    "num_heads",
    "ln_eps",
    "gelu",
    "pool",
    "pool_include_prefix",
    "posemb_prefix",
)


def architecture_defaults(name: str, tensors: Mapping[str, Any], fields: dict[str, Any], keys: dict[str, str]) -> bool:
    """Add to ``fields`` (and ``keys``, where each came from) what the timm architecture ``name`` implies
    and config.json's model_args do not override (``NAME_IMPLIES``, and its image size where the tensors'
    position table fits it), from the table of timm's architectures (``timm_names``). False for a name
    the table does not hold (nothing added)."""
    arch = architecture_config(name)
    if arch is None:
        return False
    source = f"architecture {name} (timm {timm_version()} builds it so)"
    for field_name in NAME_IMPLIES:
        if field_name not in fields:
            fields[field_name], keys[field_name] = getattr(arch, field_name), source
    if "image_size" not in fields and _grid_fits(tensors, arch.image_size):
        fields["image_size"], keys["image_size"] = tuple(arch.image_size), source
    return True


def _grid_fits(tensors: Mapping[str, Any], size: tuple[int, int]) -> bool:
    """Whether a ``size`` image's patch grid gives the position table's rows (with or without the
    prefix tokens' rows)."""
    pe, proj = tensors.get("pos_embed"), tensors.get("patch_embed.proj.weight")
    if pe is None or proj is None or len(np.shape(pe)) != 3 or len(np.shape(proj)) != 4:
        return False
    (ph, pw), rows = np.shape(proj)[-2:], np.shape(pe)[1]
    reg = np.shape(tensors["reg_token"])[1] if "reg_token" in tensors else 0
    prefix = int("cls_token" in tensors) + int("dist_token" in tensors) + reg
    n = (size[0] // ph) * (size[1] // pw)
    return rows in (n, n + prefix)


def check_fields(hub: HubConfig, cfg: ViTConfig, where: str) -> None:
    """Refuse a config.json whose model_args contradict what the tensors give (timm would not load it).

    Raises:
        FormatError: naming each key, its stated value and the tensors' value.
    """
    a, bad = hub.model_args, []
    for key, name in _CHECKED.items():
        if key in a and a[key] != getattr(cfg, name):
            bad.append(f"{key}={a[key]!r} (the tensors give {name}={getattr(cfg, name)!r})")
    if "patch_size" in a and _size(a["patch_size"], "patch_size", where) != tuple(cfg.patch_size):
        bad.append(f"patch_size={a['patch_size']!r} (the tensors give {tuple(cfg.patch_size)})")
    if a.get("fc_norm") is not None and bool(a["fc_norm"]) != cfg.fc_norm:
        bad.append(f"fc_norm={a['fc_norm']!r} (the tensors give fc_norm={cfg.fc_norm})")
    if hub.num_classes is not None and "num_classes" not in a and hub.num_classes != cfg.num_classes:
        bad.append(f"num_classes={hub.num_classes} (the head has {cfg.num_classes} rows)")
    if bad:
        raise FormatError(f"{where}: config.json disagrees with the tensors: " + "; ".join(bad))


def check_model_args(hub: HubConfig, tensors, where: str) -> None:
    """Refuse ``model_args`` sizes (``depth``, ``embed_dim``, ``mlp_ratio``) that claim more parameters
    than the folder's tensors hold (``vit_common.system.validate.check_declared_sizes``), before
    ``timm.create_model`` builds them: a ``depth`` of 10^9 allocated gigabytes there. Values that are not
    numbers are left to the checks that name them.

    Raises:
        FormatError: naming config.json, the sizes and the count the tensors hold.
    """
    args = hub.model_args
    depth, width, ratio = args.get("depth"), args.get("embed_dim"), args.get("mlp_ratio", 4.0)
    if not isinstance(depth, int) or isinstance(depth, bool):
        return
    if not isinstance(width, int) or isinstance(width, bool):
        patch = tensors.get("patch_embed.proj.weight")
        width = int(np.shape(patch)[0]) if patch is not None and np.ndim(patch) >= 1 else 1
    mlp = int(ratio * width) if isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0 else 0
    try:
        check_declared_sizes(f"{where}: model_args", tensors, depth, width, mlp)
    except ValueError as e:
        raise FormatError(str(e)) from None


# timm entry points with rotary position embeddings (timm eva.py: DINOv3, PE, EVA-02, RoPE-ViT, SBB).
_ROPE_ARCHITECTURE = re.compile(r"rope|dinov3|^vit_pe_|^eva02")


def check_rope_head_dim(hub: HubConfig, tensors, where: str) -> None:
    """Refuse a RoPE model (``model_args`` ``use_rot_pos_emb``, or a timm RoPE architecture) whose head
    dimension (``embed_dim``, else the patch embedding's rows, over ``num_heads``) is not divisible by 4,
    the two axes' rotated pairs, before timm fails inside its tables with a shape error that names neither.

    Raises:
        FormatError: naming config.json, the sizes and the head dimension.
    """
    a = hub.model_args
    rope = a.get("use_rot_pos_emb", bool(_ROPE_ARCHITECTURE.search(hub.architecture)))
    heads, width = a.get("num_heads"), a.get("embed_dim")
    if width is None and np.ndim(tensors.get("patch_embed.proj.weight")) == 4:
        width = int(np.shape(tensors["patch_embed.proj.weight"])[0])
    if not rope or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (heads, width)):
        return
    if width % heads or (width // heads) % 4:
        raise FormatError(
            f"{where}: model_args num_heads={heads} with embed_dim={width} give head_dim={width / heads:g}; "
            f"{hub.architecture}'s rotary position embeddings need head_dim divisible by 4 (two axes x rotated pairs)"
        )


def read_hub(src: Source, opts) -> Decoded:
    """Canonical state, config and provenance of a timm hub folder (``src.config`` is its config.json):
    timm's own reading (``opts.readers["timm"]``), else the config our writer put in the weights' header,
    else what config.json states (module docstring).

    Raises:
        FormatError: a malformed config.json, a model timm builds that the twins lack (named), or one
            that contradicts the tensors. StateMismatchError: tensors that do not fit timm's model.
    """
    where = str(src.path / "config.json")
    hub = hub_config(src.config or {}, where)
    layout = f"timm hub folder, architecture {hub.architecture}{layout_note(src.tensors)}"
    reader = (opts.readers or {}).get("timm")
    # a timm Eva's LayerScale, split q/k/v and SwiGLU (identity for a plain ViT), then DDP's prefix
    tensors, notes = normalise_keys(eva_to_canonical(src.tensors))
    check_model_args(hub, tensors, where)  # before timm builds a module per declared block
    check_rope_head_dim(hub, tensors, where)  # before timm fails inside its rotary tables
    cfg = reader(src.path) if reader is not None else None
    if cfg is not None and is_naflex(tensors):
        check_naflex_grid(hub.model_args, hub.architecture, tensors, cfg.grid, where)
        tensors = naflex_state(tensors, cfg.patch_size, cfg.in_chans)
    if cfg is not None:
        dt = common_float_dtype(tensors)
        if dt in ("float32", "float64", "bfloat16", "float16"):
            cfg = cfg.replace(param_dtype=dt)
        how = f"config.json: timm.create_model('local-dir:...') builds {hub.architecture}"
        dec = decode_stored(cfg, tensors, layout, src.context, how, hub.assumed)
        if cfg.dynamic_img_size and is_naflex(src.tensors):  # the table's size, not the inputs'
            (gh, gw), size = cfg.grid, hub.pretrained_cfg.get("input_size")
            inputs = f"; its inputs: any size, pretrained_cfg input_size {size}" if size else ""
            dec.provenance["image_size"] = declared(f"{how}: its {gh}x{gw} position table x the patch{inputs}")
        dec.notes += notes
        return dec
    why = "no timm reader was given" if reader is None else "timm is not installed"
    if "vit_config" in src.meta:  # written by us: the header holds the config config.json names
        stored, more = config_from_json(src.meta["vit_config"], src.context)
        tensors = naflex_state(tensors, stored.patch_size, stored.in_chans) if is_naflex(tensors) else tensors
        dec = decode_stored(stored, tensors, layout, src.context, f"{HUB_WEIGHTS} metadata", hub.assumed)
        dec.notes += notes + more + [f"{why}: the config was read from {HUB_WEIGHTS}'s metadata"]
        return dec
    fields, keys, unread = declared_fields(hub, where)
    known = architecture_defaults(hub.architecture, tensors, fields, keys)
    given = dict(opts.overrides)
    size = fields.pop("image_size", None) or opts.source_image_size  # load_checkpoint refuses a conflict
    dec = (infer_naflex if is_naflex(src.tensors) else infer)(
        src.tensors,
        source_image_size=size,
        overrides={k: v for k, v in fields.items() if k not in given} | given,
        context=src.context,
    )
    check_fields(hub, dec.cfg, where)
    for name in fields:
        if name not in given:
            dec.provenance[name] = declared(f"config.json {keys[name]}")
    if "image_size" in keys:
        dec.provenance["image_size"] = declared(f"config.json {keys['image_size']}")
    dec.layout = layout
    dec.notes.append(
        f"{why}: what {hub.architecture} implies is declared from the table of timm {timm_version()}'s "
        "architectures (vit_common/checkpoints/formats/timm_architectures.json)"
        if known
        else f"{why}: only what config.json states is declared; timm builds {hub.architecture} with its own "
        "defaults, which the table of timm's architectures does not hold (install timm, or pass the fields "
        "flagged below, to state the rest)"
    )
    if unread:
        dec.notes.append(f"config.json model_args not read without timm: {', '.join(unread)}")
    return dec


def hub_preprocess(hub: HubConfig, where: str) -> Preprocess | None:
    """The evaluation preprocessing ``pretrained_cfg`` declares, as timm's ``resolve_data_config`` +
    ``transforms_imagenet_eval`` apply it: mean, std, interpolation, crop_pct, crop_mode, with timm's
    defaults for a missing key (ImageNet mean/std, bicubic, 0.875, center); None where it states neither
    mean nor std (timm's save_for_hf always writes both: such a config.json does not declare one).

    Raises:
        FormatError: a value the project's preprocessing cannot represent (timm's 'border' crop mode, an
            unknown filter, malformed numbers), named.
    """
    p = hub.pretrained_cfg
    if p.get("mean") is None and p.get("std") is None:
        return None
    mean, std = p.get("mean") or IMAGENET_DEFAULT_MEAN, p.get("std") or IMAGENET_DEFAULT_STD
    interpolation = p.get("interpolation") or DEFAULT_INTERPOLATION
    crop_pct, crop_mode = p.get("crop_pct") or DEFAULT_CROP_PCT, p.get("crop_mode") or DEFAULT_CROP_MODE
    if crop_mode not in CROP_MODES:
        raise FormatError(f"{where}: pretrained_cfg crop_mode={crop_mode!r}; the project crops {CROP_MODES}")
    if interpolation not in INTERPOLATIONS:
        raise FormatError(f"{where}: pretrained_cfg interpolation={interpolation!r}; expected one of {INTERPOLATIONS}")
    try:
        return Preprocess(tuple(mean), tuple(std), interpolation, float(crop_pct), crop_mode)
    except (TypeError, ValueError) as e:
        raise FormatError(f"{where}: pretrained_cfg preprocessing is invalid ({e})") from e


def hub_config_json(cfg: ViTConfig, assumed=(), qkv: str = "fused", architecture: str = "") -> dict[str, Any]:
    """The config.json of a timm hub folder holding ``cfg`` (as timm's ``save_config_for_hf`` lays it
    out): the architecture of its eps (``HUB_ARCHITECTURES``; ``HUB_DISTILLED`` for DeiT's distilled
    head), every keyword of ``timm_kwargs`` as ``model_args`` (tuples as lists, drop rates left out as timm
    leaves them out), and a ``pretrained_cfg`` with the input size; ``assumed`` fields under
    ``ASSUMED_KEY`` (timm ignores the key). A RoPE backbone (``timm_eva.is_eva``) is timm's ``Eva``: the
    name ``timm_eva.eva_name`` picks (``architecture``, the source's, where it builds the same eps) and
    ``timm_eva.eva_kwargs`` with ``qkv`` ('fused' | 'split') as ``model_args``; a NaFlexVit (a ``naflexvit_*``
    ``architecture``) ``timm_naflex.naflex_kwargs``.

    Raises:
        ValueError: timm cannot build ``cfg``, or no architecture has its LayerNorm eps.
    """
    if is_naflex_name(architecture):
        arch, args = architecture, naflex_kwargs(cfg)
    elif is_eva(cfg):
        arch = eva_name(cfg, architecture)
        if arch is None:
            raise ValueError(
                f"the timm hub folder format cannot hold this model: ln_eps={cfg.ln_eps!r} (config.json names a "
                "timm Eva architecture, whose LayerNorm eps is 1e-6 or 1e-5; a timm .safetensors file can hold it)"
            )
        args = {k: v for k, v in eva_kwargs(cfg, qkv).items() if not k.endswith("drop_rate")}
    else:
        refuse("timm hub folder", hub_cannot_hold(cfg))
        kw = timm_kwargs(cfg)
        kw.pop("norm_eps"), kw.pop("norm_class")
        if kw["proj_bias"]:  # timm's default
            kw.pop("proj_bias")
        args = {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items() if not k.endswith("drop_rate")}
        arch = hub_architecture(cfg)
    pcfg = {
        "input_size": [cfg.in_chans, *cfg.image_size],
        "fixed_input_size": not (cfg.dynamic_img_size or is_naflex_name(arch)),  # a NaFlexVit takes any size
        "num_classes": cfg.num_classes,
        "first_conv": "embeds.proj" if is_naflex_name(arch) else "patch_embed.proj",
        "classifier": ["head", "head_dist"] if cfg.head_dist else "head",
        "custom_load": False,
    }
    config = {"architecture": arch, "num_classes": cfg.num_classes, "num_features": cfg.features_dim}
    if POOL_TO_TIMM.get(cfg.pool):
        config["global_pool"] = POOL_TO_TIMM[cfg.pool]
    config |= {"model_args": args, "pretrained_cfg": pcfg}
    return config | ({ASSUMED_KEY: sorted(assumed)} if assumed else {})


def hub_architecture(cfg: ViTConfig) -> str:
    """The timm architecture a written folder names: one whose defaults equal ``cfg`` (``timm_names.
    matching_name``: ``vit_tiny_patch16_224`` for a Ti/16 at 224 px), else the variant's timm name where
    it builds the same LayerNorm eps and head (``timm_state.timm_model_name``), else ``HUB_ARCHITECTURES``
    by eps (or ``HUB_DISTILLED``). model_args spell out every other keyword, so the name decides only the
    LayerNorm eps; a matching one also tells a reader what the model is."""
    name = matching_name(cfg) or timm_model_name(cfg)
    arch = architecture_config(name) if name else None
    if arch is not None and arch.ln_eps == cfg.ln_eps and arch.head_dist == cfg.head_dist:
        return name
    return HUB_DISTILLED if cfg.head_dist else HUB_ARCHITECTURES[cfg.ln_eps]


def hub_cannot_hold(cfg: ViTConfig) -> list[str]:
    """What a timm hub folder cannot hold beyond a timm file: a LayerNorm eps no architecture builds
    (timm's ``norm_layer`` is not a JSON value), distilled with eps 1e-5, a gated MLP (``mlp_layer`` is a
    class too)."""
    eps = "1e-6" if cfg.head_dist else "1e-6 or 1e-5 (CLIP's)"
    return unsupported(
        "timm hub folder",
        {
            f"ln_eps={cfg.ln_eps!r} (config.json names a timm architecture, whose LayerNorm eps is {eps}; "
            "a timm .safetensors file records it in its metadata)": (
                cfg.ln_eps != 1e-6 if cfg.head_dist else cfg.ln_eps not in HUB_ARCHITECTURES
            ),
            "mlp_type='swiglu' (model_args cannot name timm's SwiGLUPacked class; a timm .safetensors file "
            "can hold it)": cfg.mlp_type == "swiglu",
            "norm='rmsnorm' or patch_norm (model_args cannot give timm's RmsNorm its eps; a timm .safetensors "
            "file can hold it)": cfg.norm == "rmsnorm" or cfg.patch_norm,
        },
    )


def timm_preprocess(preprocess: Preprocess, image_size: tuple[int, int]) -> tuple[Preprocess, list[str]]:
    """(``preprocess`` as timm's ``size / crop_pct`` rule, notes) at ``image_size`` (H, W): a
    transformers geometry (``Preprocess.resize_size``, read from a preprocessor_config.json) becomes the
    crop_pct of its crop over its resize, with a note, as timm rounds the crop offset where transformers
    floors it and its resize is ``floor(size / crop_pct)``; ``rescale_before_resize`` is dropped, with a note
    (timm resizes uint8 pixels). A NaFlex patch budget (``max_patches``), which ``pretrained_cfg`` has no key
    for, is left out with a note.

    Raises:
        ValueError: a rescale_factor other than 1/255 (timm's ``ToTensor`` divides by 255), a crop larger
            than the resize, or one whose sides scale differently.
    """
    if abs(preprocess.rescale_factor * 255 - 1) > 1e-12:
        raise ValueError(f"rescale_factor={preprocess.rescale_factor!r}: timm's pretrained_cfg scales pixels by 1/255")
    if preprocess.max_patches is not None:
        fixed, notes = timm_preprocess(preprocess.replace(max_patches=None), image_size)
        h, w = image_size
        note = f"pretrained_cfg: the NaFlex patch budget (max_patches={preprocess.max_patches}) is left out"
        return fixed, [f"{note} (no pretrained_cfg key holds it); {h}x{w} images", *notes]
    notes = []
    if preprocess.rescale_before_resize:
        preprocess = preprocess.replace(rescale_before_resize=False)
        notes.append("pretrained_cfg: timm resizes uint8 pixels where transformers' DINOv3 processor resizes floats")
    if preprocess.resize_size is None:
        return preprocess, notes
    resize = preprocess.resize_size
    crop = preprocess.crop_size or (resize if len(resize) == 2 else image_size)
    pcts = {c / r for c, r in zip(crop, resize * 2 if len(resize) == 1 else resize, strict=True)}
    if len(pcts) != 1 or max(pcts) > 1:
        raise ValueError(f"resize_size={list(resize)} with crop_size={list(crop)}: timm's crop_pct cannot give it")
    mode = "center" if len(resize) == 1 else "squash"
    timm = preprocess.replace(resize_size=None, crop_size=None, crop_pct=pcts.pop(), crop_mode=mode)
    return timm, notes + [
        f"pretrained_cfg: transformers' resize to {list(resize)} and crop to {list(crop)} as timm's crop_pct "
        f"{timm.crop_pct:.6g} ({mode}); timm rounds the crop offset where transformers floors it, a pixel apart "
        "on some images"
    ]


def hub_pretrained_cfg(preprocess: Preprocess, channels: int) -> dict[str, Any]:
    """``pretrained_cfg`` entries of ``preprocess`` for C = ``channels`` (mean and std per channel).

    Raises:
        ValueError: mean/std give neither one value nor C.
    """
    preprocess.channel_stats(channels)  # raises if mean/std do not fit C
    mean, std = (list(v) * (channels if len(v) == 1 else 1) for v in (preprocess.mean, preprocess.std))
    return {
        "interpolation": preprocess.interpolation,
        "crop_pct": preprocess.crop_pct,
        "crop_mode": preprocess.crop_mode,
        "mean": mean,
        "std": std,
    }


def hub_load_call(path: str | Path) -> str:
    """Python code loading the hub folder at ``path`` with timm, strictly (timm's ``load_pretrained``
    loads model.safetensors with ``strict=True``)."""
    return f"import timm\nmodel = timm.create_model({'local-dir:' + str(path)!r}, pretrained=True)"
