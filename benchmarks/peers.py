"""ViTConfig -> the constructor arguments of the peer implementations the benchmark times.

The mappings are the ones weight conversion uses: ``vit_torch.oracles.timm_model_kwargs`` (``timm_kwargs``) for timm,
``vit_common.checkpoints.formats.hf_vit.config_json`` for Hugging Face. Anything a peer cannot express raises, rather
than timing a different model.
"""

from __future__ import annotations

from typing import Any

from vit_common.checkpoints.formats.hf_vit import config_json
from vit_common.config import ViTConfig


def peer_config(cfg: ViTConfig, library: str) -> dict[str, Any]:
    """Keyword arguments that build ``cfg`` in a peer library.

    ``library='timm'``: for ``timm.models.vision_transformer.VisionTransformer(**kwargs)``.
    ``library='hf'``: for ``transformers.ViTConfig(**kwargs)`` (then ``ViTForImageClassification``),
    with SDPA attention.

    Raises:
        ValueError: unknown library, or config fields the peer cannot express (named in the message).
    """
    unsupported = {
        "rep_size": cfg.rep_size,
        "posemb": cfg.posemb == "sincos2d",
        "dynamic_img_size": cfg.dynamic_img_size,
        "dynamic_img_pad": cfg.dynamic_img_pad,
        "dist_token": cfg.dist_token,  # the peers are built as plain ViTs
        "rope": cfg.rope != "none",  # timm's RoPE models are Eva (contenders._torch_model)
    }
    if library == "hf":  # ViTForImageClassification: class token, learned pos_embed with a class row
        unsupported |= {
            "qk_norm": cfg.qk_norm,
            "layer_scale": cfg.layer_scale is not None,
            "fc_norm": cfg.fc_norm,
            "reg_tokens": cfg.reg_tokens,
            "drop_path": cfg.drop_path,
            "pool": cfg.pool != "token",
            "posemb": cfg.posemb != "learn",
            "posemb_prefix": not cfg.posemb_prefix,
            "norm_pre": cfg.norm_pre,
            "patch_bias": not cfg.patch_bias,
        }
    if any(unsupported.values()):
        bad = ", ".join(f"{k}={getattr(cfg, k)!r}" for k, v in unsupported.items() if v)
        raise ValueError(f"{library} cannot express {bad}")
    if library == "timm":  # the same mapping weight conversion and the parity oracles use
        from vit_torch.oracles import timm_model_kwargs

        return timm_model_kwargs(cfg)
    if library == "hf":  # the config.json our HF writer puts beside the weights
        return {**config_json(cfg), "attn_implementation": "sdpa"}
    raise ValueError(f"library={library!r}: expected 'timm' or 'hf'")
