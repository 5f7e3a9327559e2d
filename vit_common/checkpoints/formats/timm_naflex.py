"""timm ``NaFlexVit`` state dicts (``naflexvit_*``; ``timm/models/naflexvit.py``) <-> the canonical state,
by rules on the key names (numpy only), for the timm format (``vit_common.checkpoints.formats.timm``, which
holds its ``FORMAT``; this module has none).

A NaFlexVit keeps its embedding in ``embeds.*``; the blocks, norms, MAP head and head are timm
VisionTransformer's names. What is renamed:

- ``embeds.proj.weight``: a ``Linear`` [D, P*P*C] over patches flattened (P, P, C) (``embed_proj_type=
  'linear'``, timm's default; ``patchify_channels_last=True``) -> ``patch_embed.proj.weight`` [D, C, P, P]
  (the same map: ``PatchEmbed.embed_flat``), or a ``Conv2d`` [D, C, P, P] (``'conv'``) as it is;
  ``embeds.proj.bias`` -> ``patch_embed.proj.bias``;
- ``embeds.pos_embed`` [1, Gh, Gw, D] (patch rows only, never prefix rows) -> ``pos_embed`` [1, Gh*Gw, D]
  (``posemb_prefix=False``; the image size is the table's grid times the patch);
- ``embeds.cls_token``, ``embeds.reg_token`` -> ``cls_token``, ``reg_token``; ``embeds.norm.*``
  (``embed_norm_layer``) -> ``patch_embed.norm.*`` (``patch_norm``).

A NaFlexVit resizes its table to each input's patch grid (``dynamic_img_size``) with
``F.interpolate(mode=pos_embed_interp_mode, antialias=pos_embed_antialias, align_corners=
pos_embed_align_corners)``: ``posemb_resample`` (``RESAMPLE``). NaFlexVitCfg's default is bicubic with
antialias (``bicubic_aa``); its SigLIP models (``naflexvit_*_siglip``) declare bilinear (``bilinear_aa``);
its RADIO models (``naflexvit_*_radio_*``) resize bilinearly to a square of the longer side and crop
(``pos_embed_ar_preserving``, ``CROP``: ``bilinear_crop``; the C-RADIOv3 B and H entry points align
corners: ``bilinear_crop_corners``).
A bare state dict stores none of that: it is assumed and warned; a hub folder's architecture declares it.
What the twins lack is refused by name (``REFUSED_KEYS``: a factorized table, a norm before the
projection).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded
from vit_common.checkpoints.formats.provenance import Origin, assumed, derived
from vit_common.checkpoints.formats.rules import Piece, Rule, from_canonical, refuse, to_canonical, unsupported
from vit_common.checkpoints.formats.tensors import Tensor, TensorMap
from vit_common.checkpoints.formats.timm_state import (
    GELU_TO_TIMM,
    NAFLEX_KEYS,
    POOL_TO_TIMM,
    infer,
    mlp_ratio,
    normalise_keys,
)
from vit_common.config import ViTConfig
from vit_common.data.images import Preprocess

# timm's (pos_embed_interp_mode, pos_embed_antialias, pos_embed_align_corners) -> posemb_resample
RESAMPLE = {
    ("bicubic", True, False): "bicubic_aa",
    ("bicubic", False, False): "bicubic",
    ("bilinear", True, False): "bilinear_aa",
    ("bilinear", False, False): "bilinear",
    ("bilinear", False, True): "bilinear_corners",
}
# ... with pos_embed_ar_preserving (RADIO's: a square of the longer side, cropped) -> posemb_resample
CROP = {
    ("bilinear", False, False): "bilinear_crop",
    ("bilinear", False, True): "bilinear_crop_corners",
}
REFUSED_KEYS = {
    "embeds.pos_embed_y": "a factorized position table (pos_embed='factorized': embeds.pos_embed_y / _x)",
    "embeds.norm_input.weight": "a norm on the flattened patches before the projection (input_norm_layer)",
}
_RENAMED = {
    "embeds.proj.weight": "patch_embed.proj.weight",
    "embeds.proj.bias": "patch_embed.proj.bias",
    "embeds.cls_token": "cls_token",
    "embeds.reg_token": "reg_token",
    "embeds.norm.weight": "patch_embed.norm.weight",
    "embeds.norm.bias": "patch_embed.norm.bias",
}


def patch_side(patch_dim: int, in_chans: int) -> int:
    """The square patch side P of flattened patches of ``patch_dim`` = P*P*C values for C = ``in_chans``
    (a patch embedding [D, P*P*C] stores no P), or 0 where no integer P gives it."""
    if in_chans < 1 or patch_dim % in_chans:
        return 0
    side = math.isqrt(patch_dim // in_chans)
    return side if side * side * in_chans == patch_dim else 0


def is_naflex(keys) -> bool:
    """True if the key names are a timm NaFlexVit state dict (optionally ``module.``-prefixed)."""
    return any(k in NAFLEX_KEYS for k in keys)


def _pieces(shapes: Mapping[str, tuple[int, ...]], patch: tuple[int, int], in_chans: int) -> dict[str, Rule]:
    """NaFlexVit key -> the rule filling its canonical tensor, for the reshaped tensors (a Linear patch
    projection [D, P*P*C] and the 4-D position table [1, Gh, Gw, D]) among ``shapes``."""
    (ph, pw), c = patch, in_chans
    out = {}
    proj, table = shapes.get("embeds.proj.weight"), shapes.get("embeds.pos_embed")
    if proj is not None and len(proj) == 2:
        d = proj[0]
        out["embeds.proj.weight"] = Rule(
            "patch_embed.proj.weight", (Piece("embeds.proj.weight", proj, (d, ph, pw, c), (0, 3, 1, 2)),)
        )
    if table is not None and len(table) == 4:
        n = table[1] * table[2]
        out["embeds.pos_embed"] = Rule("pos_embed", (Piece("embeds.pos_embed", table, (1, n, table[3])),))
    return out


def naflex_state(tensors: TensorMap, patch: tuple[int, int], in_chans: int) -> dict[str, Tensor]:
    """A NaFlexVit state dict in canonical names and layouts (module docstring) for a patch (P, P) of C =
    ``in_chans`` channels; every other key as it is (lazy: nothing loads)."""
    rules = _pieces({k: tuple(np.shape(v)) for k, v in tensors.items()}, patch, in_chans)
    out: dict[str, Tensor] = {}
    for key, value in tensors.items():
        if key in rules:
            out |= to_canonical([rules[key]], {key: value})
        else:
            out[_RENAMED.get(key, key)] = value
    return out


def canonical_to_naflex(cfg: ViTConfig, state: TensorMap) -> dict[str, Tensor]:
    """The canonical state of ``cfg`` as a NaFlexVit state dict: a Linear patch projection [D, P*P*C]
    over (P, P, C) patches, the table [1, Gh, Gw, D], the renamed tensors of the module docstring."""
    (ph, pw), (gh, gw), d = cfg.patch_size, cfg.grid, cfg.width
    shapes = {"embeds.proj.weight": (d, ph * pw * cfg.in_chans), "embeds.pos_embed": (1, gh, gw, d)}
    rules = _pieces(shapes, cfg.patch_size, cfg.in_chans)
    back = {v: k for k, v in _RENAMED.items()} | {r.dst: k for k, r in rules.items()}
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        name = back.get(key, key)
        out |= from_canonical([rules[name]], {key: value}) if name in rules else {name: value}
    return out


def _dims(proj_shape: tuple[int, ...], overrides: Mapping[str, Any], context: str):
    """(patch (P, P), in_chans C, the two fields' origins) of the patch projection's shape."""
    origins: dict[str, Origin] = {}
    if len(proj_shape) == 4:
        _, c, ph, pw = proj_shape
        origins["patch_size"] = origins["in_chans"] = derived("embeds.proj.weight [D, C, P, P] (a Conv2d)")
        return (ph, pw), c, origins
    if len(proj_shape) != 2:
        raise FormatError(f"{context}: embeds.proj.weight has shape {proj_shape}; expected [D, P*P*C] or [D, C, P, P]")
    cols, c = proj_shape[1], overrides.get("in_chans", 3)
    side = patch_side(cols, c) if isinstance(c, int) else 0
    if side < 1:
        raise FormatError(
            f"{context}: embeds.proj.weight has {cols} columns, not P*P*C for square patches of C={c} "
            "channels; pass --set in_chans=C"
        )
    origins["in_chans"] = assumed("not stored; timm's default in_chans=3 (embeds.proj takes P*P*C columns)")
    origins["patch_size"] = derived(f"embeds.proj.weight [D, P*P*C = {cols}] with C={c}, square patches")
    return (side, side), c, origins


def infer_naflex(
    tensors: TensorMap,
    *,
    source_image_size: tuple[int, int] | None = None,
    overrides: Mapping[str, Any] = (),
    context: str = "timm file",
) -> Decoded:
    """``timm_state.infer`` for a NaFlexVit state dict that stores no config: its tensors in canonical
    names and what they give (``naflex_known``), the rest inferred and assumed as for any timm file.

    Raises:
        FormatError, StateMismatchError: as ``infer``; what the twins lack (``REFUSED_KEYS``).
    """
    t, notes = normalise_keys(tensors)
    state, known = naflex_known(t, dict(overrides), context)
    size = known["image_size"][0] if "image_size" in known else source_image_size
    dec = infer(state, source_image_size=size, overrides=overrides, context=context, known=known)
    dec.layout, dec.notes = "timm NaFlexVit state_dict", notes + dec.notes
    return dec


def naflex_known(tensors: TensorMap, overrides: Mapping[str, Any], context: str):
    """(the state dict in canonical names and layouts, the fields a NaFlexVit state dict gives with their
    origins) for ``timm_state.infer``: patch size and channels, the image size of the table's grid, a
    table without prefix rows, a dynamic image size, the resize (assumed: module docstring).

    Raises:
        FormatError: what the twins lack (``REFUSED_KEYS``, named), or a projection of another shape.
    """
    refuse("timm NaFlexVit", [f"{why} ({key})" for key, why in REFUSED_KEYS.items() if key in tensors])
    patch, c, origins = _dims(tuple(np.shape(tensors["embeds.proj.weight"])), overrides, context)
    fields: dict[str, tuple[Any, Origin]] = {
        "patch_size": (patch, origins["patch_size"]),
        "in_chans": (c, origins["in_chans"]),
        "dynamic_img_size": (True, derived("a NaFlexVit resizes its position table to each input's patch grid")),
        "posemb_resample": (
            "bicubic_aa",
            assumed(
                "not stored; NaFlexVitCfg's default bicubic with antialias (naflexvit_*_siglip declare bilinear: "
                "--set posemb_resample=bilinear_aa)"
            ),
        ),
    }
    table = tensors.get("embeds.pos_embed")
    if table is not None:
        if np.ndim(table) != 4 or np.shape(table)[0] != 1:
            raise FormatError(f"{context}: embeds.pos_embed has shape {tuple(np.shape(table))}; expected [1, H, W, D]")
        gh, gw = (int(n) for n in np.shape(table)[1:3])
        where = derived(f"embeds.pos_embed [1, {gh}, {gw}, D] x the patch")
        fields["image_size"] = ((gh * patch[0], gw * patch[1]), where)
        fields["posemb_prefix"] = (False, derived("a NaFlexVit position table has patch rows only"))
    return naflex_state(tensors, patch, c), fields


# timm validate.py's --naflex-max-seq-len default: the patch budget of timm's NaFlex evaluation
TIMM_NAFLEX_SEQ_LEN = 576


def naflex_hub_preprocess(pretrained_cfg: Mapping[str, Any], tensors, preprocess: Preprocess) -> tuple[Preprocess, str]:
    """(``preprocess``, a NaFlexVit hub folder's ``pretrained_cfg`` as ``timm_hub.hub_preprocess`` reads
    it, made timm's NaFlex evaluation; where its budget comes from): each image keeps its aspect ratio,
    resized with ``pretrained_cfg``'s filter to at most ``max_patches`` patches (timm ``ResizeToSequence``,
    the bisection of ``vit_common.naflex.size_for_max_patches``), mean and std as declared. The budget is
    ``pretrained_cfg`` ``input_size`` in the model's patches (the area timm's fixed-size pipeline feeds it:
    384x384 in 16-pixel patches is 576, validate.py's ``--naflex-max-seq-len`` default), else that default
    (``TIMM_NAFLEX_SEQ_LEN``). The patch side is the projection's: a Conv2d's, or a Linear's P*P*C columns
    with C = ``input_size``'s channels (else 3)."""
    size = pretrained_cfg.get("input_size")
    ok = isinstance(size, list) and len(size) == 3 and all(isinstance(n, int) and n > 0 for n in size)
    proj = next((np.shape(v) for k, v in tensors.items() if k.endswith("embeds.proj.weight")), ())
    patch = proj[-1] if len(proj) == 4 else patch_side(proj[1], size[0] if ok else 3) if len(proj) == 2 else 0
    if ok and patch and size[1] >= patch and size[2] >= patch:
        n = (size[1] // patch) * (size[2] // patch)
        how = f"input_size {size[1]}x{size[2]} in {patch}-pixel patches"
    else:
        n, how = TIMM_NAFLEX_SEQ_LEN, "no input_size in patches: timm validate.py's --naflex-max-seq-len default"
    pre = Preprocess(preprocess.mean, preprocess.std, preprocess.interpolation, max_patches=n)
    return pre, f" (mean, std, interpolation); max_patches={n}, its {how}: timm's NaFlex evaluation (ResizeToSequence)"


def check_naflex_grid(model_args: Mapping[str, Any], arch: str, tensors, grid: tuple[int, int], where: str) -> None:
    """Refuse a NaFlexVit hub folder (config.json ``model_args``, ``architecture`` ``arch``) whose built
    position table's ``grid`` (Gh, Gw) is not the grid of the tensors' ``embeds.pos_embed`` [1, Gh, Gw, D]:
    the same count of cells in another shape would read the table wrongly, silently.

    Raises:
        FormatError: one line naming config.json's ``pos_embed_grid_size`` (or the architecture's), the
            built grid and the stored one.
    """
    table = np.shape(tensors.get("embeds.pos_embed", np.zeros((0,))))
    if len(table) != 4 or tuple(table[1:3]) == tuple(grid):
        return
    given = model_args.get("pos_embed_grid_size")
    what = f"model_args pos_embed_grid_size={given!r}" if given is not None else f"{arch}'s default table"
    raise FormatError(
        f"{where}: {what} builds a {grid[0]}x{grid[1]} position table, but embeds.pos_embed holds "
        f"{table[1]}x{table[2]}: expected pos_embed_grid_size [{table[1]}, {table[2]}]"
    )


# timm 1.0.31's NaFlexVit entry points that the written model_args define whole; the others keep an
# aspect-preserving (``_par``, ``_radio``) or factorized (``_parfac``) table the keywords do not turn off.
NAFLEX_NAMES = (
    "naflexvit_base_patch16_gap",
    "naflexvit_base_patch16_map",
    "naflexvit_base_patch16_siglip",
    "naflexvit_so150m2_patch16_reg1_gap",
    "naflexvit_so150m2_patch16_reg1_map",
    "naflexvit_so400m_patch16_siglip",
)


def is_naflex_name(name: str) -> bool:
    """Whether a timm architecture name is a NaFlexVit entry point (``naflexvit_*``)."""
    return name.startswith("naflexvit_")


def naflex_name(cfg: ViTConfig, preferred: str = "") -> str:
    """The NaFlexVit entry point a write names: ``preferred`` (given, or the source's), else
    ``naflexvit_base_patch16_siglip`` for a SigLIP-like model (MAP head, no class token, tanh GELU), else
    ``naflexvit_base_patch16_gap``. ``naflex_kwargs`` spells out every keyword, so the name changes
    nothing timm builds.

    Raises:
        ValueError: ``preferred`` is not one of ``NAFLEX_NAMES`` (an unknown name, which timm cannot build,
            or an entry point whose table the written keywords would not define).
    """
    if preferred and preferred not in NAFLEX_NAMES:
        raise ValueError(
            f"--timm-architecture {preferred!r}: a NaFlexVit export names one of {', '.join(NAFLEX_NAMES)}"
        )
    siglip = cfg.pool == "map" and not cfg.class_token and cfg.gelu == "tanh"
    return preferred or ("naflexvit_base_patch16_siglip" if siglip else "naflexvit_base_patch16_gap")


def naflex_cannot_hold(cfg: ViTConfig, hub: bool = False) -> list[str]:
    """What ``cfg`` has that timm's NaFlexVit cannot hold beyond timm's VisionTransformer (one reason
    each; ``hub``: also what a hub folder's JSON ``model_args`` cannot give, the norms' eps)."""
    return unsupported(
        "timm NaFlexVit",
        {
            "posemb_prefix=True with prefix tokens (a NaFlexVit table has patch rows only)": (
                cfg.posemb == "learn" and cfg.posemb_prefix and cfg.num_prefix_tokens > 0
            ),
            "dist_token (a NaFlexVit has no distillation token)": cfg.dist_token,
            "mlp_type='swiglu' (NaFlexVit's SwiGLU splits fc1; not written)": cfg.mlp_type == "swiglu",
            f"ln_eps={cfg.ln_eps!r} (model_args name the norm by a string, which builds eps 1e-6; a timm "
            ".safetensors file can hold it)": hub and cfg.ln_eps != 1e-6,
        },
    )


def resize_differs(cfg: ViTConfig) -> str:
    """Why timm's ``VisionTransformer`` (or ``Eva``) of ``cfg`` would compute another function at other
    sizes: their ``dynamic_img_size`` resize is ``resample_abs_pos_embed``'s default, bicubic with antialias
    (``bicubic_aa``); '' where ``cfg`` resizes so, or keeps its size, or has no learned table."""
    if cfg.dynamic_img_size and cfg.posemb == "learn" and cfg.posemb_resample != "bicubic_aa":
        return (
            f"posemb_resample={cfg.posemb_resample!r} (timm's VisionTransformer and Eva resize the position "
            "table bicubically with antialias)"
        )
    return ""


def naflex_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    """``timm.create_model`` keywords (NaFlexVitCfg fields, JSON values) building a NaFlexVit of ``cfg``:
    a Linear patch projection, the table's grid and resize (``RESAMPLE``), every choice spelled out.
    The norm is named by timm's string (``layernorm`` / ``rmsnorm``, eps 1e-6); a caller giving another
    eps replaces ``norm_layer``. Dropout is left at timm's defaults."""
    crop = cfg.posemb_resample in CROP.values()
    mode, antialias, corners = {v: k for k, v in (CROP if crop else RESAMPLE).items()}[cfg.posemb_resample]
    norm = "rmsnorm" if cfg.norm == "rmsnorm" else "layernorm"
    args = dict(
        img_size=list(cfg.image_size),
        patch_size=list(cfg.patch_size),
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        embed_dim=cfg.width,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=mlp_ratio(cfg.width, cfg.mlp_dim),
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        proj_bias=cfg.proj_bias,
        init_values=cfg.layer_scale,
        class_token=cfg.class_token,
        reg_tokens=cfg.reg_tokens,
        pos_embed="learned" if cfg.posemb == "learn" else "none",
        pos_embed_grid_size=list(cfg.grid),
        pos_embed_interp_mode=mode,
        pos_embed_antialias=antialias,
        pos_embed_align_corners=corners,
        pre_norm=cfg.norm_pre,
        final_norm=cfg.final_norm,
        fc_norm=cfg.fc_norm,
        global_pool=POOL_TO_TIMM[cfg.pool],
        pool_include_prefix=cfg.pool_include_prefix,
        act_layer=GELU_TO_TIMM[cfg.gelu],
        embed_proj_type="linear",
        norm_layer=norm,
        embed_norm_layer=norm if cfg.patch_norm else None,
    )
    if crop:
        args["pos_embed_ar_preserving"] = True
    if cfg.pool == "map":
        args["attn_pool_num_heads"] = cfg.map_num_heads
        args["attn_pool_mlp_ratio"] = mlp_ratio(cfg.width, cfg.map_mlp_width)
    return args


def naflex_load_call(path: str, cfg: ViTConfig, name: str) -> str:
    """Python code building timm's NaFlexVit ``name`` for ``cfg`` (every keyword of ``naflex_kwargs``,
    the norm with ``cfg``'s eps) and loading the file at ``path`` into it with ``strict=True``; a .pth,
    .pt or .bin through ``torch.load(weights_only=True)``."""
    kw = naflex_kwargs(cfg)
    cls = "RmsNorm" if cfg.norm == "rmsnorm" else "LayerNorm"
    kw["norm_layer"] = f"partial({cls}, eps={cfg.ln_eps!r})"
    if kw["embed_norm_layer"] is not None:
        kw["embed_norm_layer"] = kw["norm_layer"]
    norms = ("norm_layer", "embed_norm_layer")
    args = ", ".join(
        f"{k}={v if k in norms and v is not None else tuple(v) if isinstance(v, list) else repr(v)}"
        for k, v in kw.items()
    )
    load = (
        ["import torch", f"state = torch.load({path!r}, weights_only=True)"]
        if path.endswith((".pth", ".pt", ".bin"))
        else ["from safetensors.torch import load_file", f"state = load_file({path!r})"]
    )
    return "\n".join(
        ["import timm", "from functools import partial", f"from timm.layers import {cls}", *load]
        + [
            f"model = timm.create_model({name!r}, pretrained=False, {args})",
            "model.load_state_dict(state, strict=True)",
        ]
    )


def source_name(layout: str, cfg: ViTConfig | None) -> str:
    """The ``naflexvit_*`` name a NaFlexVit source's report layout line gives (a hub folder's
    architecture), ``naflex_name(cfg)`` for a NaFlexVit state dict, '' for any other source."""
    m = re.search(r"architecture (naflexvit_\w+)", layout)
    if m:
        return m[1]
    return naflex_name(cfg) if "NaFlexVit" in layout and cfg is not None else ""
