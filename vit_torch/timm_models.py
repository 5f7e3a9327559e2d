"""A timm model name as a source: ``timm.create_model(name, pretrained=...)`` through timm's own loader,
its config read off the built model (declared: the model object states every choice), checked by running
it beside the torch twin.

``from_timm(name)`` gives the torch twin. ``vit_jax.from_timm`` runs ``python -m vit_torch.timm_models
NAME OUT`` in a child process (``vit_jax.torch_bridge``: timm needs torch, which vit_jax never imports) and
loads the timm ``.safetensors`` written there, whose header carries the config. timm and its weights are
optional: ``pretrained=True`` downloads through timm (Hugging Face hub), ``pretrained=False`` builds random
weights.

``timm_model_config(name)`` is the config alone, the model built on the meta device (nothing allocated);
``read_hub_config(folder)`` is it for a timm hub folder (``local-dir:``), the ``readers["timm"]`` that
``vit_common.checkpoints.formats.timm`` takes (``python -m vit_torch.timm_models NAME --config``
prints it as JSON, for the JAX side's child process).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vit_common.checkpoints.convert import save_checkpoint
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.config import ViTConfig
from vit_common.tolerance import compare
from vit_torch.weights import from_numpy, to_numpy

_POOLS = {"token": "token", "avg": "gap", "max": "max", "avgmax": "avgmax", "map": "map", "": "none"}


def _gelu(act: nn.Module, name: str) -> str:
    from timm.layers.activations import GELU, GELUTanh, QuickGELU

    if isinstance(act, nn.GELU):
        return "tanh" if act.approximate == "tanh" else "exact"
    if isinstance(act, GELUTanh):
        return "tanh"
    if isinstance(act, QuickGELU):
        return "quick"
    if type(act) is GELU:
        return "exact"
    raise FormatError(
        f"timm model {name!r}: MLP activation {type(act).__name__}; the twins have exact, tanh and quick GELU"
    )


def timm_config(model: nn.Module, name: str = "model") -> ViTConfig:
    """The ViTConfig of a built timm ``VisionTransformer`` / ``VisionTransformerDistilled``, or of a timm
    ``Eva`` (EVA-02, DINOv3, Perception Encoder, RoPE-ViT: ``vit_torch.timm_eva.eva_config``).

    Raises:
        FormatError: naming what the model has and the twins lack (another model class, block, attention,
            MLP, activation, norm, pooling).
    """
    from timm.layers import AttentionPoolLatent, GluMlp, PatchEmbed, RmsNorm, SwiGLU
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import Attention, Block, Mlp, VisionTransformer

    m = model
    if type(m).__name__ == "Eva":
        from vit_torch.timm_eva import eva_config

        return eva_config(m, name)
    naflex = type(m).__name__ == "NaFlexVit"
    if naflex:
        from vit_torch.timm_naflex import naflex_embed_fields

        embed = naflex_embed_fields(m, name)
    elif not isinstance(m, VisionTransformer) or type(m) not in (VisionTransformer, VisionTransformerDistilled):
        raise FormatError(f"timm model {name!r} is a {type(m).__name__}, not a timm VisionTransformer")
    else:
        embed = _patch_embed_fields(m)
    blocks = list(m.blocks)
    b0 = blocks[0]
    mlp = getattr(b0, "mlp", None)  # parallel blocks have none: refused as their block below
    parts = {
        "block": (b0, Block),
        "attention": (getattr(b0, "attn", None), Attention),
        "MLP": (mlp, type(mlp) if isinstance(mlp, (GluMlp, SwiGLU)) else Mlp),
    }
    if not naflex:
        parts["patch embedding"] = (m.patch_embed, PatchEmbed)
    lacks = [f"{what} {type(obj).__name__}" for what, (obj, cls) in parts.items() if type(obj) is not cls]
    if lacks:
        raise FormatError(f"timm model {name!r}: the twins do not implement its " + ", ".join(lacks))
    kind = RmsNorm if type(b0.norm1) is RmsNorm else nn.LayerNorm  # timm's LayerNorm subclasses torch's
    norms = [
        b0.norm1,
        b0.norm2,
        m.norm,
        m.fc_norm,
        m.norm_pre,
        (m.embeds if naflex else m.patch_embed).norm,
        b0.attn.q_norm,
    ]
    if any(not isinstance(n, (kind, nn.Identity)) for n in norms):
        kinds = ", ".join(sorted({type(n).__name__ for n in norms} - {"Identity"}))
        raise FormatError(f"timm model {name!r}: norms {kinds}; the twins have one kind, LayerNorm or RmsNorm")
    if any(not isinstance(x, nn.Identity) for x in (b0.attn.norm, b0.mlp.norm)):
        raise FormatError(f"timm model {name!r}: a norm inside attention or MLP")
    if m.global_pool not in _POOLS:
        raise FormatError(f"timm model {name!r}: global_pool={m.global_pool!r}; the twins pool {', '.join(_POOLS)}")
    if m.attn_pool is not None and (type(m.attn_pool) is not AttentionPoolLatent or m.attn_pool.latent_len != 1):
        raise FormatError(f"timm model {name!r}: attention pooling {type(m.attn_pool).__name__} other than MAP")
    gated = isinstance(b0.mlp, (GluMlp, SwiGLU))
    if gated and type(b0.mlp.act) is not nn.SiLU:
        raise FormatError(
            f"timm model {name!r}: a gated MLP with {type(b0.mlp.act).__name__}; the twins' gate is SiLU (SwiGLU)"
        )
    distilled = isinstance(m, VisionTransformerDistilled)
    return ViTConfig(
        **embed,
        num_classes=m.num_classes,
        width=m.embed_dim,
        depth=len(blocks),
        num_heads=b0.attn.num_heads,
        mlp_dim=b0.mlp.fc2.in_features,
        mlp_type="swiglu" if gated else "plain",
        qkv_bias=b0.attn.qkv.bias is not None,
        qk_norm=not isinstance(b0.attn.q_norm, nn.Identity),
        ln_eps=float(b0.norm1.eps),
        norm="rmsnorm" if kind is RmsNorm else "layernorm",
        proj_bias=b0.attn.proj.bias is not None,
        mlp_bias=b0.mlp.fc2.bias is not None,
        gelu="exact" if gated else _gelu(b0.mlp.act, name),
        pool=_POOLS[m.global_pool],
        pool_include_prefix=bool(m.pool_include_prefix),
        dist_token=distilled,
        head_dist=distilled,
        norm_pre=not isinstance(m.norm_pre, nn.Identity),
        fc_norm=not isinstance(m.fc_norm, nn.Identity),
        final_norm=not (isinstance(m.norm, nn.Identity) and isinstance(m.fc_norm, nn.Identity)),
        layer_scale=1e-5 if not isinstance(b0.ls1, nn.Identity) else None,
        map_heads=m.attn_pool.num_heads
        if m.attn_pool is not None and m.attn_pool.num_heads != b0.attn.num_heads
        else 0,
    )


def _patch_embed_fields(m: nn.Module) -> dict[str, Any]:
    """ViTConfig fields of a timm VisionTransformer's ``patch_embed``, tokens and position table."""
    return dict(
        image_size=tuple(m.patch_embed.img_size),
        patch_size=tuple(m.patch_embed.patch_size),
        patch_bias=m.patch_embed.proj.bias is not None,
        in_chans=m.patch_embed.proj.in_channels,
        patch_norm=not isinstance(m.patch_embed.norm, nn.Identity),
        class_token=m.cls_token is not None,
        reg_tokens=m.num_reg_tokens,
        posemb="learn" if m.pos_embed is not None else "none",
        posemb_prefix=not m.no_embed_class,
        dynamic_img_size=bool(m.dynamic_img_size),
        dynamic_img_pad=bool(getattr(m.patch_embed, "dynamic_img_pad", False)),
    )


