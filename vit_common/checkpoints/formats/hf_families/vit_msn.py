"""ViT-MSN (transformers ``vit_msn``) in the hf_family format: ``ViTMSNModel`` and
``ViTMSNForImageClassification``, an HF ViT pooling its class token. Written only when asked for
(``--hf-model-type vit_msn``), or from a vit_msn source: a plain ViT is otherwise the hf format's.
"""

from __future__ import annotations

from vit_common.checkpoints.formats.hf_families.family import Family, plain_vit
from vit_common.config import ViTConfig


class ViTMSN(Family):
    """ViT-MSN's rules: a plain ViT, backbone or classifier."""

    def holds(self, cfg: ViTConfig) -> str | None:
        if not plain_vit(cfg):
            return None
        return "ViTMSNForImageClassification" if cfg.num_classes else "ViTMSNModel"


FAMILIES: dict[str, Family] = {
    "vit_msn": ViTMSN(
        "vit",
        dict(hidden_act="gelu", layer_norm_eps=1e-6, qkv_bias=True),
        {"ViTMSNModel": ("", "token"), "ViTMSNForImageClassification": ("vit.", "token")},
        on_request=True,
    ),
}
