"""CLIP (transformers ``clip_vision_model`` and ``clip``) in the hf_family format.

``CLIPVisionModel`` (its pooler: the post-norm class token) and ``CLIPVisionModelWithProjection`` (with
the bias-free ``visual_projection``): ``class_embedding`` [D] is the class token, ``pre_layrnorm``
norm_pre, no patch bias, ``post_layernorm`` the final norm (the class token's norm is the same either
way), the projection a bias-free head. ``CLIPModel`` (``clip``) is read as ``vision_model.*`` and
``visual_projection``; its text tower is ignored. ``CLIPForImageClassification`` (a classifier on the
mean of un-normalised patch tokens) is refused by name.
"""

from __future__ import annotations

from typing import Any

from vit_common.checkpoints.formats.hf_families.family import Family
from vit_common.config import ViTConfig

_CLIP = dict(hidden_act="quick_gelu", layer_norm_eps=1e-5, patch_size=32)
_REFUSED = {"CLIPForImageClassification": "a classifier on the mean of un-normalised patch tokens (no final norm)"}


class CLIP(Family):
    """CLIP's rules: which models it holds, the projection's width in config.json."""

    def holds(self, cfg: ViTConfig) -> str | None:
        """``CLIPVisionModelWithProjection`` (classes: the projection) or ``CLIPVisionModel``: norm_pre, no
        patch bias, the class token pooled."""
        if cfg.norm_pre and not cfg.patch_bias and cfg.class_token and cfg.pool == "token":
            return "CLIPVisionModelWithProjection" if cfg.num_classes else "CLIPVisionModel"
        return None

    def config_keys(self, cfg: ViTConfig) -> dict[str, Any]:
        return super().config_keys(cfg) | ({"projection_dim": cfg.num_classes} if cfg.num_classes else {})


FAMILIES: dict[str, Family] = {
    "clip_vision_model": CLIP(
        "clip",
        _CLIP,
        {"CLIPVisionModel": ("", "token"), "CLIPVisionModelWithProjection": ("vision_model.", "project")},
        patch_bias=False,
        norm_pre=True,
        refused=_REFUSED,
    ),
    "clip": CLIP(
        "clip",
        _CLIP,
        {"CLIPModel": ("vision_model.", "project")},
        two_tower=True,
        patch_bias=False,
        norm_pre=True,
        refused=_REFUSED,
    ),
}