def canonical_from_timm(model: nn.Module, cfg: ViTConfig) -> dict[str, np.ndarray]:
    """The canonical state of a timm ViT whose config is ``cfg`` (``timm_config``): its state_dict, with a
    gated MLP packed as ours, gate rows first: timm ``SwiGLU``'s fc1_g then fc1_x, ``GluMlp``'s fc1
    halves swapped when ``gate_last`` (timm's default; ``SwiGLUPacked`` has the gate first already)."""
    from timm.layers import GluMlp

    from vit_common.checkpoints.formats.rules import to_canonical
    from vit_common.checkpoints.formats.tensors import materialize
    from vit_common.checkpoints.formats.timm_state import timm_rules

    tensors = {k: np.ascontiguousarray(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}
    if type(model).__name__ == "NaFlexVit":
        from vit_common.checkpoints.formats.timm_naflex import naflex_state

        tensors = naflex_state(tensors, cfg.patch_size, cfg.in_chans)
    if type(model).__name__ == "Eva":
        from vit_common.checkpoints.formats.timm_eva import eva_to_canonical

        return eva_to_canonical(tensors)
    mlp = model.blocks[0].mlp
    state = materialize(to_canonical(timm_rules(cfg, split_gate=hasattr(mlp, "fc1_g")), tensors, type(model).__name__))
    if isinstance(mlp, GluMlp) and mlp.gate_last:
        f = cfg.mlp_dim
        state = {k: np.concatenate([v[f:], v[:f]]) if ".mlp.fc1." in k else v for k, v in state.items()}
    return state


def timm_model_config(name: str, **kwargs: Any) -> ViTConfig:
    """The ViTConfig of ``timm.create_model(name, pretrained=False, **kwargs)``, built on the meta device
    (no weights allocated, nothing initialised), so what the name implies (e.g. CLIP's LayerNorm eps
    1e-5) is read off timm's own model.

    Raises:
        FormatError: an unknown name, keywords timm refuses, or a model the twins do not implement (named).
    """
    import timm

    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, **kwargs)
    except (RuntimeError, ValueError, TypeError, KeyError, AssertionError, FileNotFoundError) as e:
        raise FormatError(f"timm cannot build {name!r} ({type(e).__name__}: {e})") from e
    try:
        return timm_config(model, name)
    except FormatError:
        raise
    except ValueError as e:  # a config the twins cannot take (ViTConfig's check), named with the model
        raise FormatError(f"timm model {name!r}: {e}") from e


