"""timm ``VisionTransformer`` state_dicts <-> the canonical state (which uses timm's names already).

Reading accepts DDP's ``module.`` prefix and DeiT III's LayerScale spelling (``blocks.i.gamma_1`` /
``gamma_2``, timm ``checkpoint_filter_fn(adapt_layer_scale=True)``). A timm file stores no config, so it
is inferred from tensor shapes (patch size, width, depth, MLP width, class/register tokens, pos_embed
rows and grid, LayerScale, qk_norm, fc_norm, MAP head, head) plus timm's defaults for what shapes cannot
tell: exact GELU, LayerNorm eps 1e-6, num_heads from the variant table (override when it differs).

``timm_kwargs(cfg)`` is the one mapping from a ViTConfig to ``timm.models.VisionTransformer`` keyword
arguments (also used by the benchmarks).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from vit_common.config import ViTConfig
from vit_common.formats.base import (
    Decoded,
    FormatError,
    build_config,
    common_float_dtype,
    copy,
    guess_num_heads,
    materialize_posemb,
    posemb_layout,
    positive_dims,
    shape_fields,
    to_canonical,
    unsupported,
)
from vit_common.state import canonical_shapes

_DEIT3_GAMMA = re.compile(r"^(blocks\.\d+)\.gamma_([12])$")
_POOL = {"token": "token", "gap": "avg", "map": "map", "none": ""}


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


def read(
    tensors: Mapping[str, np.ndarray],
    *,
    source_image_size: tuple[int, int] | None = None,
    overrides: Mapping[str, Any] = (),
    context: str = "timm file",
) -> Decoded:
    """Canonical state and inferred config of a timm state_dict (numpy arrays).

    Args:
        source_image_size: (H, W) the file was trained at, when known; otherwise its grid must be square.
        overrides: ViTConfig fields that replace inferred values (num_heads, pool, gelu, ln_eps...).

    Raises:
        FormatError: the shapes do not describe a ViT or the inferred config is invalid.
        StateMismatchError: tensors missing, unexpected or of the wrong shape for the inferred config.
    """
    t, notes = _normalise(tensors)
    overrides = dict(overrides)
    if "patch_embed.proj.weight" not in t or np.ndim(t["patch_embed.proj.weight"]) != 4:
        raise FormatError(f"{context}: no 4-D patch_embed.proj.weight, so not a timm VisionTransformer")
    d, c, ph, pw = positive_dims(np.shape(t["patch_embed.proj.weight"]), "patch_embed.proj.weight", context)
    grid = (source_image_size[0] // ph, source_image_size[1] // pw) if source_image_size else None
    depth = 0
    while f"blocks.{depth}.norm1.weight" in t:
        depth += 1
    if depth == 0 or "blocks.0.mlp.fc1.weight" not in t:
        raise FormatError(f"{context}: no blocks.0.norm1.weight / blocks.0.mlp.fc1.weight")
    f, inferred = shape_fields(
        patch_size=(ph, pw), in_chans=c, width=d, depth=depth, mlp_dim=np.shape(t["blocks.0.mlp.fc1.weight"])[0]
    )
    f["qkv_bias"] = "blocks.0.attn.qkv.bias" in t
    f["qk_norm"] = "blocks.0.attn.q_norm.weight" in t
    f["class_token"] = "cls_token" in t
    f["reg_tokens"] = np.shape(t["reg_token"])[1] if "reg_token" in t and np.ndim(t["reg_token"]) == 3 else 0
    if f["qk_norm"]:
        f["num_heads"] = d // max(1, np.shape(t["blocks.0.attn.q_norm.weight"])[0])
        inferred["num_heads"] = "width / q_norm size"
    elif "num_heads" not in overrides:
        f["num_heads"], inferred["num_heads"] = guess_num_heads(d)
    if "blocks.0.ls1.gamma" in t:
        f["layer_scale"] = 1e-5
        inferred["layer_scale"] = "LayerScale present (the init value is not stored; 1e-5 recorded)"
    f["fc_norm"] = "fc_norm.weight" in t and "norm.weight" not in t
    f["pool"] = "map" if "attn_pool.latent" in t else "gap" if f["fc_norm"] or not f["class_token"] else "token"
    inferred["pool"] = "guess from tensors (attn_pool -> map, fc_norm or no class token -> gap)"
    f["rep_size"] = np.shape(t["pre_logits.fc.weight"])[0] if "pre_logits.fc.weight" in t else 0
    f["num_classes"] = np.shape(t["head.weight"])[0] if "head.weight" in t else 0
    inferred["num_classes"] = "head shape"
    num_prefix = int(f["class_token"]) + f["reg_tokens"]
    if "pos_embed" in t and np.ndim(t["pos_embed"]) == 3:
        (gh, gw), f["posemb_prefix"] = posemb_layout(
            np.shape(t["pos_embed"])[1], num_prefix, grid, f"{context}: pos_embed"
        )
        inferred["posemb_prefix"] = "pos_embed rows (timm no_embed_class when False)"
        f["image_size"] = (gh * ph, gw * pw)
        inferred["image_size"] = "pos_embed rows x patch size" + (" (given size)" if grid else " (square)")
    else:
        f["posemb"] = "none"
        gh, gw = grid or (224 // ph, 224 // pw)
        f["image_size"] = (gh * ph, gw * pw)
        inferred["image_size"] = "not stored (no pos_embed); " + ("given" if grid else "224 assumed")
    inferred["gelu"] = "format default: timm uses exact GELU"
    inferred["ln_eps"] = "format default: timm LayerNorm eps 1e-6"
    f["gelu"], f["ln_eps"] = "exact", 1e-6
    dt = common_float_dtype(t)
    if dt in ("float32", "float64", "bfloat16", "float16"):
        f["param_dtype"] = dt
    cfg = build_config(f, inferred, overrides, context)
    rules = [copy(k, k, s) for k, s in canonical_shapes(cfg).items()]
    return Decoded(cfg, to_canonical(rules, t, context), "timm state_dict", inferred, [], notes)


def prepare(cfg: ViTConfig, state: Mapping[str, np.ndarray]) -> tuple[ViTConfig, dict[str, np.ndarray], list[str]]:
    """Config and tensors as a timm file holds them (raises ValueError for what timm cannot hold)."""
    unsupported(
        "timm",
        cfg,
        {
            f"rep_size={cfg.rep_size} (timm's VisionTransformer has no pre-logits layer)": cfg.rep_size > 0,
        },
    )
    cfg, state, notes = materialize_posemb(cfg, state, prefix_rows=False)
    return cfg, dict(state), notes


def write(cfg: ViTConfig, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The timm state_dict (canonical names, contiguous) of an already ``prepare``d state."""
    return {k: np.ascontiguousarray(state[k]) for k in canonical_shapes(cfg)}


