"""transformers' image-processor configs read as each processor type applies them (numpy and Pillow only;
parity_tests/test_preprocess_transformers.py holds the pixels against transformers itself): the class defaults of
each type, the size forms, what is refused by name, the transformers geometry of ``eval_resize_crop``
(floor offset, zero padding), ``rescale_factor`` in ``normalize``, and the writers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vit_common.checkpoints.formats.timm_hub import timm_preprocess
from vit_common.checkpoints.metadata import (
    HF_PROCESSORS,
    ModelInfo,
    hf_preprocess,
    hf_preprocessor_config,
    with_overrides,
)
from vit_common.data.images import IMAGENET_MEAN, IMAGENET_STD, Preprocess, eval_resize_crop, from_array, normalize

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
SQUASH_224 = dict(crop_mode="squash", resize_size=(224, 224))
EDGE_224 = dict(crop_mode="center", resize_size=(224,), crop_size=(224, 224))
DEFAULTS = {  # what each type computes from a file that names it alone (transformers 5.24 class attributes)
    "ViTImageProcessor": Preprocess((0.5,), (0.5,), "bilinear", **SQUASH_224),
    "DeiTImageProcessor": Preprocess(
        (0.5,), (0.5,), "bicubic", crop_mode="squash", resize_size=(256, 256), crop_size=(224, 224)
    ),
    "SiglipImageProcessor": Preprocess((0.5,), (0.5,), "bicubic", **SQUASH_224),
    "CLIPImageProcessor": Preprocess(CLIP_MEAN, CLIP_STD, "bicubic", **EDGE_224),
    "BitImageProcessor": Preprocess(CLIP_MEAN, CLIP_STD, "bicubic", **EDGE_224),
    "DINOv3ViTImageProcessor": Preprocess(
        IMAGENET_MEAN, IMAGENET_STD, "bilinear", **SQUASH_224, rescale_before_resize=True
    ),  # rescales, then resizes floats
    "Siglip2ImageProcessor": Preprocess((0.5,), (0.5,), "bilinear", max_patches=256),  # NaFlex
}


@pytest.mark.parametrize("name", HF_PROCESSORS)
def test_each_type_s_own_defaults_fill_what_the_file_omits(name):
    assert hf_preprocess({"image_processor_type": name}, "p") == DEFAULTS[name]
    for spelled in (name + "Fast", name + "Pil"):  # the torchvision and the PIL class of one type
        assert hf_preprocess({"image_processor_type": spelled}, "p") == DEFAULTS[name]
    nulls = {"image_processor_type": name, "size": None, "resample": None, "image_mean": None, "do_rescale": None}
    assert hf_preprocess(nulls, "p") == DEFAULTS[name]  # null is the class default, as transformers reads it


@pytest.mark.parametrize(
    ("model_type", "name"),
    [("vit", "ViTImageProcessor"), ("vit_mae", "ViTImageProcessor"), ("vit_msn", "ViTImageProcessor"),
     ("ijepa", "ViTImageProcessor"), ("deit", "DeiTImageProcessor"), ("dinov2", "BitImageProcessor"),
     ("siglip", "SiglipImageProcessor"), ("clip", "CLIPImageProcessor"), ("siglip2", "Siglip2ImageProcessor")],
)  # fmt: skip
def test_a_file_naming_no_type_takes_the_folder_s_model_type(model_type, name):
    assert hf_preprocess({}, "p", model_type) == DEFAULTS[name]
    legacy = {"feature_extractor_type": name.replace("ImageProcessor", "FeatureExtractor")}
    assert hf_preprocess(legacy, "p", "bert") == DEFAULTS[name]  # the v4 key wins over the model type


@pytest.mark.parametrize("model_type", ["clip_vision_model", "siglip_vision_model", "dinov2_with_registers"])
def test_a_model_type_transformers_maps_to_no_processor_is_refused_as_there(model_type):
    """AutoImageProcessor 5.24 finds no class for these without image_processor_type (tried)."""
    with pytest.raises(ValueError, match=f"no image_processor_type, and model_type='{model_type}' names none"):
        hf_preprocess({}, "p", model_type)


def test_size_forms_as_transformers_reads_them():
    def read(**keys):
        return hf_preprocess({"image_processor_type": "CLIPImageProcessor", **keys}, "p")

    assert read(size=256).resize_size == (256,)  # CLIP: default_to_square False, an int is the shorter side
    assert read(size=256, default_to_square=True).resize_size == (256, 256)
    assert read(size=[300, 200], do_center_crop=False).resize_size == (300, 200)
    assert read(crop_size=200).crop_size == (200, 200)  # crop sizes are always squared
    deit = hf_preprocess({"feature_extractor_type": "DeiTFeatureExtractor", "size": 256, "crop_size": 224}, "p")
    assert (deit.resize_size, deit.crop_size) == ((256, 256), (224, 224))  # DeiT squares an int size
    rescale = hf_preprocess({"image_processor_type": "ViTImageProcessor", "rescale_factor": 1 / 127.5}, "p")
    assert rescale.rescale_factor == 1 / 127.5
    off = hf_preprocess({"image_processor_type": "ViTImageProcessor", "do_rescale": False, "do_normalize": False}, "p")
    assert (off.rescale_factor, off.mean, off.std) == (1.0, (0.0,), (1.0,))
    assert read(crop_pct=0.5) == DEFAULTS["CLIPImageProcessor"]  # these classes do not read crop_pct


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"image_processor_type": "ConvNextImageProcessor"}, "image_processor_type='ConvNextImageProcessor'"),
        ({}, "no image_processor_type, and model_type=None"),
        ({"do_pad": True}, "do_pad=True"),
        ({"data_format": "channels_last"}, "data_format='channels_last'"),
        ({"resample": 4}, "resample=4"),
        ({"do_resize": False}, "do_resize=false"),
        ({"size": {"shortest_edge": 224, "longest_edge": 400}}, "size="),
        ({"size": {"max_height": 224, "max_width": 224}}, "size="),
        ({"size": {"shortest_edge": 224}}, "without a centre crop"),
        ({"do_center_crop": True}, "do_center_crop=true without crop_size"),
        ({"rescale_factor": 0}, "rescale_factor=0"),
        ({"use_square_size": True}, "'use_square_size': not a key"),
        ({"do_normalize": "yes"}, "do_normalize='yes'"),
    ],
)
def test_what_the_project_cannot_compute_is_refused_by_name(keys, named):
    config = {"image_processor_type": "ViTImageProcessor", **keys} if keys else {}
    with pytest.raises(ValueError, match=f"^f.json: cannot read the preprocessing .*{named}"):
        hf_preprocess(config, "f.json")


def test_a_naflex_processor_gives_a_patch_budget_for_the_model_s_patches():
    """Siglip2ImageProcessor (Fast, Pil: one file) reads max_num_patches and patch_size, no size; its patch
    size must be the model's; a budget is given only to a model that has one, and never with a resize."""
    saved = {"image_processor_type": "Siglip2ImageProcessor", "max_num_patches": 12, "patch_size": 8, "resample": 3}
    want = Preprocess((0.5,), (0.5,), "bicubic", max_patches=12)
    assert hf_preprocess(saved, "p", patch_size=8) == hf_preprocess(saved, "p", patch_size=(8, 8)) == want
    assert Preprocess.from_dict(json.loads(json.dumps(want.to_dict()))) == want
    for keys, named in (
        ({}, "patch_size=8: the model's patches are 16x16 pixels"),
        ({"size": {"height": 32, "width": 32}}, "'size': not a key the project reads for Siglip2ImageProcessor"),
        ({"max_num_patches": 0}, "max_num_patches=0: expected a positive integer"),
    ):
        with pytest.raises(ValueError, match=f"^p: cannot read the preprocessing .*{named}"):
            hf_preprocess(saved | keys, "p", patch_size=(16, 16) if not keys else 8)
    with pytest.raises(ValueError, match=r"max_patches=12 with resize_size=\[32, 32\], crop_pct=1.0"):
        want.replace(resize_size=(32, 32))
    assert with_overrides(ModelInfo(want, "declared: p"), {"max_patches": 64}, None).preprocess.max_patches == 64
    with pytest.raises(ValueError, match=r"max_patches=64 for a fixed-size model \(preprocessing declared: p\)"):
        with_overrides(ModelInfo(DEFAULTS["ViTImageProcessor"], "declared: p"), {"max_patches": 64}, None)
    # written: Siglip2ImageProcessor for a NaFlex folder; elsewhere the budget is left out, with a note
    config, notes = hf_preprocessor_config(want, (32, 32), 3, 8)
    assert config["image_processor_type"] == "Siglip2ImageProcessor" and notes == []
    assert hf_preprocess(config, "w", patch_size=8) == want
    config, notes = hf_preprocessor_config(want, (32, 32), 3)
    assert hf_preprocess(config, "w") == want.replace(max_patches=None, resize_size=(32, 32))
    assert notes == ["preprocessor_config.json: the NaFlex patch budget (max_patches=12) is left out; this "
                     "folder's model takes fixed-size images"]  # fmt: skip
    fixed, notes = timm_preprocess(want, (32, 32))
    assert fixed == want.replace(max_patches=None) and "budget (max_patches=12) is left out" in notes[0]


