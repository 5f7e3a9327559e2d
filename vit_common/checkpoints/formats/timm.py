"""timm ``VisionTransformer`` (and DeiT ``VisionTransformerDistilled``) state_dicts <-> the canonical
state, which uses timm's names already.

Reading accepts DDP's ``module.`` prefix and DeiT III's LayerScale spelling (``blocks.i.gamma_1`` /
``gamma_2``, timm ``checkpoint_filter_fn(adapt_layer_scale=True)``). A timm file stores no config. Tensor
shapes and presence derive patch size, width, depth, MLP width, qkv bias, qk_norm (and with it the head
count), class / distillation / register tokens, the position table and whether it has prefix rows,
LayerScale, norm_pre and the patch bias (CLIP-style ``pre_norm``), fc_norm, the MAP head and the heads.
What shapes cannot tell is assumed and warned: the head count (without qk_norm), the pooling of files
without a MAP head or distillation token (token, avg, max, avgmax or none), ``pool_include_prefix``, a
square grid (the image size), GELU (timm's default exact) and LayerNorm eps (timm's 1e-6).

Files we write as ``.safetensors`` carry the config in the header metadata (timm ignores it), so they
read back with every field declared. What timm has and the twins lack is refused by name
(``provenance.UNSUPPORTED_TENSORS``; a model without a final norm; attention without an output bias).

timm hub folders are what timm's ``save_for_hf`` / ``push_to_hub`` write and ``timm.create_model(
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
declares what config.json states (``declared_fields``), checks it against the tensors (``check_fields``)
and infers the rest as for a timm file, assumed where shapes cannot tell. ``pretrained_cfg`` declares the
preprocessing (``hub_preprocess``; timm ``data/config.py`` ``resolve_data_config`` defaults for missing
keys), ``label_names`` the class names. ``vit convert --to timm DIR`` (a destination without a file
suffix) writes such a folder, which ``timm.create_model("local-dir:DIR", pretrained=True)`` loads strictly:
``vit_base_patch16_224`` (eps 1e-6), ``vit_base_patch16_clip_224`` (eps 1e-5) or, distilled,
``deit_base_distilled_patch16_224``, with every keyword of ``timm_kwargs`` in ``model_args``.

``timm_kwargs(cfg)`` is the one mapping from a ViTConfig to timm's keyword arguments (the benchmarks,
the oracles, ``load_call`` and the hub folders' ``model_args`` use it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Format, Reference, Source, WriteOptions, writer
from vit_common.checkpoints.formats.provenance import (
    ASSUMED_KEY,
    Origin,
    assumed,
    build_config,
    common_float_dtype,
    declared,
    derived,
    guess_num_heads,
    posemb_layout,
    positive_dims,
    refuse_unsupported,
    shape_fields,
    square_grid_origin,
)
from vit_common.checkpoints.formats.rules import (
    Piece,
    Rule,
    copy,
    materialize_posemb,
    refuse,
    to_canonical,
    unsupported,
)
from vit_common.checkpoints.formats.source import TORCH_SUFFIXES, read_safetensors
from vit_common.checkpoints.formats.stored_config import assumed_meta, config_from_json, decode_stored
from vit_common.checkpoints.hub import is_hub_id
from vit_common.checkpoints.metadata import Declared, info_metadata
from vit_common.config import ViTConfig
from vit_common.data.images import CROP_MODES, INTERPOLATIONS, PRESETS, Preprocess
from vit_common.state import canonical_shapes
from vit_common.system import io

_DEIT3_GAMMA = re.compile(r"^(blocks\.\d+)\.gamma_([12])$")
POOL_TO_TIMM = {"token": "token", "gap": "avg", "max": "max", "avgmax": "avgmax", "map": "map", "none": ""}
GELU_TO_TIMM = {"exact": "gelu", "tanh": "gelu_tanh", "quick": "quick_gelu"}
META_TAG = ("vit_twins", "timm/1")  # header metadata key and value of the timm files we write


def is_timm(keys) -> bool:
    """True if the key names are a timm VisionTransformer state_dict (optionally ``module.``-prefixed)."""
    return any(k in ("patch_embed.proj.weight", "module.patch_embed.proj.weight") for k in keys)


def _normalise(tensors: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[str]]:
    notes = []
    if tensors and all(k.startswith("module.") for k in tensors):
        tensors = {k[len("module.") :]: v for k, v in tensors.items()}
        notes.append("stripped the 'module.' prefix (DistributedDataParallel)")
    out = {}
    for k, v in tensors.items():
        m = _DEIT3_GAMMA.match(k)
        out[f"{m.group(1)}.ls{m.group(2)}.gamma" if m else k] = v
    if any(_DEIT3_GAMMA.match(k) for k in tensors):
        notes.append("DeiT III LayerScale names gamma_1/gamma_2 read as ls1.gamma/ls2.gamma")
    return out, notes


def _pooling(t: Mapping[str, np.ndarray], fc_norm: bool, class_token: bool) -> tuple[str, Origin]:
    if "attn_pool.latent" in t:
        return "map", derived("attn_pool tensors: timm's MAP head (AttentionPoolLatent)")
    if "dist_token" in t:
        return "token", derived("dist_token: timm's distilled ViT reads the class and distillation tokens")
    if fc_norm:
        return "gap", assumed("not stored; fc_norm comes with timm's avg, max and avgmax pooling: avg assumed")
    if class_token:
        return "token", assumed("not stored; timm's default global_pool='token' (avg with fc_norm=False is possible)")
    return "gap", assumed("not stored; no class token: timm's avg assumed (max, avgmax or none are possible)")


_FC1 = re.compile(r"^(blocks\.\d+\.mlp)\.fc1\.(weight|bias)$")


def timm_rules(cfg: ViTConfig, split_gate: bool = False) -> list[Rule]:
    """timm state_dict -> canonical state for ``cfg``: each tensor itself, or with ``split_gate`` (timm
    ``SwiGLU``) each canonical fc1 [2F, ...] = the gate's ``fc1_g`` rows then the value's ``fc1_x`` rows
    (our packed fc1 puts the gate first, as timm's ``SwiGLUPacked``)."""
    rules = []
    for key, shape in canonical_shapes(cfg).items():
        m = _FC1.match(key) if split_gate else None
        if m is None:
            rules.append(copy(key, key, shape))
            continue
        half = (shape[0] // 2,) + tuple(shape[1:])
        rules.append(Rule(key, (Piece(f"{m[1]}.fc1_g.{m[2]}", half), Piece(f"{m[1]}.fc1_x.{m[2]}", half))))
    return rules


def infer(
    tensors: Mapping[str, np.ndarray],
    *,
    source_image_size: tuple[int, int] | None = None,
    overrides: Mapping[str, Any] = (),
    context: str = "timm file",
) -> Decoded:
    """Canonical state, config and provenance of a timm state_dict (numpy arrays) that stores no config.

    Args:
        source_image_size: (H, W) the file was trained at, when known; otherwise its grid must be square.
        overrides: ViTConfig fields that replace inferred values (num_heads, pool, gelu, ln_eps...).

    Raises:
        FormatError: the shapes do not describe a ViT the twins implement (what is missing is named),
            or the inferred config is invalid.
        StateMismatchError: tensors missing, unexpected or of the wrong shape for the inferred config.
    """
    t, notes = _normalise(tensors)
    overrides = dict(overrides)
    if "patch_embed.proj.weight" not in t or np.ndim(t["patch_embed.proj.weight"]) != 4:
        raise FormatError(f"{context}: no 4-D patch_embed.proj.weight, so not a timm VisionTransformer")
    refuse_unsupported(
        t,
        context,
        {
            "an attention pooling head other than MAP (attn_pool without attn_pool.latent, e.g. timm 'prr')": (
                any(k.startswith("attn_pool.") for k in t) and "attn_pool.latent" not in t
            ),
            "a distillation token together with register tokens (timm's distilled ViT has none)": (
                "dist_token" in t and "reg_token" in t
            ),
            "no final LayerNorm (timm final_norm=False: neither norm nor fc_norm)": (
                "norm.weight" not in t and "fc_norm.weight" not in t and "blocks.0.norm1.weight" in t
            ),
            "attention and MLP output projections without bias (timm proj_bias=False)": (
                "blocks.0.attn.proj.weight" in t and "blocks.0.attn.proj.bias" not in t
            ),
        },
    )
    d, c, ph, pw = positive_dims(np.shape(t["patch_embed.proj.weight"]), "patch_embed.proj.weight", context)
    grid = (source_image_size[0] // ph, source_image_size[1] // pw) if source_image_size else None
    depth = 0
    while f"blocks.{depth}.norm1.weight" in t:
        depth += 1
    split_gate = "blocks.0.mlp.fc1_g.weight" in t  # timm SwiGLU: fc1_g (gate) and fc1_x (value)
    fc1 = t.get("blocks.0.mlp.fc1_g.weight" if split_gate else "blocks.0.mlp.fc1.weight")
    fc2 = t.get("blocks.0.mlp.fc2.weight")
    if depth == 0 or fc1 is None or np.ndim(fc1) != 2 or fc2 is None or np.ndim(fc2) != 2:
        raise FormatError(f"{context}: no blocks.0.norm1.weight / 2-D blocks.0.mlp.fc1.weight and fc2.weight")
    f, prov = shape_fields(patch_size=(ph, pw), in_chans=c, width=d, depth=depth, num_classes=0)
    f["mlp_dim"] = np.shape(fc2)[1]
    prov["mlp_dim"] = derived("blocks.0.mlp.fc2 columns")
    if split_gate:
        f["mlp_type"] = "swiglu"
        prov["mlp_type"] = derived("blocks.0.mlp.fc1_g / fc1_x: timm SwiGLU, gate fc1_g")
    elif np.shape(fc1)[0] == 2 * np.shape(fc2)[1]:
        f["mlp_type"] = "swiglu"
        prov["mlp_type"] = assumed(
            "blocks.0.mlp.fc1 has 2 x fc2's columns: a packed gated MLP, read with the gate rows first as timm's "
            "SwiGLUPacked (vit_giant_patch14_dinov2); a GluMlp(gate_last=True) file needs its fc1 halves swapped"
        )
    elif np.shape(fc1)[0] == np.shape(fc2)[1]:
        f["mlp_type"], prov["mlp_type"] = "plain", derived("blocks.0.mlp.fc1 rows = fc2 columns")
    else:
        raise FormatError(
            f"{context}: blocks.0.mlp.fc1 has {np.shape(fc1)[0]} rows and fc2 takes {np.shape(fc2)[1]}: "
            "neither a plain MLP nor a packed gated one"
        )
    flags = {
        "patch_bias": "patch_embed.proj.bias" in t,
        "qkv_bias": "blocks.0.attn.qkv.bias" in t,
        "qk_norm": "blocks.0.attn.q_norm.weight" in t,
        "class_token": "cls_token" in t,
        "dist_token": "dist_token" in t,
        "head_dist": "dist_token" in t,
        "norm_pre": "norm_pre.weight" in t,
        "fc_norm": "fc_norm.weight" in t and "norm.weight" not in t,
    }
    f.update(flags)
    prov.update({k: derived("tensors present") for k in flags})
    prov["head_dist"] = derived("dist_token: timm's distilled ViT always has the distilled head")
    f["reg_tokens"] = np.shape(t["reg_token"])[1] if "reg_token" in t and np.ndim(t["reg_token"]) == 3 else 0
    prov["reg_tokens"] = derived("reg_token shape")
    if f["qk_norm"]:
        f["num_heads"] = d // max(1, np.shape(t["blocks.0.attn.q_norm.weight"])[0])
        prov["num_heads"] = derived("width / q_norm size")
    elif "num_heads" not in overrides:  # given: no guess, and no refusal where no rule guesses one
        f["num_heads"], prov["num_heads"] = guess_num_heads(d)
    if "blocks.0.ls1.gamma" in t:
        f["layer_scale"] = 1e-5  # the init value is not stored and changes nothing once gamma is loaded
    f["pool"], prov["pool"] = _pooling(t, f["fc_norm"], f["class_token"])
    f["pool_include_prefix"] = False
    prov["pool_include_prefix"] = assumed("not stored; timm's default pool_include_prefix=False")
    f["rep_size"] = np.shape(t["pre_logits.fc.weight"])[0] if "pre_logits.fc.weight" in t else 0
    prov["rep_size"] = derived("pre_logits tensors")
    if "head.weight" in t and np.ndim(t["head.weight"]) == 2:
        f["num_classes"] = np.shape(t["head.weight"])[0]
    prov["num_classes"] = derived("head shape")
    f["head_bias"] = "head.bias" in t or "head.weight" not in t
    prov["head_bias"] = derived("head.bias present or not")
    num_prefix = int(f["class_token"]) + int(f["dist_token"]) + f["reg_tokens"]
    if "pos_embed" in t and np.ndim(t["pos_embed"]) == 3:
        f["posemb"] = "learn"
        (gh, gw), f["posemb_prefix"], prov["posemb_prefix"] = posemb_layout(
            np.shape(t["pos_embed"])[1], num_prefix, grid, "pos_embed", context
        )
        f["image_size"] = (gh * ph, gw * pw)
        prov["image_size"] = (
            derived("pos_embed rows and the given size") if grid else square_grid_origin((gh, gw), "the pos_embed rows")
        )
    else:
        f["posemb"], f["posemb_prefix"] = "none", True
        prov["posemb_prefix"] = derived("no pos_embed")
        gh, gw = grid or (224 // ph, 224 // pw)
        f["image_size"] = (gh * ph, gw * pw)
        prov["image_size"] = derived("the given size") if grid else assumed("not stored (no pos_embed); 224 assumed")
    prov["posemb"] = derived("pos_embed present or not")
    f["gelu"], prov["gelu"] = "exact", assumed("not stored; timm's default nn.GELU (exact erf)")
    f["ln_eps"], prov["ln_eps"] = 1e-6, assumed("not stored; timm's default LayerNorm eps 1e-6")
    dt = common_float_dtype(t)
    if dt in ("float32", "float64", "bfloat16", "float16"):
        f["param_dtype"] = dt
    cfg = build_config(f, prov, overrides, context)
    rules = timm_rules(cfg, split_gate)
    layout = "timm VisionTransformerDistilled state_dict" if cfg.dist_token else "timm state_dict"
    return Decoded(cfg, to_canonical(rules, t, context), layout, prov, [], notes)


# ------------------------------------------------------------------------------- timm hub folders

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
    layout = f"timm hub folder, architecture {hub.architecture}"
    reader = (opts.readers or {}).get("timm")
    cfg = reader(src.path) if reader is not None else None
    tensors, notes = _normalise(src.tensors)
    if cfg is not None:
        dt = common_float_dtype(tensors)
        if dt in ("float32", "float64", "bfloat16", "float16"):
            cfg = cfg.replace(param_dtype=dt)
        how = f"config.json: timm.create_model('local-dir:...') builds {hub.architecture}"
        dec = decode_stored(cfg, tensors, layout, src.context, how, hub.assumed)
        dec.notes += notes
        return dec
    why = "no timm reader was given" if reader is None else "timm is not installed"
    if "vit_config" in src.meta:  # written by us: the header holds the config config.json names
        stored, more = config_from_json(src.meta["vit_config"], src.context)
        dec = decode_stored(stored, tensors, layout, src.context, f"{HUB_WEIGHTS} metadata", hub.assumed)
        dec.notes += notes + more + [f"{why}: the config was read from {HUB_WEIGHTS}'s metadata"]
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
    dec.notes.append(
        f"{why}: only what config.json states is declared; timm builds {hub.architecture} with its own "
        "defaults (install timm, or pass the fields flagged below, to state the rest)"
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


def hub_config_json(cfg: ViTConfig, assumed=()) -> dict[str, Any]:
    """The config.json of a timm hub folder holding ``cfg`` (as timm's ``save_config_for_hf`` lays it
    out): the architecture of its eps (``HUB_ARCHITECTURES``; ``HUB_DISTILLED`` for DeiT's distilled
    head), every keyword of ``timm_kwargs`` as ``model_args`` (tuples as lists, drop rates left out as timm
    leaves them out), and a ``pretrained_cfg`` with the input size; ``assumed`` fields under
    ``ASSUMED_KEY`` (timm ignores the key).

    Raises:
        ValueError: timm cannot build ``cfg``, or no architecture has its LayerNorm eps.
    """
    refuse("timm hub folder", hub_cannot_hold(cfg))
    kw = timm_kwargs(cfg)
    kw.pop("norm_eps")
    args = {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items() if not k.endswith("drop_rate")}
    pcfg = {
        "input_size": [cfg.in_chans, *cfg.image_size],
        "fixed_input_size": not cfg.dynamic_img_size,
        "num_classes": cfg.num_classes,
        "first_conv": "patch_embed.proj",
        "classifier": ["head", "head_dist"] if cfg.head_dist else "head",
        "custom_load": False,
    }
    config = {
        "architecture": HUB_DISTILLED if cfg.head_dist else HUB_ARCHITECTURES[cfg.ln_eps],
        "num_classes": cfg.num_classes,
        "num_features": cfg.features_dim,
    }
    if POOL_TO_TIMM[cfg.pool]:
        config["global_pool"] = POOL_TO_TIMM[cfg.pool]
    config |= {"model_args": args, "pretrained_cfg": pcfg}
    return config | ({ASSUMED_KEY: sorted(assumed)} if assumed else {})


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
        },
    )


def timm_preprocess(preprocess: Preprocess, image_size: tuple[int, int]) -> tuple[Preprocess, list[str]]:
    """(``preprocess`` as timm's ``size / crop_pct`` rule, notes) at ``image_size`` (H, W): a
    transformers geometry (``Preprocess.resize_size``, read from a preprocessor_config.json) becomes the
    crop_pct of its crop over its resize, with a note, as timm rounds the crop offset where transformers
    floors it and its resize is ``floor(size / crop_pct)``.

    Raises:
        ValueError: a rescale_factor other than 1/255 (timm's ``ToTensor`` divides by 255), a crop larger
            than the resize, or one whose sides scale differently.
    """
    if abs(preprocess.rescale_factor * 255 - 1) > 1e-12:
        raise ValueError(f"rescale_factor={preprocess.rescale_factor!r}: timm's pretrained_cfg scales pixels by 1/255")
    if preprocess.resize_size is None:
        return preprocess, []
    resize = preprocess.resize_size
    crop = preprocess.crop_size or (resize if len(resize) == 2 else image_size)
    pcts = {c / r for c, r in zip(crop, resize * 2 if len(resize) == 1 else resize, strict=True)}
    if len(pcts) != 1 or max(pcts) > 1:
        raise ValueError(f"resize_size={list(resize)} with crop_size={list(crop)}: timm's crop_pct cannot give it")
    mode = "center" if len(resize) == 1 else "squash"
    timm = preprocess.replace(resize_size=None, crop_size=None, crop_pct=pcts.pop(), crop_mode=mode)
    return timm, [
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


def _hub_folder(path: Path) -> bool:
    """Whether writing ``path`` as timm makes a hub folder: a destination without a file suffix."""
    return Path(path).suffix not in (".safetensors", *TORCH_SUFFIXES)


@dataclass(frozen=True)
class TimmWriteOptions(WriteOptions):
    """How a timm file or hub folder is written: ``weights_from``, a .safetensors file already holding
    exactly the tensors to write (ours or timm's: a run's model.safetensors), whose bytes the file (a
    folder's model.safetensors) shares instead of a copy (``vit_common.system.io.share_file``)."""

    weights_from: str = field(
        default="",
        metadata={
            "flag": "--timm-weights-from",
            "help": "a .safetensors file holding exactly these tensors (e.g. a run's model.safetensors): the "
            "timm file or folder shares its bytes (a hard link, else a symbolic link) instead of a copy",
        },
    )


def _shared(weights_from: str, tensors: Mapping[str, np.ndarray], path: Path) -> tuple[dict | None, str]:
    """(``weights_from``'s metadata, "") if it holds exactly ``tensors`` and ``path`` can share its bytes;
    else (None, a note saying why the tensors are written instead: a .pth/.bin destination is a pickle,
    or the file holds other tensors, e.g. a sincos2d model's, which the timm file holds as a table).

    Raises:
        FormatError: ``weights_from`` is not a readable safetensors file.
    """
    if Path(path).suffix in TORCH_SUFFIXES:
        return None, f"a PyTorch pickle cannot share {weights_from}'s bytes: written"
    held, meta = read_safetensors(weights_from)
    bad = sorted(set(held) ^ set(tensors)) + [
        k
        for k in sorted(set(held) & set(tensors))
        if held[k].dtype != tensors[k].dtype
        or held[k].shape != tensors[k].shape
        or held[k].tobytes() != tensors[k].tobytes()
    ]
    if bad:
        return None, f"{weights_from} does not hold exactly these tensors ({', '.join(bad[:4])}): written, not shared"
    return meta, ""


class Timm(Format):
    name = "timm"
    description = "timm VisionTransformer state_dict (.safetensors, .pth, .bin) or hub folder (config.json)"
    suffixes = TORCH_SUFFIXES
    signature = "patch_embed.proj.weight"
    reference = Reference("timm", "state_dict")
    write_options = TimmWriteOptions
    assumed_preprocess = PRESETS["imagenet"]
    assumed_why = (
        "timm files store none; ImageNet mean/std, bicubic, crop 0.9 as DeiT and most timm weights (timm "
        "augreg and original-ViT ports use --mean 0.5 --std 0.5)"
    )

    def detect(self, src: Source) -> bool:
        return src.container in ("safetensors", "torch", "hf_folder") and is_timm(src.tensors)

    def read(self, src: Source, opts) -> Decoded:
        if src.container == "hf_folder" and is_hub_config(src.config):
            return read_hub(src, opts)
        if src.meta.get(META_TAG[0]) == META_TAG[1] and "vit_config" in src.meta:
            cfg, notes = config_from_json(src.meta["vit_config"], src.context)
            tensors, more = _normalise(src.tensors)
            dec = decode_stored(
                cfg,
                tensors,
                "timm state_dict, config in metadata",
                src.context,
                "config in the file's metadata",
                src.meta.get(ASSUMED_KEY),
            )
            dec.notes += notes + more
            return dec
        return infer(
            src.tensors, source_image_size=opts.source_image_size, overrides=opts.overrides, context=src.context
        )

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        return unsupported(
            "timm",
            {
                f"rep_size={cfg.rep_size} (timm's VisionTransformer has no pre-logits layer)": cfg.rep_size > 0,
                f"pool={cfg.pool!r} (timm's VisionTransformer has no [class token, mean] pooling)": (
                    cfg.pool not in POOL_TO_TIMM
                ),
                "head_bias=False (timm's head has a bias)": not cfg.head_bias,
                f"norm_pre={cfg.norm_pre} with patch_bias={cfg.patch_bias} (timm's pre_norm adds norm_pre and "
                "drops the patch-embedding bias together)": cfg.norm_pre == cfg.patch_bias,
                "dist_token without head_dist (timm's distilled ViT always reads both tokens)": (
                    cfg.dist_token and not cfg.head_dist
                ),
                f"dist_token with reg_tokens={cfg.reg_tokens}": cfg.dist_token and cfg.reg_tokens > 0,
            },
        )

    def declared(self, src: Source) -> Declared:
        """A hub folder's config.json ``pretrained_cfg`` and ``label_names``; a file's metadata otherwise."""
        if src.container != "hf_folder" or not is_hub_config(src.config):
            return super().declared(src)
        where = str(src.path / "config.json")
        hub = hub_config(src.config, where)
        pre = hub_preprocess(hub, where)
        classes = list(hub.label_names) if hub.label_names is not None else None
        return Declared(pre, f"{where} pretrained_cfg" if pre else "", classes, where if classes else "")

    def record_info(self, enc: Encoded, preprocess, classes) -> list[str]:
        """A hub folder: preprocessing into config.json's ``pretrained_cfg``, class names as its
        ``label_names``; a file: its safetensors metadata."""
        if enc.config_json is None and enc.shared is not None:
            lacks = sorted(k for k, v in info_metadata(preprocess, classes).items() if enc.meta.get(k) != v)
            return [f"{enc.shared.name}, whose bytes this file shares, does not record {lacks}"] if lacks else []
        if enc.config_json is None:
            return super().record_info(enc, preprocess, classes)
        notes: list[str] = []
        if preprocess is not None:
            preprocess, notes = timm_preprocess(preprocess, enc.cfg.image_size)
            enc.config_json["pretrained_cfg"] |= hub_pretrained_cfg(preprocess, enc.cfg.in_chans)
        if classes is not None and enc.cfg.num_classes:
            if len(classes) != enc.cfg.num_classes:
                raise ValueError(f"{len(classes)} class names for a model with {enc.cfg.num_classes} classes")
            enc.config_json["label_names"] = [str(c) for c in classes]
        return notes

    def writes_folder(self, path: Path) -> bool:
        """A destination without a file suffix is a hub folder; .safetensors, .pth, .pt, .bin a file."""
        return _hub_folder(path)

    def encode(self, cfg: ViTConfig, state, path: Path, options: TimmWriteOptions, assumed=()) -> Encoded:
        refuse("timm", self.cannot_hold(cfg))
        cfg, state, notes = materialize_posemb(cfg, state, prefix_rows=False)
        tensors = {k: np.ascontiguousarray(state[k]) for k in canonical_shapes(cfg)}
        meta = config = shared = None
        if Path(path).suffix not in TORCH_SUFFIXES:
            meta = {"format": "pt", META_TAG[0]: META_TAG[1], "vit_config": cfg.to_json()} | assumed_meta(assumed)
        if _hub_folder(path):
            config = hub_config_json(cfg, assumed)
        if options.weights_from:
            held, why = _shared(options.weights_from, tensors, path)
            notes += [why] if why else []
            if held is not None:
                shared = Path(options.weights_from)
                meta = held if config is None else meta  # a shared file is the shared one, header and all
        enc = Encoded(cfg, dict(state), tensors, config, meta, notes)
        enc.shared = shared
        return enc

    def decode(self, enc: Encoded) -> Decoded:
        if enc.meta:
            cfg, _ = config_from_json(enc.meta["vit_config"], "timm read-back")
            return decode_stored(
                cfg, enc.tensors, "", "timm read-back", "config in the file's metadata", enc.meta.get(ASSUMED_KEY)
            )
        return infer(enc.tensors, source_image_size=enc.cfg.image_size, context="timm read-back")

    def write(self, path: Path, enc: Encoded, writers) -> None:
        if enc.config_json is not None:

            def write_folder(tmp: Path) -> None:
                io.write_json(tmp / "config.json", io.folder_mark(enc.config_json, ["config.json", HUB_WEIGHTS]))
                if enc.shared is None:
                    io.save_safetensors(tmp / HUB_WEIGHTS, enc.tensors, enc.meta)
                else:
                    io.share_file(enc.shared, tmp / HUB_WEIGHTS, final=Path(path) / HUB_WEIGHTS)

            io.atomic_write_dir(path, write_folder)
        elif enc.shared is not None:
            io.share_file(enc.shared, path)
        elif enc.meta is None:
            writer(writers, "torch", path)(path, enc.tensors)
        else:
            io.save_safetensors(path, enc.tensors, enc.meta)

    def needs(self, path: Path) -> str | None:
        return "torch" if Path(path).suffix in TORCH_SUFFIXES else None

    def load_call(self, path: Path, cfg: ViTConfig) -> str:
        return hub_load_call(path) if _hub_folder(path) else timm_load_call(path, cfg)

    def export_name(self, source: Path | None = None) -> str:
        """``model_timm.safetensors``; ``model_timm.pth`` (.pt, .bin) after a PyTorch pickle source, the
        hub folder ``model_timm`` after a hub folder (or a hub id ``hf-hub:ORG/NAME``, which is one)."""
        if source is not None and (is_hub_id(str(source)) or Path(source).is_dir()):
            return "model_timm"
        suffix = Path(source).suffix if source is not None else ""
        return f"model_timm{suffix if suffix in TORCH_SUFFIXES else '.safetensors'}"


FORMAT = Timm()


def timm_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    """Keyword arguments of ``timm.models.vision_transformer.VisionTransformer`` (or, with head_dist,
    ``timm.models.deit.VisionTransformerDistilled``) for ``cfg``.

    ``act_layer`` is given by name ('gelu' exact, 'gelu_tanh', 'quick_gelu'); timm's default LayerNorm
    eps is 1e-6, so ``ln_eps`` is returned under the key ``'norm_eps'`` for the caller to turn into a
    ``norm_layer`` (a torch object, which vit_common cannot build). A gated MLP is returned as
    ``'mlp_layer': 'SwiGLUPacked'`` (``timm.layers.SwiGLUPacked``, for the caller to import) with
    ``act_layer='silu'`` and ``mlp_ratio`` = 2F / D, since timm's width is the packed fc1's, as
    ``vit_giant_patch14_dinov2``. Drop rates map one to one.

    Raises:
        ValueError: timm cannot build this config (names every reason).
    """
    refuse(
        "timm",
        FORMAT.cannot_hold(cfg)
        + unsupported(
            "timm",
            {
                "posemb='sincos2d' (timm's VisionTransformer has only learned position embeddings; "
                "convert the file, which writes the table as pos_embed)": cfg.posemb == "sincos2d",
            },
        ),
    )
    gated = cfg.mlp_type == "swiglu"
    hidden = 2 * cfg.mlp_dim if gated else cfg.mlp_dim
    ratio = hidden / cfg.width
    while int(cfg.width * ratio) < hidden:  # timm computes int(width * mlp_ratio)
        ratio = float(np.nextafter(ratio, np.inf))
    return dict(
        img_size=tuple(cfg.image_size),
        patch_size=tuple(cfg.patch_size),
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        global_pool=POOL_TO_TIMM[cfg.pool],
        pool_include_prefix=cfg.pool_include_prefix,
        embed_dim=cfg.width,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=ratio,
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        init_values=cfg.layer_scale,
        class_token=cfg.class_token,
        reg_tokens=cfg.reg_tokens,
        pos_embed="learn" if cfg.posemb == "learn" else "none",
        no_embed_class=not cfg.posemb_prefix,
        pre_norm=cfg.norm_pre,
        fc_norm=cfg.fc_norm,
        dynamic_img_size=cfg.dynamic_img_size,
        dynamic_img_pad=cfg.dynamic_img_pad,
        drop_rate=cfg.dropout,
        pos_drop_rate=cfg.dropout,
        proj_drop_rate=cfg.dropout,
        attn_drop_rate=cfg.attn_dropout,
        drop_path_rate=cfg.drop_path,
        act_layer="silu" if gated else GELU_TO_TIMM[cfg.gelu],
        norm_eps=cfg.ln_eps,
    ) | ({"mlp_layer": "SwiGLUPacked"} if gated else {})


# timm's registered names of the variants (timm/models/vision_transformer.py and deit.py): each entry
# point sets only patch_size, embed_dim, depth, num_heads (and mlp_ratio), which timm_load_call always
# spells out, so the name says what the model is and every other keyword overrides timm's defaults.
_TIMM_SIZES = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge", "g": "giant", "G": "gigantic"}
TIMM_NAMES = {
    **{(v, p, False): f"vit_{_TIMM_SIZES[v]}_patch{p}_224" for v, p in (("Ti", 16), ("S", 16), ("S", 32), ("S", 8))},
    **{(v, p, False): f"vit_{_TIMM_SIZES[v]}_patch{p}_224" for v, p in (("B", 16), ("B", 32), ("B", 8), ("L", 16))},
    **{(v, p, False): f"vit_{_TIMM_SIZES[v]}_patch{p}_224" for v, p in (("L", 32), ("H", 14), ("g", 14), ("G", 14))},
    **{(v, 16, True): f"deit_{_TIMM_SIZES[v]}_distilled_patch16_224" for v in ("Ti", "S", "B")},
}


def timm_model_name(cfg: ViTConfig) -> str | None:
    """timm's registered name of ``cfg``'s variant and patch (e.g. ``vit_small_patch16_224`` for S/16,
    ``deit_base_distilled_patch16_224`` for a distilled B/16), or None for a model timm has no name for
    (then its class, ``VisionTransformer`` or ``VisionTransformerDistilled``, builds it)."""
    p = cfg.patch_size[0] if cfg.patch_size[0] == cfg.patch_size[1] else None
    return TIMM_NAMES.get((cfg.variant, p, cfg.head_dist))


def timm_load_call(path: str | Path, cfg: ViTConfig) -> str:
    """Python code building the timm model for ``cfg`` (``timm.create_model`` of its registered name,
    ``timm_model_name``, else timm's class) and loading the file at ``path`` into it with
    ``strict=True``. Every keyword that differs from timm's defaults is spelled out (run-time choices
    such as dropout are left at timm's defaults).

    Raises:
        ValueError: timm cannot build this config.
    """
    kw = timm_kwargs(cfg.replace(dropout=0.0, attn_dropout=0.0, drop_path=0.0))
    eps = kw.pop("norm_eps")
    mlp_layer = kw.pop("mlp_layer", None)
    defaults = dict(
        in_chans=3,
        global_pool="token",
        pool_include_prefix=False,
        qkv_bias=True,
        qk_norm=False,
        init_values=None,
        class_token=True,
        reg_tokens=0,
        pos_embed="learn",
        no_embed_class=False,
        pre_norm=False,
        fc_norm=None,
        dynamic_img_size=False,
        dynamic_img_pad=False,
        drop_rate=0.0,
        pos_drop_rate=0.0,
        proj_drop_rate=0.0,
        attn_drop_rate=0.0,
        drop_path_rate=0.0,
    )
    args = [f"{k}={v!r}" for k, v in kw.items() if k not in defaults or defaults[k] != v]  # fc_norm always
    lines = ["import timm"]
    if eps != 1e-6:
        lines += ["from functools import partial", "from timm.layers import LayerNorm"]
        args.append(f"norm_layer=partial(LayerNorm, eps={eps!r})")
    if mlp_layer:
        lines.append(f"from timm.layers import {mlp_layer}")
        args.append(f"mlp_layer={mlp_layer}")
    if Path(path).suffix in TORCH_SUFFIXES:
        lines += ["import torch", f"state = torch.load({str(path)!r}, weights_only=True)"]
    else:
        lines += ["from safetensors.torch import load_file", f"state = load_file({str(path)!r})"]
    name = timm_model_name(cfg)
    if name is not None:
        lines.append(f"model = timm.create_model({name!r}, pretrained=False, {', '.join(args)})")
    else:
        module, cls = (
            ("deit", "VisionTransformerDistilled") if cfg.head_dist else ("vision_transformer", "VisionTransformer")
        )
        lines.append(f"from timm.models.{module} import {cls}")
        lines.append(f"model = {cls}({', '.join(args)})  # timm has no registered name for this size")
    lines.append("model.load_state_dict(state, strict=True)")
    return "\n".join(lines)