def timm_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    """Keyword arguments of ``timm.models.vision_transformer.VisionTransformer`` for ``cfg``.

    ``act_layer`` is given by name ('gelu' exact, 'gelu_tanh'); timm's default LayerNorm eps is 1e-6,
    so ``ln_eps`` is returned under the key ``'norm_eps'`` for the caller to turn into a
    ``norm_layer`` (a torch object, which vit_common cannot build). Drop rates map one to one.

    Raises:
        ValueError: timm cannot build this config (pre-logits layer, sincos2d position embedding).
    """
    unsupported(
        "timm",
        cfg,
        {
            f"rep_size={cfg.rep_size} (no pre-logits layer in timm)": cfg.rep_size > 0,
            "posemb='sincos2d' (timm's VisionTransformer has only learned position embeddings; "
            "convert the file, which writes the table as pos_embed)": cfg.posemb == "sincos2d",
        },
    )
    ratio = cfg.mlp_dim / cfg.width
    while int(cfg.width * ratio) < cfg.mlp_dim:  # timm computes int(width * mlp_ratio)
        ratio = float(np.nextafter(ratio, np.inf))
    return dict(
        img_size=tuple(cfg.image_size),
        patch_size=tuple(cfg.patch_size),
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        global_pool=_POOL[cfg.pool],
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
        fc_norm=cfg.fc_norm,
        dynamic_img_size=cfg.dynamic_img_size,
        dynamic_img_pad=cfg.dynamic_img_pad,
        drop_rate=cfg.dropout,
        pos_drop_rate=cfg.dropout,
        proj_drop_rate=cfg.dropout,
        attn_drop_rate=cfg.attn_dropout,
        drop_path_rate=cfg.drop_path,
        act_layer="gelu_tanh" if cfg.gelu == "tanh" else "gelu",
        norm_eps=cfg.ln_eps,
    )
