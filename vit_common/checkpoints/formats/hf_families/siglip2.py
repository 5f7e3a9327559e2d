"""NaFlex SigLIP 2 (transformers ``siglip2_vision_model`` and ``siglip2``) in the hf_family format.

``Siglip2VisionModel`` is SigLIP's vision tower (``siglip``) but for its input: flattened patches, a
patch mask and each image's patch grid (``vit_common.naflex``). Its ``embeddings.patch_embedding`` is a
linear map [D, P*P*C] over patches flattened (P, P, C) (``Siglip2ImageProcessor``), read as our patch
convolution [D, C, P, P] (the same map: ``PatchEmbed.embed_flat``); ``position_embedding`` [G*G, D]
(config.json ``num_patches`` = G*G) is the table at image_size G*P, resized per image bilinearly with
antialias (``Siglip2VisionEmbeddings.resize_positional_embeddings``: posemb_resample 'bilinear_aa').
``Siglip2Model`` (``siglip2``) is read as its ``vision_model.*`` tower; ``Siglip2ForImageClassification``
classifies the masked mean of the tokens. The fixed-resolution SigLIP 2 checkpoints are plain ``siglip``
folders (``siglip.py``).

Written as ``Siglip2VisionModel`` (config.json ``num_patches`` for ``image_size``) from a source read from
such a folder, or when ``--hf-model-type siglip2_vision_model`` asks for it (``on_request``: a SigLIP model
is otherwise written as ``siglip_vision_model``); as ``Siglip2ForImageClassification`` (a ``Siglip2Config``
nesting it, as ``siglip``'s classifier) from a source read from such a folder or with ``--hf-model-type
siglip2``. A model whose table resizes other than bilinearly with antialias is refused by name.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf_families.family import Family, FamilyConfig
from vit_common.checkpoints.formats.hf_families.siglip import SigLIP
from vit_common.checkpoints.formats.provenance import Origin, declared
from vit_common.checkpoints.formats.rules import Piece, Rule
from vit_common.config import ViTConfig

_SIGLIP2 = dict(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, patch_size=16, num_patches=256)
_PATCH = "embeddings.patch_embedding.weight"


class Siglip2(SigLIP):
    """SigLIP's rules with NaFlex's patch embedding and position table."""

    tower_types: ClassVar[tuple[str, str]] = ("siglip2_vision_model", "siglip2_text_model")

    def checks(self, cfg: ViTConfig) -> dict[str, bool]:
        """SigLIP's, and a table resized other than bilinearly with antialias, as transformers resizes it."""
        resize = f"posemb_resample={cfg.posemb_resample!r} (Siglip2VisionModel resizes its table 'bilinear_aa')"
        return super().checks(cfg) | {resize: cfg.posemb_resample != "bilinear_aa"}

    def config_json(self, cfg: ViTConfig, common: dict[str, Any]) -> dict[str, Any]:
        """SigLIP's keys, with ``num_patches`` (the table's G*G cells) instead of ``image_size``."""
        common = {k: v for k, v in common.items() if k != "image_size"} | {"num_patches": cfg.grid[0] * cfg.grid[1]}
        return super().config_json(cfg, common)

    def patch_dims(self, cj: FamilyConfig, shape: tuple[int, ...], key: str) -> tuple[int, int, int, int]:
        """(D, C, P, P) of the linear patch embedding [D, P*P*C], P and C from config.json."""
        p, _ = cj.get("patch_size", (int,))
        c, _ = cj.get("num_channels", (int,))
        if len(shape) != 2 or shape[1] != p * p * c:
            raise FormatError(f"{cj.context}: {key} has shape {tuple(shape)}, expected [D, P*P*C = {p * p * c}]")
        return shape[0], c, p, p

    def read_image_size(self, cj: FamilyConfig) -> tuple[int, Origin]:
        """G*P for config.json ``num_patches`` = G*G (the position table's grid G x G)."""
        n, origin = cj.get("num_patches", (int,))
        p, _ = cj.get("patch_size", (int,))
        side = math.isqrt(n) if n > 0 else 0
        if side < 1 or side * side != n:
            raise FormatError(
                f"{cj.context}: config.json num_patches={n}: expected a positive square G*G (the position table's "
                "G x G grid)"
            )
        return side * p, declared(f"config.json num_patches={n} (a {side}x{side} table) x patch_size")

    def rules(self, cfg: ViTConfig, spelling: str, prefix: str, layer_prefix: str, head: str) -> list[Rule]:
        """SigLIP's rules, the patch embedding read from its flattened (P, P, C) columns."""
        d, c, (ph, pw) = cfg.width, cfg.in_chans, cfg.patch_size
        flat = Piece(prefix + _PATCH, (d, ph * pw * c), reshape=(d, ph, pw, c), perm=(0, 3, 1, 2))
        rules = super().rules(cfg, spelling, prefix, layer_prefix, head)
        return [Rule("patch_embed.proj.weight", (flat,)) if r.dst == "patch_embed.proj.weight" else r for r in rules]


FAMILIES: dict[str, Family] = {
    "siglip2_vision_model": Siglip2(
        "clip",
        _SIGLIP2,
        {"Siglip2VisionModel": ("", "map")},
        resample="bilinear_aa",
        class_token=False,
        on_request=True,
    ),
    "siglip2": Siglip2(
        "clip",
        _SIGLIP2,
        {"Siglip2Model": ("vision_model.", "map"), "Siglip2ForImageClassification": ("vision_model.", "gap")},
        resample="bilinear_aa",
        two_tower=True,
        class_token=False,
        on_request=True,
    ),
}