def read_hub_config(folder: str | Path) -> ViTConfig | None:
    """The ViTConfig timm builds from a timm hub folder (``timm.create_model("local-dir:FOLDER")``: its
    config.json's architecture, model_args and pretrained_cfg), or None when timm is not installed.

    Raises:
        FormatError: see ``timm_model_config``.
    """
    try:
        import timm  # noqa: F401
    except ImportError:
        return None
    return timm_model_config(f"local-dir:{folder}")


def timm_checkpoint(name: str, pretrained: bool = False, **kwargs: Any) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """(config, canonical state) of ``timm.create_model(name, pretrained=pretrained, **kwargs)``.

    Random weights (``pretrained=False``) are drawn with torch seed 0, without touching the caller's
    random state. The twin built from them is run beside the timm model on two random images: its
    float32 logits must equal timm's within the tolerance table's bound, or nothing is returned.

    Raises:
        FormatError: the model is not one the twins implement (named), or the check fails.
    """
    import timm

    with torch.random.fork_rng():  # random weights (pretrained=False) are reproducible: seed 0
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=pretrained, **kwargs).eval()
    cfg = timm_config(model, name)
    state = canonical_from_timm(model, cfg)
    twin = from_numpy(cfg, state)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, cfg.in_chans, *cfg.image_size), np.float32))
    with torch.no_grad():
        c = compare("logits", twin(x).numpy(), model(x).float().numpy(), "tensor", "float32")
    if not c.ok:
        raise FormatError(f"timm model {name!r}: the torch twin built from it differs from timm ({c})")
    return cfg, to_numpy(twin)


def from_timm(name: str, pretrained: bool = False, **kwargs: Any):
    """The torch twin of a timm model name, through ``timm.create_model`` (see ``timm_checkpoint``)."""
    cfg, state = timm_checkpoint(name, pretrained, **kwargs)
    return from_numpy(cfg, state)


def export_timm(name: str, path: str | Path, pretrained: bool = False, **kwargs: Any) -> None:
    """Write the timm model ``name`` as a timm ``.safetensors`` with its config in the header."""
    cfg, state = timm_checkpoint(name, pretrained, **kwargs)
    save_checkpoint(path, cfg, state, "timm")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m vit_torch.timm_models", description=export_timm.__doc__, allow_abbrev=False
    )
    p.add_argument("name", help="timm model name, e.g. vit_tiny_patch16_224")
    p.add_argument("out", nargs="?", help="the .safetensors file to write (not with --config)")
    p.add_argument("--config", action="store_true", help="print the model's ViTConfig as JSON instead (meta device)")
    p.add_argument("--pretrained", action="store_true", help="timm's pretrained weights (downloads)")
    p.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for timm.create_model")
    args = p.parse_args(argv)
    if args.config == (args.out is not None):
        p.error("give the file to write, or --config")
    try:
        if args.config:
            print(timm_model_config(args.name, **json.loads(args.kwargs)).to_json())
            return 0
        export_timm(args.name, args.out, args.pretrained, **json.loads(args.kwargs))
    except (ValueError, RuntimeError, OSError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
