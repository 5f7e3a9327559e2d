"""The ViTConfig of a built timm ``Eva`` (``timm/models/eva.py``: EVA-02, DINOv3, Perception Encoder,
RoPE-ViT, the SBB RoPE ViTs), read off the model object: every choice declared.

What the twins lack is refused by name: post-norm blocks (``EvaBlockPostNorm``: EVA-02 enormous),
grouped-query or gated attention, attention-only LayerScale, pixel-band or M-RoPE tables, a DINOv3 table
with min/max periods, and timm's RoPE training-time coordinate augmentation.
"""

from __future__ import annotations

from torch import nn

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.config import ViTConfig

_POOLS = {"token": "token", "avg": "gap", "max": "max", "avgmax": "avgmax", "map": "map", "": "none"}


def _rope_fields(rope: nn.Module | None, name: str) -> dict:
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed

    if rope is None:
        return {}
    if any(getattr(rope, a, None) for a in ("shift_coords", "jitter_coords", "rescale_coords")):
        raise FormatError(f"timm model {name!r}: RoPE coordinate augmentation; the twins compute eval tables only")
    common = dict(rope_grid_indexing=rope.grid_indexing, rope_grid_offset=float(getattr(rope, "grid_offset", 0.0)))
    if type(rope) is RotaryEmbeddingDinoV3:
        if rope.min_period is not None or rope.max_period is not None:
            raise FormatError(f"timm model {name!r}: DINOv3 RoPE with min/max periods; the twins compute T^(k/(hd/4))")
        return dict(
            rope="dinov3",
            rope_temperature=float(rope.temperature),
            rope_layout="half" if rope.rotate_half else "interleaved",
            rope_normalize=rope.normalize_coords,
            **common,
        )
    if type(rope) is RotaryEmbeddingCat:
        if rope.in_pixels:
            raise FormatError(f"timm model {name!r}: pixel-band RoPE (in_pixels=True); the twins use index grids")
        ref = tuple(int(r) for r in rope.ref_feat_shape) if rope.ref_feat_shape is not None else None
        return dict(
            rope="cat",
            rope_temperature=float(rope.temperature),
            rope_layout="half" if rope.rotate_half else "interleaved",
            rope_ref_grid=ref,
            **common,
        )
    if type(rope) is RotaryEmbeddingMixed:
        return dict(rope="mixed", rope_grid_indexing=rope.grid_indexing)
    raise FormatError(f"timm model {name!r}: RoPE {type(rope).__name__}; the twins have dinov3, cat and mixed")


def eva_config(model: nn.Module, name: str = "model") -> ViTConfig:
    """The ViTConfig of a built timm ``Eva``.

    Raises:
        FormatError: naming what the model has and the twins lack.
    """
    from timm.layers import AttentionPoolLatent, GluMlp, Mlp, SwiGLU
    from timm.layers.attention import AttentionRope
    from timm.models.eva import Eva, EvaAttention, EvaBlock

    m = model
    if type(m) is not Eva:
        raise FormatError(f"timm model {name!r} is a {type(m).__name__}, not a timm Eva")
    b0 = m.blocks[0]
    if type(b0) is not EvaBlock:
        raise FormatError(f"timm model {name!r}: block {type(b0).__name__}; the twins have pre-norm blocks")
    attn, mlp = b0.attn, b0.mlp
    if type(attn) not in (EvaAttention, AttentionRope) or getattr(attn, "gate", None) is not None:
        raise FormatError(f"timm model {name!r}: attention {type(attn).__name__} (gated or grouped-query)")
    if getattr(attn, "num_kv_heads", attn.num_heads) != attn.num_heads:
        raise FormatError(f"timm model {name!r}: grouped-query attention; the twins have multi-head attention")
    if (getattr(b0, "gamma_1", None) is None) != (getattr(b0, "gamma_2", None) is None):
        raise FormatError(f"timm model {name!r}: LayerScale on one branch only")
    if type(mlp) not in (Mlp, GluMlp, SwiGLU):
        raise FormatError(f"timm model {name!r}: MLP {type(mlp).__name__}")
    gated = type(mlp) in (GluMlp, SwiGLU)
    if gated and type(mlp.act) is not nn.SiLU or not gated and type(mlp.act) is not nn.GELU:
        raise FormatError(f"timm model {name!r}: MLP activation {type(mlp.act).__name__}")
    fused = getattr(attn, "qkv", None) is not None
    k_bias = (attn.qkv.bias is not None) if fused else (attn.k_proj.bias is not None)
    qv_bias = getattr(attn, "q_bias", None) is not None or (not fused and attn.q_proj.bias is not None)
    pool = m.attn_pool
    if pool is not None and (type(pool) is not AttentionPoolLatent or pool.latent_len != 1):
        raise FormatError(f"timm model {name!r}: attention pooling {type(pool).__name__} other than MAP")
    if m.global_pool not in _POOLS:
        raise FormatError(f"timm model {name!r}: global_pool={m.global_pool!r}")
    has_norm, has_fc_norm = not isinstance(m.norm, nn.Identity), not isinstance(m.fc_norm, nn.Identity)
    gamma = getattr(b0, "gamma_1", None)
    return ViTConfig(
        image_size=tuple(m.patch_embed.img_size),
        patch_size=tuple(m.patch_embed.patch_size),
        patch_bias=m.patch_embed.proj.bias is not None,
        in_chans=m.patch_embed.proj.in_channels,
        num_classes=m.num_classes,
        width=m.embed_dim,
        depth=len(m.blocks),
        num_heads=attn.num_heads,
        mlp_dim=mlp.fc2.in_features,
        mlp_type="swiglu" if gated else "plain",
        qkv_bias=k_bias or qv_bias,
        k_bias=k_bias or not qv_bias,
        qk_norm=not isinstance(getattr(attn, "q_norm", nn.Identity()), nn.Identity),
        attn_inner_norm=not isinstance(attn.norm, nn.Identity),
        mlp_inner_norm=not isinstance(mlp.norm, nn.Identity),
        ln_eps=float(b0.norm1.eps),
        pool=_POOLS[m.global_pool],
        pool_include_prefix=pool is not None,  # Eva feeds its MAP head every token, avg/max the patches
        class_token=m.cls_token is not None,
        reg_tokens=m.reg_token.shape[1] if m.reg_token is not None else 0,
        posemb="learn" if m.pos_embed is not None else "none",
        posemb_prefix=not m.no_embed_class,
        norm_pre=not isinstance(m.norm_pre, nn.Identity),
        fc_norm=has_fc_norm,
        final_norm=has_norm or has_fc_norm,
        head_bias=getattr(m.head, "bias", None) is not None,
        layer_scale=1.0 if gamma is not None else None,
        map_heads=pool.num_heads if pool is not None else 0,
        map_mlp_dim=pool.mlp.fc1.out_features if pool is not None else 0,
        dynamic_img_size=bool(m.dynamic_img_size),
        **_rope_fields(m.rope, name),
    )