def test_a_transformers_geometry_is_one_preprocessing_field_set():
    pp = Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", crop_mode="center", rescale_factor=1.0,
                    resize_size=(256,), crop_size=(224, 224))  # fmt: skip
    assert Preprocess.from_dict(json.loads(json.dumps(pp.to_dict()))) == pp
    for bad, named in (
        (dict(resize_size=(256,), crop_pct=0.9, crop_mode="center"), "crop_pct 1 and crop_mode 'center'"),
        (dict(resize_size=(256, 256), crop_mode="center"), "crop_mode 'squash'"),
        (dict(crop_size=(224, 224)), "without resize_size"),
        (dict(resize_size=(0, 3)), r"resize_size=\[0, 3\]"),
        (dict(rescale_factor=-1.0), "rescale_factor=-1.0"),
    ):
        with pytest.raises(ValueError, match=named):
            Preprocess(**bad)


def test_a_crop_pct_given_over_a_transformers_geometry_asks_for_timm_s_rule():
    info = ModelInfo(DEFAULTS["DeiTImageProcessor"], "declared: p")
    given = with_overrides(info, {"crop_pct": 0.9, "crop_mode": "center"}, None).preprocess
    assert given == DEFAULTS["DeiTImageProcessor"].replace(
        resize_size=None, crop_size=None, crop_pct=0.9, crop_mode="center"
    )
    assert with_overrides(info, {"interpolation": "bilinear"}, None).preprocess.resize_size == (256, 256)


