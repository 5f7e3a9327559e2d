"""I-JEPA (transformers ``ijepa``) in the hf_family format: ``IJepaModel`` and
``IJepaForImageClassification``, an HF ViT without a class token that pools the mean of its patch tokens.
"""

from __future__ import annotations

from vit_common.checkpoints.formats.hf_families.family import Family
from vit_common.config import ViTConfig


class IJEPA(Family):
    """I-JEPA's rules: no class token, mean pooling, no registers."""

    def holds(self, cfg: ViTConfig) -> str | None:
        if not cfg.class_token and cfg.pool == "gap" and not cfg.reg_tokens:
            return "IJepaForImageClassification" if cfg.num_classes else "IJepaModel"
        return None


FAMILIES: dict[str, Family] = {
    "ijepa": IJEPA(
        "vit",
        dict(hidden_act="gelu", layer_norm_eps=1e-12, qkv_bias=True),
        {"IJepaModel": ("", "gap"), "IJepaForImageClassification": ("ijepa.", "gap")},
        class_token=False,
    ),
}
