"""A timm hub folder's config.json as timm's _parse_model_cfg splits it (timm models/_hub.py), and what it
declares without timm (vit_common.checkpoints.formats.timm_hub); the folders themselves are tested against
timm in parity_tests/test_formats_timm_hub.py."""

from __future__ import annotations

import pytest

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.timm_hub import declared_fields, hub_config, hub_preprocess, is_hub_config
from vit_common.data.images import Preprocess

# What timm 1.0.31's save_for_hf writes for vit_base_patch16_clip_224 (embed_dim=32, depth=2, num_heads=2).
SAVED = {
    "architecture": "vit_base_patch16_clip_224",
    "num_classes": 1000,
    "num_features": 32,
    "global_pool": "token",
    "model_args": {
        "embed_dim": 32,
        "depth": 2,
        "num_heads": 2,
        "in_chans": 3,
        "num_classes": 1000,
        "img_size": [224, 224],
    },
    "pretrained_cfg": {
        "tag": "laion2b_ft_in12k_in1k",
        "input_size": [3, 224, 224],
        "fixed_input_size": True,
        "interpolation": "bicubic",
        "crop_pct": 0.95,
        "crop_mode": "center",
        "mean": [0.48145466, 0.4578275, 0.40821073],
        "std": [0.26862954, 0.26130258, 0.27577711],
        "num_classes": 1000,
    },
}


def test_the_two_layouts_timm_reads():
    hub = hub_config(SAVED, "config.json")
    assert (hub.architecture, hub.num_classes, hub.global_pool) == ("vit_base_patch16_clip_224", 1000, "token")
    assert hub.model_args["embed_dim"] == 32 and hub.pretrained_cfg["crop_pct"] == 0.95
    flat = {"architecture": "vit_small_patch16_224", "num_classes": 10, "mean": [0.5] * 3, "labels": ["a", "b"]}
    old = hub_config(flat, "config.json")  # the oldest exports: one flat dict, 'labels' for label_names
    assert (old.architecture, old.num_classes, old.model_args, old.label_names) == (
        "vit_small_patch16_224",
        10,
        {},
        ("a", "b"),
    )
    assert hub_config(SAVED | {"label_names": {"1": "b", "0": "a"}}, "c").label_names == ("a", "b")
    assert is_hub_config(SAVED) and not is_hub_config({"architectures": ["ViTModel"], "model_type": "vit"})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"architecture": None}, "no 'architecture'"),
        ({"model_args": [1]}, "model_args=\\[1\\] is not a JSON object"),
        ({"num_classes": -1}, "num_classes=-1 is not a class count"),
        ({"global_pool": "prr"}, "global_pool='prr'; the twins pool"),
        ({"label_names": {"0": "a", "2": "c"}}, "label_names leave class ids unnamed"),
    ],
)
def test_a_malformed_config_json_is_one_named_error(change, message):
    with pytest.raises(FormatError, match=f"^cfg.json: {message}"):
        hub_config(SAVED | change, "cfg.json")


def test_without_timm_config_json_declares_what_it_states():
    fields, keys, unread = declared_fields(hub_config(SAVED, "c"), "c")
    assert fields == {"num_heads": 2, "pool": "token", "image_size": (224, 224)}
    assert keys == {"num_heads": "model_args num_heads", "pool": "global_pool", "image_size": "model_args img_size"}
    assert unread == []
    args = {"global_pool": "avg", "no_embed_class": True, "act_layer": "quick_gelu", "mlp_layer": "swiglu"}
    fields, keys, unread = declared_fields(hub_config(SAVED | {"model_args": args}, "c"), "c")
    assert fields == {"pool": "gap", "posemb_prefix": False, "gelu": "quick", "image_size": (224, 224)}
    assert keys["image_size"] == "pretrained_cfg input_size" and unread == ["mlp_layer='swiglu'"]
    with pytest.raises(FormatError, match="act_layer='silu'; the twins have"):
        declared_fields(hub_config(SAVED | {"model_args": {"act_layer": "silu"}}, "c"), "c")


def test_pretrained_cfg_is_the_preprocessing_with_timms_defaults():
    clip = Preprocess(
        (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711), "bicubic", 0.95, "center"
    )
    assert hub_preprocess(hub_config(SAVED, "c"), "c") == clip
    assert hub_preprocess(hub_config({"architecture": "x", "pretrained_cfg": {}}, "c"), "c") is None  # none stated
    std_only = hub_config({"architecture": "x", "pretrained_cfg": {"std": [0.5, 0.5, 0.5]}}, "c")
    assert hub_preprocess(std_only, "c") == Preprocess((0.485, 0.456, 0.406), (0.5,) * 3, "bicubic", 0.875, "center")
    odd = hub_config({"architecture": "x", "pretrained_cfg": {"mean": [0.5], "interpolation": "box"}}, "c")
    with pytest.raises(FormatError, match="interpolation='box'; expected one of"):
        hub_preprocess(odd, "c")