def test_the_crop_sits_at_the_floor_of_the_margin_and_pads_with_zeros():
    """A 4x7 (W x H) image: the shorter side is already 4, the 4x4 crop starts at row floor(3 / 2) = 1
    (timm's round would start at 2); a 6x6 crop of a 4x4 image starts at floor(-2 / 2) = -1: one zero row
    and column on each side."""
    image = np.arange(28, dtype=np.uint8).reshape(7, 4)
    pp = Preprocess(interpolation="nearest", crop_mode="center", resize_size=(4,), crop_size=(4, 4))
    np.testing.assert_array_equal(np.asarray(eval_resize_crop(from_array(image), 4, pp)), image[1:5])
    timm = Preprocess(interpolation="nearest", crop_mode="center")
    np.testing.assert_array_equal(np.asarray(eval_resize_crop(from_array(image), 4, timm)), image[2:6])
    pad = Preprocess(interpolation="nearest", crop_mode="center", resize_size=(4,), crop_size=(6, 6))
    want = np.zeros((6, 6), np.uint8)
    want[1:5, 1:5] = image[:4]
    np.testing.assert_array_equal(np.asarray(eval_resize_crop(from_array(image[:4]), 6, pad)), want)
    with pytest.raises(ValueError, match="gives 6x6 images; the model takes 8x8"):
        eval_resize_crop(from_array(image), 8, pad)


