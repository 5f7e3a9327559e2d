"""SigLIP (transformers ``siglip_vision_model`` and ``siglip``) in the hf_family format.

``SiglipVisionModel``: no class token, the position embedding [N, D] has no prefix row, ``post_layernorm``
is the final norm, and the output is the MAP head (``head.*``, its packed ``in_proj`` split into our q and
kv by ``layout.split_in_proj``), or every token where config.json says ``vision_use_head=false``.
``SiglipForImageClassification`` classifies the mean of the tokens (``classifier``; its unused MAP head
is ignored). ``SiglipModel`` (``siglip``) is read as its ``vision_model.*`` tower; the text tower,
``logit_scale`` and ``logit_bias`` are ignored (reported). Written as ``SiglipVisionModel``, or, from a
source read from a ``SiglipForImageClassification`` folder or where ``--hf-model-type siglip`` asks
(``on_request``), as ``SiglipForImageClassification``: a ``SiglipConfig`` with the ``vision_config``
(``vision_use_head`` false: the classifier does not use the MAP head) and the default ``text_config``
that ``save_pretrained`` writes for a config built from a vision_config alone.
"""

from __future__ import annotations

from typing import Any, ClassVar

from vit_common.checkpoints.formats.hf_families.family import Family, FamilyConfig
from vit_common.checkpoints.formats.provenance import Origin
from vit_common.config import ViTConfig

_SIGLIP = dict(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, patch_size=16)
# transformers 5.24's SiglipTextConfig() / Siglip2TextConfig() as save_pretrained writes them, but model_type
TEXT_CONFIG = dict(
    attention_dropout=0.0,
    bos_token_id=49406,
    eos_token_id=49407,
    hidden_act="gelu_pytorch_tanh",
    hidden_size=768,
    intermediate_size=3072,
    layer_norm_eps=1e-6,
    max_position_embeddings=64,
    num_attention_heads=12,
    num_hidden_layers=12,
    pad_token_id=1,
    projection_size=768,
    vocab_size=32000,
)
# config.json keys of a two-tower folder's top level, not its vision_config
_TOP_KEYS = ("architectures", "model_type", "dtype")


class SigLIP(Family):
    """SigLIP's rules: the MAP head as config.json's ``vision_use_head`` says; ``tower_types``: the
    vision and text model types of a two-tower config.json."""

    tower_types: ClassVar[tuple[str, str]] = ("siglip_vision_model", "siglip_text_model")

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
        """No class token; the vision model (``SiglipVisionModel``): the MAP head or every token, no
        classes; the two-tower type's classifier (``SiglipForImageClassification``): the mean of the
        tokens, classes, no registers."""
        if cfg.class_token:
            return None
        if self.two_tower:
            held = cfg.pool == "gap" and cfg.num_classes > 0 and not cfg.reg_tokens
        else:
            held = cfg.pool in ("map", "none") and not cfg.num_classes
        head = "gap" if self.two_tower else "map"
        return next((a for a, (_, h) in self.architectures.items() if h == head), None) if held else None

    def config_keys(self, cfg: ViTConfig) -> dict[str, Any]:
        return super().config_keys(cfg) | {"vision_use_head": cfg.pool == "map"}

    def config_json(self, cfg: ViTConfig, common: dict[str, Any]) -> dict[str, Any]:
        """The vision model's config.json; a two-tower type's nests it as ``vision_config``, with
        ``TEXT_CONFIG`` as ``text_config``."""
        flat = super().config_json(cfg, common)
        if not self.two_tower:
            return flat
        vision, text = self.tower_types
        top = {k: flat[k] for k in _TOP_KEYS}
        tower = {k: v for k, v in flat.items() if k not in _TOP_KEYS}
        text_config = TEXT_CONFIG | {"model_type": text}
        return top | {"vision_config": tower | {"model_type": vision}, "text_config": text_config}


FAMILIES: dict[str, Family] = {
    "siglip_vision_model": SigLIP("clip", _SIGLIP, {"SiglipVisionModel": ("", "map")}, class_token=False),
    "siglip": SigLIP(
        "clip",
        _SIGLIP,
        {"SiglipModel": ("vision_model.", "map"), "SiglipForImageClassification": ("vision_model.", "gap")},
        two_tower=True,
        class_token=False,
        on_request=True,
    ),
}
