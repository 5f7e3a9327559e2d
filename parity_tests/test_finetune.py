"""`vit train --init`: fine-tuning checkpoints of other formats on real images, handing the model back in
the format it came in, checked by the library that defines that format.

The demonstration (docs/training.md, Fine-tuning): the demo model pretrained on mnist5k and exported as a timm file,
then fine-tuned on scikit-learn's digits (a different dataset: 8x8 scans, resized) beats the same model
trained from scratch for the same number of steps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vit_cli.main import main
from vit_common.checkpoints.convert import save_checkpoint
from vit_common.checkpoints.formats.source import read_safetensors
from vit_common.config import ViTConfig
from vit_common.state import random_state


def test_accuracy(run: Path) -> float:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "test_accuracy" in r][-1]["test_accuracy"]


test_accuracy.__test__ = False  # a helper, not a test


@pytest.mark.slow
def test_fine_tuning_the_demo_s_timm_export_on_digits_beats_training_from_scratch(tmp_path, capsys):
    pre, ft, scratch = tmp_path / "pre", tmp_path / "ft", tmp_path / "scratch"
    short = ["--epochs", "2", "--batch-size", "64", "--warmup-steps", "10"]  # the manual's run: 5 epochs, batch 128
    assert main(["train", *short, "--out", str(pre), "--no-progress", "--no-parity"]) == 0
    timm_file = pre / "model_timm.safetensors"
    common = ["train", "--dataset", "digits", "--epochs", "3", "--batch-size", "64", "--warmup-steps", "5"]
    common += ["--lr", "1e-3", "--no-progress"]
    assert main([*common, "--init", str(timm_file), "--out", str(ft)]) == 0
    # the timm export is model.safetensors' own bytes (a hard link: one copy on disk), so it reads as ours:
    # it carries its config, and nothing about the model is assumed
    err = capsys.readouterr().err
    assert "format   canonical" in err and re.search(r"num_heads += 4 +declared", err) and "<- assumed" not in err
    assert "declared: " + str(timm_file) + " metadata" in err  # [-1, 1] as pretrained, recorded in the file
    assert main([*common, "--out", str(scratch), "--no-parity"]) == 0
    fine, fresh = test_accuracy(ft), test_accuracy(scratch)
    assert fine >= fresh + 0.1, (fine, fresh)
    parity = json.loads((ft / "parity.json").read_text())
    assert parity["ok"] and parity["agreement"] == 1.0
    lib = parity["library"]["timm"]
    assert lib["library"].startswith("timm") and lib["ok"] and lib["images"] == 359, lib
    config = json.loads((ft / "config.json").read_text())
    assert config["train"]["init"] == str(timm_file) and config["preprocess"]["mean"] == [0.5]
    _, meta = read_safetensors(ft / "model_timm.safetensors")
    assert json.loads(meta["classes"]) == [str(k) for k in range(10)]


def _hf_folder(path: Path) -> Path:
    """A transformers-written ViTForImageClassification folder (random weights, 5 named labels) with the
    image processor that goes with it (16x16, ImageNet mean/std, bicubic)."""
    import transformers

    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=16,
        patch_size=8,
        id2label={i: f"thing{i}" for i in range(5)},
        label2id={f"thing{i}": i for i in range(5)},
    )
    transformers.ViTForImageClassification(config).save_pretrained(path)
    processor = transformers.ViTImageProcessor(
        size={"height": 16, "width": 16}, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225], resample=3
    )
    processor.save_pretrained(path)
    return path


def _big_vision_file(path: Path) -> Path:
    cfg = ViTConfig(
        image_size=16,
        patch_size=8,
        width=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
        num_classes=5,
        gelu="tanh",
        pool="gap",
        class_token=False,
        posemb_prefix=False,
    )
    save_checkpoint(path, cfg, random_state(cfg, scale=0.1), "big_vision")
    return path


def _timm_hub_folder(path: Path) -> Path:
    """A timm hub folder (timm's save_for_hf) of vit_base_patch16_clip_224 at test width, 16 px, 5 classes:
    its name implies LayerNorm eps 1e-5 and pre_norm, its pretrained_cfg CLIP's mean/std."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_base_patch16_clip_224", pretrained=False, embed_dim=32, depth=1, num_heads=2, img_size=16, num_classes=5
    )
    timm.models.save_for_hf(model, path, safe_serialization=True)
    return path


SOURCES = {"hf": _hf_folder, "big_vision": lambda p: _big_vision_file(p.with_suffix(".npz")), "timm": _timm_hub_folder}


