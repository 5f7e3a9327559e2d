"""ViT-MAE (transformers ``vit_mae``) in the hf_family format: ``ViTMAEModel``, an HF ViT encoder pooling
its class token, read and written with every patch encoded (transformers' ``mask_ratio=0``; its random
masking is a pre-training device). ``ViTMAEForPreTraining`` (its decoder) is refused by name. Written
only when asked for (``--hf-model-type vit_mae``), or from a vit_mae source: a plain ViT is otherwise the
hf format's.
"""

from __future__ import annotations

from typing import Any

from vit_common.checkpoints.formats.hf_families.family import Family, plain_vit
from vit_common.config import ViTConfig


class ViTMAE(Family):
    """ViT-MAE's rules: the encoder of a plain ViT without classes, written with ``mask_ratio`` 0."""

    def holds(self, cfg: ViTConfig) -> str | None:
        return "ViTMAEModel" if plain_vit(cfg) and not cfg.num_classes else None

    def config_keys(self, cfg: ViTConfig) -> dict[str, Any]:
        # ViTMAEModel encodes every patch (in its random order: attention is blind to it)
        return super().config_keys(cfg) | {"mask_ratio": 0.0}


FAMILIES: dict[str, Family] = {
    "vit_mae": ViTMAE(
        "vit",
        dict(hidden_act="gelu", layer_norm_eps=1e-12, qkv_bias=True),
        {"ViTMAEModel": ("", "token")},
        refused={"ViTMAEForPreTraining": "ViT-MAE's masked-image-modelling decoder (save its ViTMAEModel encoder)"},
        on_request=True,
        note=(
            "ViT-MAE: every patch is encoded (transformers' ViTMAEModel with mask_ratio=0); its random masking is "
            "a pre-training device"
        ),
    ),
}