def test_rescale_factor_scales_before_mean_and_std():
    x = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    raw = Preprocess((127.5,), (127.5,), rescale_factor=1.0)  # do_rescale false: 0..255 normalised
    np.testing.assert_array_equal(normalize(x, raw), (x.astype(np.float32) - 127.5) / np.float32(127.5))
    odd = Preprocess((0.1,), (0.7,), rescale_factor=0.0039215689)  # no float32 divisor matches: a table
    want = ((x.astype(np.float64) * 0.0039215689).astype(np.float32) - np.float32(0.1)) / np.float32(0.7)
    np.testing.assert_array_equal(normalize(x, odd), want)
    np.testing.assert_array_equal(normalize(x.astype(np.float32), odd), want)


def test_a_geometry_scales_to_a_new_model_size():
    pp = DEFAULTS["DeiTImageProcessor"]
    assert pp.at_size(224) == pp
    assert (pp.at_size(448).resize_size, pp.at_size(448).crop_size) == ((512, 512), (448, 448))
    edge = DEFAULTS["CLIPImageProcessor"].at_size((336, 336))
    assert (edge.resize_size, edge.crop_size) == ((336,), (336, 336))
    assert Preprocess().at_size(64) == Preprocess()  # timm's rule is relative already


def test_the_written_config_states_every_key_and_reads_back_equal():
    for pp in DEFAULTS.values():
        config, notes = hf_preprocessor_config(pp, (224, 224), 3, 16)
        assert hf_preprocess(config, "w", patch_size=16) == pp and notes == []
        assert pp.max_patches or set(config) - {"crop_size"} == set(
            hf_preprocessor_config(DEFAULTS["ViTImageProcessor"], (224, 224), 3)[0]
        )
    config, notes = hf_preprocessor_config(Preprocess(crop_pct=0.875, crop_mode="center"), (224, 224), 3)
    assert config["size"] == {"shortest_edge": 256} and "floors the crop offset" in notes[0]
    config, notes = hf_preprocessor_config(Preprocess(crop_pct=0.9), (224, 224), 3)  # 248 - 224 = 24: same
    assert config["size"] == {"height": 248, "width": 248} and notes == []
    _, notes = hf_preprocessor_config(Preprocess(crop_pct=0.95), (221, 221), 3)  # 232 - 221 = 11 = 3 mod 4
    assert "one pixel before timm's" in notes[0]
    with pytest.raises(ValueError, match="ResizeKeepRatio"):
        hf_preprocessor_config(Preprocess(crop_mode="center"), (224, 320), 3)
    with pytest.raises(ValueError, match=r"gives \[256, 256\] images; the model takes 224x224"):
        hf_preprocessor_config(Preprocess(resize_size=(256, 256)), (224, 224), 3)


def test_a_timm_hub_folder_takes_a_transformers_geometry_as_crop_pct():
    pp, notes = timm_preprocess(DEFAULTS["DeiTImageProcessor"], (224, 224))
    assert (pp.crop_pct, pp.crop_mode, pp.resize_size) == (0.875, "squash", None) and "timm rounds" in notes[0]
    assert timm_preprocess(Preprocess(), (224, 224)) == (Preprocess(), [])
    pp, notes = timm_preprocess(DEFAULTS["DINOv3ViTImageProcessor"], (224, 224))
    assert not pp.rescale_before_resize and "resizes uint8 pixels" in notes[0] and len(notes) == 2
    with pytest.raises(ValueError, match="rescale_factor=1.0: timm"):
        timm_preprocess(Preprocess(rescale_factor=1.0), (224, 224))
