"""timm ``VisionTransformer`` state_dicts and timm's model for a config, for the timm format
(``vit_common.checkpoints.formats.timm``, which holds its ``FORMAT``; this module has none).

Reading a state_dict that stores no config (``infer``) accepts DDP's ``module.`` prefix and DeiT III's
LayerScale spelling (``blocks.i.gamma_1`` / ``gamma_2``, timm ``checkpoint_filter_fn(
adapt_layer_scale=True)``; ``normalise_keys``). Tensor shapes and presence derive patch size, width,
depth, MLP width, qkv bias, qk_norm (and with it the head count), class / distillation / register
tokens, the position table and whether it has prefix rows, LayerScale, norm_pre and the patch bias
(CLIP-style ``pre_norm``), fc_norm, the MAP head and the heads. What shapes cannot tell is assumed and
warned: the head count (without qk_norm), the pooling of files without a MAP head or distillation token
(token, avg, max, avgmax or none), ``pool_include_prefix``, a square grid (the image size), GELU (timm's
default exact) and LayerNorm eps (timm's 1e-6).

``timm_kwargs(cfg)`` is the one mapping from a ViTConfig to timm's keyword arguments (the benchmarks,
the oracles, ``load_call`` and the hub folders' ``model_args`` use it); ``timm_cannot_hold(cfg)`` what
timm's model cannot hold.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded
from vit_common.checkpoints.formats.provenance import (
    Origin,
    assumed,
    build_config,
    common_float_dtype,
    derived,
    guess_num_heads,
    posemb_layout,
    positive_dims,
    refuse_unsupported,
    shape_fields,
    square_grid_origin,
)
from vit_common.checkpoints.formats.rules import Piece, Rule, copy, refuse, to_canonical, unsupported
from vit_common.checkpoints.formats.source import TORCH_SUFFIXES
from vit_common.config import ViTConfig
from vit_common.state import canonical_shapes

_DEIT3_GAMMA = re.compile(r"^(blocks\.\d+)\.gamma_([12])$")
POOL_TO_TIMM = {"token": "token", "gap": "avg", "max": "max", "avgmax": "avgmax", "map": "map", "none": ""}
GELU_TO_TIMM = {"exact": "gelu", "tanh": "gelu_tanh", "quick": "quick_gelu"}
# the pools timm's VisionTransformer lacks, as the refusal names them
_NO_TIMM_POOL = {
    "token_gap": "[class token, mean] pooling",
    "probe": "attention probe without a query projection",
}


# timm NaFlexVit's (``naflexvit_*``) patch embedding (``timm_naflex`` reads it)
NAFLEX_KEYS = ("embeds.proj.weight", "module.embeds.proj.weight")


def is_timm(keys) -> bool:
    """True if the key names are a timm VisionTransformer or NaFlexVit state_dict (optionally
    ``module.``-prefixed)."""
    return any(k in ("patch_embed.proj.weight", "module.patch_embed.proj.weight", *NAFLEX_KEYS) for k in keys)


def normalise_keys(tensors: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[str]]:
    """(``tensors`` with DDP's ``module.`` prefix stripped and DeiT III's ``gamma_1`` / ``gamma_2`` read as
    ``ls1.gamma`` / ``ls2.gamma``, a note on each)."""
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


_ROPE_SIGNATURE = (
    "a timm RoPE model (DINOv3, RoPE-ViT, SBB vit_*_rope_reg*, Perception Encoder: no pos_embed with Eva's "
    "gamma_1 names or register tokens, or norm_pre with a MAP head) read from a bare state_dict, which holds "
    "none of its rotary settings; load its timm hub folder (config.json + model.safetensors) or its timm "
    "model name, or --set posemb=none for a ViT without position information"
)


def _rope_signature(tensors: Mapping[str, np.ndarray]) -> bool:
    """Whether a state_dict without a header config looks like a timm Eva RoPE model (which the timm
    format would otherwise read without its rotary embeddings): no ``pos_embed`` with Eva's LayerScale
    spelling or register tokens (DINOv3, RoPE-ViT, SBB), or ``norm_pre`` with a MAP head (PE core)."""
    keys = {k.removeprefix("module.") for k in tensors}
    eva = any(_DEIT3_GAMMA.match(k) for k in keys) or "reg_token" in keys
    no_position = "pos_embed" not in keys and "blocks.0.norm1.weight" in keys and eva
    return no_position or ("norm_pre.weight" in keys and "attn_pool.latent" in keys)


def infer(
    tensors: Mapping[str, np.ndarray],
    *,
    source_image_size: tuple[int, int] | None = None,
    overrides: Mapping[str, Any] = (),
    context: str = "timm file",
    known: Mapping[str, tuple[Any, Origin]] = (),
) -> Decoded:
    """Canonical state, config and provenance of a timm state_dict (numpy arrays) that stores no config.

    Args:
        source_image_size: (H, W) the file was trained at, when known; otherwise its grid must be square.
        overrides: ViTConfig fields that replace inferred values (num_heads, pool, gelu, ln_eps...).
        known: fields the caller established, with their origins (a NaFlexVit's: ``timm_naflex``); the
            overrides still replace them.

    Raises:
        FormatError: the shapes do not describe a ViT the twins implement (what is missing is named),
            or the inferred config is invalid.
        StateMismatchError: tensors missing, unexpected or of the wrong shape for the inferred config.
    """
    t, notes = normalise_keys(tensors)
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
            _ROPE_SIGNATURE: "posemb" not in overrides and _rope_signature(tensors),
        },
    )
    if "pos_embed" in t and any(_DEIT3_GAMMA.match(k) for k in tensors) and "reg_token" not in t:
        notes.append(
            "gamma_1/gamma_2 with a pos_embed: read as DeiT III; timm's RoPE-ViT vit_*_rope_ape_224 has the same "
            "tensors and rotary embeddings besides: if it is one, load its timm hub folder or model name"
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
        "patch_norm": "patch_embed.norm.weight" in t,
        "proj_bias": "blocks.0.attn.proj.bias" in t,
        "mlp_bias": "blocks.0.mlp.fc2.bias" in t,
    }
    flags["final_norm"] = "norm.weight" in t or "fc_norm.weight" in t  # timm final_norm=False: RADIO's
    f.update(flags)
    prov.update({k: derived("tensors present") for k in flags})
    prov["head_dist"] = derived("dist_token: timm's distilled ViT always has the distilled head")
    f["reg_tokens"] = np.shape(t["reg_token"])[1] if "reg_token" in t and np.ndim(t["reg_token"]) == 3 else 0
    prov["reg_tokens"] = derived("reg_token shape")
    if f["qk_norm"]:
        f["num_heads"] = d // max(1, np.shape(t["blocks.0.attn.q_norm.weight"])[0])
        prov["num_heads"] = derived("width / q_norm size")
    elif "num_heads" not in overrides and "num_heads" not in dict(
        known
    ):  # given: no guess, and no refusal where no rule guesses one
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
    rms = "blocks.0.norm1.bias" not in t
    f["norm"] = "rmsnorm" if rms else "layernorm"
    prov["norm"] = derived("blocks.0.norm1.bias " + ("absent: RmsNorm" if rms else "present: LayerNorm"))
    eps_why = "RmsNorm eps 1e-6 (its aimv2_* models use 1e-5)" if rms else "LayerNorm eps 1e-6"
    f["ln_eps"], prov["ln_eps"] = 1e-6, assumed(f"not stored; timm's default {eps_why}")
    dt = common_float_dtype(t)
    if dt in ("float32", "float64", "bfloat16", "float16"):
        f["param_dtype"] = dt
    for name, (value, origin) in dict(known).items():
        f[name], prov[name] = value, origin
    cfg = build_config(f, prov, overrides, context, t)
    rules = timm_rules(cfg, split_gate)
    layout = "timm VisionTransformerDistilled state_dict" if cfg.dist_token else "timm state_dict"
    return Decoded(cfg, to_canonical(rules, t, context), layout, prov, [], notes)


def timm_cannot_hold(cfg: ViTConfig) -> list[str]:
    """What ``cfg`` has that timm's ``VisionTransformer`` (or ``VisionTransformerDistilled``) cannot hold,
    one reason each (``Timm.cannot_hold``; ``timm_kwargs`` refuses it)."""
    return unsupported(
        "timm",
        {
            f"rep_size={cfg.rep_size} (timm's VisionTransformer has no pre-logits layer)": cfg.rep_size > 0,
            f"pool={cfg.pool!r} (timm's VisionTransformer has no {_NO_TIMM_POOL.get(cfg.pool)})": (
                cfg.pool not in POOL_TO_TIMM
            ),
            "head_bias=False (timm's head has a bias)": not cfg.head_bias,
            f"norm_pre={cfg.norm_pre} with patch_bias={cfg.patch_bias} (timm's pre_norm adds norm_pre and "
            "drops the patch-embedding bias together)": cfg.norm_pre == cfg.patch_bias,
            "dist_token without head_dist (timm's distilled ViT always reads both tokens)": (
                cfg.dist_token and not cfg.head_dist
            ),
            f"dist_token with reg_tokens={cfg.reg_tokens}": cfg.dist_token and cfg.reg_tokens > 0,
            f"proj_bias={cfg.proj_bias} with mlp_bias={cfg.mlp_bias} (timm's one proj_bias sets both)": (
                cfg.proj_bias != cfg.mlp_bias
            ),
        },
    )


def mlp_ratio(width: int, hidden: int) -> float:
    """The smallest ``mlp_ratio`` from which timm builds an MLP ``hidden`` wide (timm computes
    ``int(width * mlp_ratio)``)."""
    ratio = hidden / width
    while int(width * ratio) < hidden:
        ratio = float(np.nextafter(ratio, np.inf))
    return ratio


def timm_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    """Keyword arguments of ``timm.models.vision_transformer.VisionTransformer`` (or, with head_dist,
    ``timm.models.deit.VisionTransformerDistilled``) for ``cfg``.

    ``act_layer`` is given by name ('gelu' exact, 'gelu_tanh', 'quick_gelu'); the norm is returned as
    ``'norm_class'`` (``'LayerNorm'`` or ``'RmsNorm'``, classes of ``timm.layers``) and ``'norm_eps'``
    (timm's defaults are 1e-6) for the caller to turn into a ``norm_layer`` (a torch object, which
    vit_common cannot build), and, with patch_norm, ``'embed_norm': True`` for the same class as
    ``embed_norm_layer``; timm's ``proj_bias`` is cfg.proj_bias (= cfg.mlp_bias). A gated MLP is returned as
    ``'mlp_layer': 'SwiGLUPacked'`` (``timm.layers.SwiGLUPacked``, for the caller to import) with
    ``act_layer='silu'`` and ``mlp_ratio`` = 2F / D, since timm's width is the packed fc1's, as
    ``vit_giant_patch14_dinov2``; ``final_norm=False`` only for a model without a final norm (timm's
    ``vit_*_radio_*``). Drop rates map one to one.

    Raises:
        ValueError: timm cannot build this config (names every reason).
    """
    refuse(
        "timm",
        timm_cannot_hold(cfg)
        + unsupported(
            "timm",
            {
                f"posemb={cfg.posemb!r} (timm's VisionTransformer has only learned position embeddings; "
                "convert the file, which writes the table as pos_embed)": cfg.posemb in ("sincos2d", "sincos2d_mae"),
            },
        ),
    )
    gated = cfg.mlp_type == "swiglu"
    ratio = mlp_ratio(cfg.width, 2 * cfg.mlp_dim if gated else cfg.mlp_dim)
    extra = ({"mlp_layer": "SwiGLUPacked"} if gated else {}) | ({"embed_norm": True} if cfg.patch_norm else {})
    extra |= {} if cfg.final_norm else {"final_norm": False}
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
        proj_bias=cfg.proj_bias,
        norm_class="RmsNorm" if cfg.norm == "rmsnorm" else "LayerNorm",
        norm_eps=cfg.ln_eps,
        **extra,
    )


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
    eps, norm_class, embed_norm = kw.pop("norm_eps"), kw.pop("norm_class"), kw.pop("embed_norm", False)
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
        proj_bias=True,
    )
    args = [f"{k}={v!r}" for k, v in kw.items() if k not in defaults or defaults[k] != v]  # fc_norm always
    lines = ["import timm"]
    if eps != 1e-6 or norm_class != "LayerNorm" or embed_norm:
        lines += ["from functools import partial", f"from timm.layers import {norm_class}"]
        args.append(f"norm_layer=partial({norm_class}, eps={eps!r})")
        if embed_norm:
            args.append(f"embed_norm_layer=partial({norm_class}, eps={eps!r})")
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
