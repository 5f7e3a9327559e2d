"""The table of timm's ViT architectures (vit_common.checkpoints.formats.timm_names), against timm: the
names it covers are timm's, and its rows are what timm builds (a sample: building all takes minutes;
``python -m vit_torch.timm_architectures --check`` compares every row)."""

from __future__ import annotations

import pytest
import timm

from vit_common.checkpoints.formats.timm_names import (
    TABLE_PATH,
    architecture_config,
    matching_name,
    not_implemented,
    timm_version,
)
from vit_common.config import FUNCTION_FIELDS, ViTConfig
from vit_torch.timm_architectures import architecture_names, table
from vit_torch.timm_models import timm_model_config

SAMPLE = [
    "vit_tiny_patch16_224",
    "vit_base_patch16_clip_224",  # LayerNorm eps 1e-5, pre_norm
    "vit_base_patch16_siglip_224",  # MAP head
    "vit_base_patch16_224_miil",  # no qkv bias
    "deit_base_distilled_patch16_224",
    "vit_small_patch14_reg4_dinov2",  # registers, LayerScale, 518 px
    "vit_medium_patch16_gap_256",  # global average pooling, no class token
    "vit_base_patch16_radio_v3",  # no final norm, 7 registers
]


@pytest.mark.slow
def test_the_table_is_what_timm_builds():
    import json

    stored = json.loads(TABLE_PATH.read_text())
    assert timm_version() == timm.__version__, "regenerate the table: python -m vit_torch.timm_architectures"
    assert set(stored["architectures"]) | set(stored["not_implemented"]) == set(architecture_names())
    lacking = sorted(stored["not_implemented"])[:1]
    fresh = table(SAMPLE + lacking)
    assert fresh["architectures"] == {n: stored["architectures"][n] for n in SAMPLE}
    assert fresh["not_implemented"] == {n: stored["not_implemented"][n] for n in lacking}
    for name in SAMPLE:  # every field that changes the function (the table keeps no run-time choice)
        ours, timms = architecture_config(name), timm_model_config(name)
        assert all(getattr(ours, k) == getattr(timms, k) for k in FUNCTION_FIELDS), name
    assert not_implemented(lacking[0]).startswith(f"timm model {lacking[0]!r}")


def test_a_config_is_named_after_the_architecture_that_builds_it():
    assert matching_name(ViTConfig.from_name("Ti/16", num_classes=10)) == "vit_tiny_patch16_224"
    assert matching_name(timm_model_config("vit_base_patch16_clip_224")) == "vit_base_patch16_clip_224"
    assert matching_name(ViTConfig.from_name("Ti/16").replace(depth=3)) is None
