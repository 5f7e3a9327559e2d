"""Preprocessing and class names of checkpoints: declared where the file says, assumed (and warned)
where it does not, written by our writers so that they read back declared, and read by transformers."""

from __future__ import annotations

import json

import pytest

from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.metadata import hf_preprocess, with_overrides
from vit_common.config import ViTConfig
from vit_common.data.images import IMAGENET_MEAN, PRESETS, Preprocess
from vit_common.state import random_state

CFG = ViTConfig(image_size=32, patch_size=8, width=64, depth=2, num_heads=4, mlp_dim=128, num_classes=3)


def test_our_files_declare_what_they_were_trained_with(tmp_path):
    pp = Preprocess(IMAGENET_MEAN, (0.2, 0.3, 0.4), "bicubic", 0.875, "center")
    # transformers' processors state sizes in pixels: the shorter side to floor(32 / 0.875), a 32x32 crop
    hf_pp = Preprocess(IMAGENET_MEAN, (0.2, 0.3, 0.4), "bicubic", 1.0, "center", resize_size=(36,), crop_size=(32, 32))
    for fmt, name, want in (("canonical", "m.safetensors", pp), ("timm", "t.safetensors", pp), ("hf", "hf", hf_pp)):
        save_checkpoint(tmp_path / name, CFG, random_state(CFG), fmt, preprocess=pp, classes=["cat", "dog", "emu"])
        info = load_checkpoint(tmp_path / name, num_heads=4).info
        assert info.preprocess == want and info.preprocess_source.startswith("declared"), (fmt, info)
        assert info.classes == ("cat", "dog", "emu") and not info.warnings, (fmt, info)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["id2label"] == {"0": "cat", "1": "dog", "2": "emu"} and config["label2id"]["emu"] == 2


def test_files_that_say_nothing_get_the_format_s_usual_choice_and_a_warning(tmp_path):
    save_checkpoint(tmp_path / "t.safetensors", CFG, random_state(CFG), "timm")
    info = load_checkpoint(tmp_path / "t.safetensors", num_heads=4).info
    assert info.preprocess == PRESETS["imagenet"] and info.preprocess_source.startswith("assumed")
    assert info.classes is None and "--mean/--std" in info.warnings[0]
    save_checkpoint(tmp_path / "hf", CFG, random_state(CFG), "hf")  # LABEL_i placeholders are no names
    info = load_checkpoint(tmp_path / "hf").info
    assert info.preprocess == PRESETS["hf_vit"] and info.classes is None and info.warnings
    save_checkpoint(tmp_path / "b.npz", CFG, random_state(CFG), "big_vision")
    assert load_checkpoint(tmp_path / "b.npz").info.preprocess == PRESETS["big_vision"]
    given = with_overrides(info, {"mean": (0.5,), "std": (0.5,), "crop_pct": None}, ["a", "b", "c"])
    assert given.preprocess.mean == (0.5,) and given.preprocess_source.startswith("given (mean, std)")
    assert given.classes == ("a", "b", "c") and not given.warnings


def test_transformers_reads_our_hf_folder_preprocessing_and_we_read_its(tmp_path):
    """Our preprocessor_config.json builds the processor that does the same; a DeiT-style processor that
    transformers writes reads back as resize 256 + centre crop 224 (crop_pct 0.875)."""
    from transformers import AutoImageProcessor, DeiTImageProcessor, ViTImageProcessor

    save_checkpoint(
        tmp_path / "hf", CFG, random_state(CFG), "hf", preprocess=PRESETS["hf_vit"], classes=["a", "b", "c"]
    )
    proc = AutoImageProcessor.from_pretrained(tmp_path / "hf")
    assert type(proc).__name__.startswith("ViTImageProcessor")
    assert proc.size == {"height": 32, "width": 32} and list(proc.image_mean) == [0.5] * 3
    ViTImageProcessor(image_mean=[0.1, 0.2, 0.3], image_std=[1, 1, 1], resample=3).save_pretrained(tmp_path / "v")
    assert hf_preprocess(json.loads((tmp_path / "v" / "preprocessor_config.json").read_text()), "v") == Preprocess(
        (0.1, 0.2, 0.3), (1.0, 1.0, 1.0), "bicubic", 1.0, "squash", resize_size=(224, 224)
    )
    DeiTImageProcessor().save_pretrained(tmp_path / "d")
    deit = hf_preprocess(json.loads((tmp_path / "d" / "preprocessor_config.json").read_text()), "d")
    assert (deit.resize_size, deit.crop_size, deit.crop_mode, deit.interpolation) == (
        (256, 256),
        (224, 224),
        "squash",
        "bicubic",
    )
    ViTImageProcessor(do_rescale=False, rescale_factor=0.5).save_pretrained(tmp_path / "r")
    assert hf_preprocess(json.loads((tmp_path / "r" / "preprocessor_config.json").read_text()), "r").rescale_factor == 1
    with pytest.raises(ValueError, match="x: cannot read the preprocessing .*do_pad=True"):
        hf_preprocess({"image_processor_type": "ViTImageProcessor", "do_pad": True}, "x")


def test_malformed_declarations_are_errors_naming_the_file(tmp_path):
    from vit_common.checkpoints.formats.canonical import save_canonical

    save_canonical(
        tmp_path / "m.safetensors", CFG, random_state(CFG), {"preprocess": json.dumps({"mean": [0.5], "std": [0]})}
    )
    with pytest.raises(ValueError, match="m.safetensors metadata: the stored preprocessing"):
        load_checkpoint(tmp_path / "m.safetensors")
    save_canonical(tmp_path / "c.safetensors", CFG, random_state(CFG), {"classes": json.dumps([1, 2, 3])})
    with pytest.raises(ValueError, match="is not a list of strings"):
        load_checkpoint(tmp_path / "c.safetensors")


def test_convert_carries_what_the_source_declares(tmp_path):
    """HF folder -> our file -> timm file: the processor's preprocessing and the label names survive;
    a new head drops the names; a timm file's assumed preprocessing is not written as a declaration."""
    from vit_common.checkpoints.convert import convert

    pp = Preprocess(IMAGENET_MEAN, (0.2, 0.3, 0.4), "bicubic", 1.0, "squash")
    save_checkpoint(tmp_path / "hf", CFG, random_state(CFG), "hf", preprocess=pp, classes=["x", "y", "z"])
    convert(tmp_path / "hf", tmp_path / "m.safetensors")
    convert(tmp_path / "m.safetensors", tmp_path / "t.safetensors", to_fmt="timm")
    info = load_checkpoint(tmp_path / "t.safetensors", num_heads=4).info
    assert info.preprocess == pp.replace(resize_size=(32, 32)) and info.classes == ("x", "y", "z")
    convert(tmp_path / "m.safetensors", tmp_path / "k5.safetensors", num_classes=5)
    assert load_checkpoint(tmp_path / "k5.safetensors").info.classes is None
    save_checkpoint(tmp_path / "plain.safetensors", CFG, random_state(CFG), "timm")
    convert(tmp_path / "plain.safetensors", tmp_path / "ours.safetensors", num_heads=4)
    assert load_checkpoint(tmp_path / "ours.safetensors").info.preprocess_source.startswith("assumed")