@pytest.mark.parametrize(  # 15, 16 and 26 s alone: the fast loop runs hf
    "fmt", ["hf", pytest.param("big_vision", marks=pytest.mark.slow), pytest.param("timm", marks=pytest.mark.slow)]
)
def test_fine_tuning_hands_back_the_checkpoint_s_format_checked_by_its_library(tmp_path, capsys, fmt, image_folder):
    src = SOURCES[fmt](tmp_path / "src")
    data = image_folder(tmp_path / "imgs", ("ant", "bee", "cat"), n=6, size=(20, 24), band=True)
    out = tmp_path / "run"
    args = ["train", "--dataset", f"imagefolder:{data}", "--init", str(src), "--out", str(out), "--no-progress"]
    args += ["--image-size", "24"] if fmt == "hf" else ["--image-size", "32"] if fmt == "timm" else []
    args += ["--accept-assumed", "all"] if fmt == "big_vision" else []  # an .npz states no GELU or eps
    assert main([*args, "--epochs", "2", "--batch-size", "6", "--warmup-steps", "1", "--val-fraction", "0.34"]) == 0
    err = capsys.readouterr().err
    assert "new 3-class head, zero-initialised" in err
    parity = json.loads((out / "parity.json").read_text())
    lib = parity["library"][fmt]
    assert parity["ok"] and lib["ok"] and lib["agreement"] == 1.0, parity
    if fmt == "hf":
        import transformers

        assert lib["library"].startswith("transformers")
        config = json.loads((out / "model_hf" / "config.json").read_text())
        assert config["id2label"] == {"0": "ant", "1": "bee", "2": "cat"} and config["image_size"] == 24
        assert "pos_embed grid 2x2 -> 3x3 with bicubic" in err
        assert "preprocessing scaled to 24x24: resize_size [24, 24]" in err  # the processor's 16x16 squash
        processor = transformers.AutoImageProcessor.from_pretrained(out / "model_hf")
        assert list(processor.image_mean) == [0.485, 0.456, 0.406] and processor.resample == 3  # as it came in
        assert "declared: " in err and "preprocessor_config.json" in err
    elif fmt == "timm":  # a hub folder back, loaded by timm from its own config.json, nothing assumed
        import timm

        assert lib["library"].startswith("timm") and "<- assumed" not in err
        model = timm.create_model(f"local-dir:{out / 'model_timm'}", pretrained=True)
        assert model.num_classes == 3 and model.patch_embed.img_size == (32, 32) and model.norm_pre.eps == 1e-5
        assert model.pretrained_cfg["label_names"] == ["ant", "bee", "cat"]
        assert "declared: " + str(src / "config.json") + " pretrained_cfg" in err
    else:
        assert lib["library"].endswith("(.npz loader)")
        assert (out / "model_big_vision.npz").is_file()
        assert "assumed: big_vision value_range(-1, 1)" in err  # an .npz says nothing: said, not hidden


@pytest.mark.slow  # a training run and timm's parity: 20 s of CPU each
@pytest.mark.parametrize("name", ["vit_base_patch16_dinov3_qkvb", "eva02_base_patch14_224"])
def test_fine_tuning_a_rope_backbone_hands_back_timm_s_eva(tmp_path, capsys, name, image_folder):
    """A timm hub folder of a RoPE backbone (timm's Eva; eva02_base with split q/k/v) fine-tuned with a new
    head: exported as a hub folder of the same Eva name and q/k/v spelling, which timm loads from its own
    config.json and runs as our twin does (the run's parity report)."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model(
        name, pretrained=False, embed_dim=32, depth=1, num_heads=2, img_size=16, patch_size=8, num_classes=5
    )
    timm.models.save_for_hf(model, tmp_path / "src", safe_serialization=True)
    data = image_folder(tmp_path / "imgs", ("ant", "bee", "cat"), n=6, size=(20, 24), band=True)
    out = tmp_path / "run"
    args = ["train", "--dataset", f"imagefolder:{data}", "--init", str(tmp_path / "src"), "--out", str(out)]
    args += ["--no-progress", "--epochs", "1", "--batch-size", "6", "--warmup-steps", "1", "--val-fraction", "0.34"]
    assert main(args) == 0
    assert "new 3-class head, zero-initialised" in capsys.readouterr().err
    parity = json.loads((out / "parity.json").read_text())
    assert parity["ok"] and parity["library"]["timm"]["ok"] and parity["library"]["timm"]["agreement"] == 1.0, parity
    config = json.loads((out / "model_timm" / "config.json").read_text())
    assert config["architecture"] == name
    back = timm.create_model(f"local-dir:{out / 'model_timm'}", pretrained=True)
    assert type(back).__name__ == "Eva" and back.num_classes == 3
    split = name.startswith("eva02_base")
    assert ("blocks.0.attn.q_proj.weight" in back.state_dict()) == split
