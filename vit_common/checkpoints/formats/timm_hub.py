"""timm hub folders: what timm's ``save_for_hf`` / ``push_to_hub`` write and ``timm.create_model(
"local-dir:PATH")`` / ``"hf-hub:ORG/NAME"`` read (timm ``models/_hub.py``): ``config.json`` beside
``model.safetensors`` (or ``pytorch_model.bin``), the tensors a timm ``VisionTransformer`` state_dict.

config.json (timm 1.0.31 ``save_config_for_hf``; ``_parse_model_cfg`` reads it)::

    {"architecture": "vit_base_patch16_clip_224",      # the timm model name, which fixes its defaults
     "num_classes": 1000, "num_features": 768, "global_pool": "token",   # informational
     "model_args": {"embed_dim": 768, "img_size": [224, 224], ...},      # create_model keywords (1.0.x)
     "label_names": [...],                                                # optional
     "pretrained_cfg": {"input_size": [3, 224, 224], "interpolation": "bicubic", "crop_pct": 0.95,
                        "crop_mode": "center", "mean": [...], "std": [...], "num_classes": 1000, ...}}

Older exports have no ``model_args`` (the architecture alone builds the model), and the oldest put every
key at the top level without ``pretrained_cfg`` (timm reads those too).

The config is **declared** by the model timm builds from the folder: the caller's ``readers["timm"]``
(``vit_torch.formats.READERS``; in ``vit_jax.formats.READERS`` a child process, since vit_jax never
imports torch) builds ``timm.create_model("local-dir:PATH", pretrained=False)`` on the meta device and
reads its fields, so what the name implies (CLIP's LayerNorm eps 1e-5, pre_norm) is declared too. Without
timm (no reader, or it returns None) the fields config.json states are declared (``declared_fields``), the
rest is read off the tensors as for a timm file (``timm.infer``) and assumed where shapes cannot tell.
``pretrained_cfg`` declares the preprocessing (``hub_preprocess``; timm ``data/config.py``
``resolve_data_config`` defaults for missing keys) and ``label_names`` the class names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_common.checkpoints.formats.base import (
    Decoded,
    FormatError,
    ReadOptions,
    Source,
    common_float_dtype,
    declared,
)
from vit_common.checkpoints.formats.canonical import decode_stored
from vit_common.checkpoints.formats.timm import GELU_TO_TIMM, POOL_TO_TIMM, _normalise, infer
from vit_common.config import ViTConfig
from vit_common.data.images import CROP_MODES, INTERPOLATIONS, Preprocess

# timm data/constants.py: what resolve_data_config takes where pretrained_cfg has no value.
IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875
DEFAULT_CROP_MODE = "center"
DEFAULT_INTERPOLATION = "bicubic"

TimmReader = Callable[[Path], "ViTConfig | None"]

_POOL_FROM_TIMM = {v: k for k, v in POOL_TO_TIMM.items()}
_GELU_FROM_TIMM = {v: k for k, v in GELU_TO_TIMM.items()} | {"gelu_pytorch_tanh": "tanh"}
# model_args a reader without timm checks against the tensors: key -> ViTConfig field.
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
}
# model_args that change nothing a trained model computes (initialisation, training-time dropout).
_INERT = frozenset(
    {
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
)


@dataclass(frozen=True)
class HubConfig:
    """A timm hub folder's config.json, as timm ``_parse_model_cfg`` splits it: ``architecture`` (timm
    model name), ``num_classes`` (K, or None where unstated), ``global_pool`` (the informational top-level
    key, or None), ``model_args`` (create_model keywords), ``pretrained_cfg`` (preprocessing and labels),
    ``label_names`` (K class names, or None)."""

    architecture: str
    num_classes: int | None = None
    global_pool: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    pretrained_cfg: dict[str, Any] = field(default_factory=dict)
    label_names: tuple[str, ...] | None = None


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
    return HubConfig(arch, k, pool, dict(args), dict(pcfg), _labels(config, pcfg, where))


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
    whether the position table has prefix rows, the GELU named in ``act_layer``, dynamic size and
    padding). What the tensors give is checked against ``model_args`` by ``check_fields``; model_args
    that need timm to interpret (``norm_layer``, ``mlp_layer``, a name's defaults...) are listed.

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
    for key, name in (
        ("pool_include_prefix", "pool_include_prefix"),
        ("dynamic_img_size", "dynamic_img_size"),
        ("dynamic_img_pad", "dynamic_img_pad"),
    ):
        if key in a:
            put(name, bool(a[key]), f"model_args {key}")
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
    known = {"num_heads", "global_pool", "pool_include_prefix", "dynamic_img_size", "dynamic_img_pad"}
    known |= {"no_embed_class", "img_size", "patch_size", "mlp_ratio", "init_values", "fc_norm", "pos_embed"}
    known |= set(_CHECKED) | _INERT | {"act_layer"}
    unread = [f"{k}={v!r}" for k, v in a.items() if k not in known]
    if act is not None and not isinstance(act, str):
        unread.append(f"act_layer={act!r}")
    return out, keys, unread


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
    if "fc_norm" in a and a["fc_norm"] is not None and bool(a["fc_norm"]) != cfg.fc_norm:
        bad.append(f"fc_norm={a['fc_norm']!r} (the tensors give fc_norm={cfg.fc_norm})")
    if hub.num_classes is not None and "num_classes" not in a and hub.num_classes != cfg.num_classes:
        bad.append(f"num_classes={hub.num_classes} (the head has {cfg.num_classes} rows)")
    if bad:
        raise FormatError(f"{where}: config.json disagrees with the tensors: " + "; ".join(bad))


def read(src: Source, opts: ReadOptions) -> Decoded:
    """Canonical state, config and provenance of a timm hub folder (``src.config`` is its config.json).

    ``opts.readers["timm"](folder) -> ViTConfig | None`` is timm's own reading (None: timm is not
    installed); without it the config.json fields are declared and the rest inferred (module docstring).

    Raises:
        FormatError: a malformed config.json, a model timm builds that the twins lack (named), or one
            that contradicts the tensors. StateMismatchError: tensors that do not fit timm's model.
    """
    where = str(src.path / "config.json")
    hub = hub_config(src.config or {}, where)
    layout = f"timm hub folder, architecture {hub.architecture}"
    reader = (opts.readers or {}).get("timm")
    cfg = reader(src.path) if reader is not None else None
    if cfg is not None:
        tensors, notes = _normalise(src.tensors)
        dt = common_float_dtype(tensors)
        if dt in ("float32", "float64", "bfloat16", "float16"):
            cfg = cfg.replace(param_dtype=dt)
        how = f"config.json: timm.create_model('local-dir:...') builds {hub.architecture}"
        dec = decode_stored(cfg, tensors, layout, src.context, how)
        dec.notes += notes
        return dec
    fields, keys, unread = declared_fields(hub, where)
    given = dict(opts.overrides)
    size = fields.pop("image_size", None) or opts.source_image_size  # load_checkpoint refuses a conflict
    dec = infer(
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
    why = "no timm reader was given" if reader is None else "timm is not installed"
    dec.notes.append(
        f"{why}: only what config.json states is declared; timm builds {hub.architecture} with its own "
        "defaults (install timm, or pass the fields flagged below, to state the rest)"
    )
    if unread:
        dec.notes.append(f"config.json model_args not read without timm: {', '.join(unread)}")
    return dec


def hub_preprocess(hub: HubConfig, where: str) -> Preprocess:
    """The evaluation preprocessing ``pretrained_cfg`` declares, as timm's ``resolve_data_config`` +
    ``transforms_imagenet_eval`` apply it: mean, std, interpolation, crop_pct, crop_mode (timm's defaults
    for a missing key: ImageNet mean/std, bicubic, 0.875, center).

    Raises:
        FormatError: a value the project's preprocessing cannot represent (timm's 'border' crop mode, an
            unknown filter, malformed numbers), named.
    """
    p = hub.pretrained_cfg
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


__all__ = [
    "HubConfig",
    "TimmReader",
    "check_fields",
    "declared_fields",
    "hub_config",
    "hub_preprocess",
    "is_hub_config",
    "read",
]
