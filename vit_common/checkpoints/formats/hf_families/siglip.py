"""SigLIP (transformers ``siglip_vision_model`` and ``siglip``) in the hf_family format.

``SiglipVisionModel``: no class token, the position embedding [N, D] has no prefix row, ``post_layernorm``
is the final norm, and the output is the MAP head (``head.*``, its packed ``in_proj`` split into our q and
kv by ``layout.split_in_proj``), or every token where config.json says ``vision_use_head=false``.
``SiglipForImageClassification`` classifies the mean of the tokens (``classifier``; its unused MAP head
is ignored). ``SiglipModel`` (``siglip``) is read as its ``vision_model.*`` tower; the text tower,
``logit_scale`` and ``logit_bias`` are ignored (reported). Written as ``SiglipVisionModel``.
"""

from __future__ import annotations

from typing import Any

from vit_common.checkpoints.formats.hf_families.family import Family, FamilyConfig
from vit_common.checkpoints.formats.provenance import Origin
from vit_common.config import ViTConfig

_SIGLIP = dict(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, patch_size=16)


class SigLIP(Family):
    """SigLIP's rules: the MAP head as config.json's ``vision_use_head`` says."""

    def read_pool(
        self, cj: FamilyConfig, arch: str, head: str, arch_origin: Origin, type_origin: Origin, has_head: bool = True
    ) -> tuple[str, Origin, str]:
        """The MAP head, if the folder has one: pool 'none' where ``vision_use_head`` is false; the head's
        tensors unused then, and by the classifier (which pools the mean)."""
        pool, origin, unused = super().read_pool(cj, arch, head, arch_origin, type_origin)
        use_head, head_origin = (
            cj.get("vision_use_head", (bool,)) if "vision_use_head" in cj.config else (True, type_origin)
        )
        if head == "map" and not use_head:
            pool, origin = "none", head_origin
        if head == "gap" or not use_head:
            unused = f"{arch} does not use the MAP head" if head == "gap" else "config.json vision_use_head=false"
        return pool, origin, unused

    def holds(self, cfg: ViTConfig) -> str | None:
        """``SiglipVisionModel``: no class token, the MAP head or every token, no classes."""
        if not cfg.class_token and cfg.pool in ("map", "none") and not cfg.num_classes:
            return "SiglipVisionModel"
        return None

    def config_keys(self, cfg: ViTConfig) -> dict[str, Any]:
        return super().config_keys(cfg) | {"vision_use_head": cfg.pool == "map"}


FAMILIES: dict[str, Family] = {
    "siglip_vision_model": SigLIP("clip", _SIGLIP, {"SiglipVisionModel": ("", "map")}, class_token=False),
    "siglip": SigLIP(
        "clip",
        _SIGLIP,
        {"SiglipModel": ("vision_model.", "map"), "SiglipForImageClassification": ("vision_model.", "gap")},
        two_tower=True,
        class_token=False,
    ),
}
