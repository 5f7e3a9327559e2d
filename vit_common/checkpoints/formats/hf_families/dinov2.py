"""DINOv2 (transformers ``dinov2`` and ``dinov2_with_registers``) in the hf_family format.

``Dinov2Model`` (its pooler: the class token) and ``Dinov2ForImageClassification`` (a classifier on
[class token, mean of patches]: pool 'token_gap'): ``layer_scale{1,2}.lambda1`` are LayerScale, the FFN
is an MLP or SwiGLU (config.json ``mlp_ratio`` and ``use_swiglu_ffn``; ``layout`` reads both key
spellings), ``mask_token`` is ignored (written as zeros). ``dinov2_with_registers`` adds
``register_tokens``, which enter after the position embedding; that embedding has a class row, which is
folded into cls_token (exact; ``layout.fold_class_row``). Its position embedding is resampled with
antialias, the others' without. The multi-stage ``Backbone`` outputs are refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf_families.family import Family, FamilyConfig
from vit_common.checkpoints.formats.provenance import Origin
from vit_common.config import ViTConfig

_DINO = dict(hidden_act="gelu", layer_norm_eps=1e-6, mlp_ratio=4, qkv_bias=True, use_swiglu_ffn=False)


def dinov2_ratio(cfg: ViTConfig) -> int | None:
    """The integer ``mlp_ratio`` (transformers 5.24's Dinov2Config types it int) that gives cfg.mlp_dim:
    hidden = D * mlp_ratio, for SwiGLU rounded as (int(hidden * 2 / 3) + 7) // 8 * 8; None if none does."""
    for ratio in range(1, 65):
        h = cfg.width * ratio
        if (h if cfg.mlp_type == "plain" else swiglu_width(h)) == cfg.mlp_dim:
            return ratio
    return None


def swiglu_width(hidden: int) -> int:
    """The gated width of transformers' ``Dinov2SwiGLUFFN`` (and ``RadioSwiGLUFFN``) for MLP width ``hidden``."""
    return (int(hidden * 2 / 3) + 7) // 8 * 8


def ratio_mlp(cj: FamilyConfig, width: int) -> tuple[dict[str, Any], dict[str, Origin]]:
    """(mlp_dim and mlp_type, their origins) from config.json's ``mlp_ratio`` and ``use_swiglu_ffn`` at
    ``width`` (DINOv2's and RADIO's configs).

    Raises:
        FormatError: an ``mlp_ratio`` outside (0, 64] (named with the file).
    """
    ratio, ratio_origin = cj.get("mlp_ratio", (int, float))
    if not (math.isfinite(ratio) and 0 < ratio <= 64):
        raise FormatError(f"{cj.context}: config.json mlp_ratio={ratio!r}: expected a number in (0, 64]")
    gated, gated_origin = cj.get("use_swiglu_ffn", (bool,))
    hidden = int(width * ratio)
    fields = {"mlp_dim": swiglu_width(hidden) if gated else hidden, "mlp_type": "swiglu" if gated else "plain"}
    return fields, {"mlp_type": gated_origin, "mlp_dim": ratio_origin}


@dataclass(frozen=True)
class DINOv2(Family):
    """DINOv2's rules: the MLP from ``mlp_ratio`` and ``use_swiglu_ffn``, LayerScale, and (``registers``)
    the register tokens."""

    registers: bool = False

    def read_mlp(self, cj: FamilyConfig, width: int, origin: Origin) -> tuple[dict[str, Any], dict[str, Origin]]:
        fields, origins = ratio_mlp(cj, width)
        # transformers' layerscale_value: the init value, replaced by the loaded lambda1
        return fields | {"layer_scale": 1.0}, origins

    def read_registers(self, cj: FamilyConfig, origin: Origin) -> tuple[int, Origin]:
        return cj.get("num_register_tokens", (int,)) if self.registers else (0, origin)

    def holds(self, cfg: ViTConfig) -> str | None:
        """The backbone (pool 'token', no classes) or the classifier (pool 'token_gap'): LayerScale and a
        class token; with register tokens exactly where ``registers``."""
        if (
            cfg.class_token
            and cfg.layer_scale is not None
            and (cfg.pool, bool(cfg.num_classes)) in (("token", False), ("token_gap", True))
            and bool(cfg.reg_tokens) == self.registers
        ):
            return next(a for a, (_, head) in self.architectures.items() if head == cfg.pool)
        return None

    def config_keys(self, cfg: ViTConfig) -> dict[str, Any]:
        return {
            "mlp_ratio": dinov2_ratio(cfg),
            "use_swiglu_ffn": cfg.mlp_type == "swiglu",
            "qkv_bias": cfg.qkv_bias,
            "layerscale_value": 1.0,
            "use_mask_token": True,
        } | ({"num_register_tokens": cfg.reg_tokens} if cfg.reg_tokens else {})


FAMILIES: dict[str, Family] = {
    "dinov2": DINOv2(
        "dinov2",
        _DINO | dict(patch_size=14),
        {"Dinov2Model": ("", "token"), "Dinov2ForImageClassification": ("dinov2.", "token_gap")},
        refused={"Dinov2Backbone": "a multi-stage backbone output"},
    ),
    "dinov2_with_registers": DINOv2(
        "dinov2",
        _DINO | dict(patch_size=16, num_register_tokens=4),
        {
            "Dinov2WithRegistersModel": ("", "token"),
            "Dinov2WithRegistersForImageClassification": ("dinov2_with_registers.", "token_gap"),
        },
        resample="bicubic_aa",
        refused={"Dinov2WithRegistersBackbone": "a multi-stage backbone output"},
        registers=True,
    ),
}
