"""Preprocessing a transformers folder does not state (no preprocessor_config.json, as ``save_pretrained``
writes a model) travels through ``vit convert`` marked assumed: our .safetensors and orbax keep its
values and the mark, so ``vit predict`` on the converted file equals predict on the source; HF folders
get it only when accepted. Tiny models built by transformers, nothing downloaded."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from vit_cli.main import main
from vit_common.checkpoints.convert import convert, load_checkpoint

_VISION = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=1, image_size=32)
_TEXT = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_hidden_layers=1, vocab_size=64)

# One model of each family whose folder leaves its preprocessing to its image processor's defaults.
FAMILIES = {
    "vit": lambda: transformers.ViTForImageClassification(
        transformers.ViTConfig(**_VISION, patch_size=8, num_labels=3)
    ),
    "clip": lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**_VISION, patch_size=8)),
    "siglip": lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**_VISION, patch_size=8)),
    "dinov2": lambda: transformers.Dinov2Model(transformers.Dinov2Config(**_VISION, patch_size=8)),
    "aimv2": lambda: transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**_VISION, patch_size=8)),
    "siglip2": lambda: transformers.Siglip2ForImageClassification(
        transformers.Siglip2Config(
            vision_config={**_VISION, "patch_size": 8, "num_patches": 16}, text_config=_TEXT, num_labels=3
        )
    ),
}


def _folder(tmp_path, family: str):
    torch.manual_seed(0)
    FAMILIES[family]().save_pretrained(tmp_path / family)
    assert not (tmp_path / family / "preprocessor_config.json").exists()
    return tmp_path / family


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_assumed_preprocessing_is_kept_marked_assumed_in_our_files(tmp_path, family):
    """Converted to our .safetensors, a folder without preprocessor_config.json reads back with the
    source's preprocessing (values and why it was assumed) and the source's warning."""
    src = _folder(tmp_path, family)
    source = load_checkpoint(src).info
    assert source.preprocess_source.startswith("assumed: ")
    convert(src, tmp_path / "o.safetensors")
    back = load_checkpoint(tmp_path / "o.safetensors").info
    assert (back.preprocess, back.preprocess_source, back.warnings) == (
        source.preprocess,
        source.preprocess_source,
        source.warnings,
    )


def test_timm_files_keep_it_marked_and_timm_hub_folders_state_it_only_when_accepted(tmp_path):
    """A ViT folder without preprocessor_config.json written as a timm .safetensors file reads back with
    the source's preprocessing, marked assumed; as a timm hub folder it is left out with a warning, and
    written into pretrained_cfg with --accept-assumed preprocess."""
    from vit_torch.formats import READERS, WRITERS

    torch.manual_seed(0)
    config = transformers.ViTConfig(**_VISION, patch_size=8, num_labels=3, layer_norm_eps=1e-6)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    source = load_checkpoint(tmp_path / "vit").info
    io = dict(to_fmt="timm", readers=READERS, writers=WRITERS)
    convert(tmp_path / "vit", tmp_path / "t.safetensors", **io)
    back = load_checkpoint(tmp_path / "t.safetensors", readers=READERS).info
    assert (back.preprocess, back.preprocess_source) == (source.preprocess, source.preprocess_source)
    report = convert(tmp_path / "vit", tmp_path / "hub", **io)
    assert any("not written (their readers assume their own)" in w for w in report.warnings)
    assert "mean" not in json.loads((tmp_path / "hub" / "config.json").read_text())["pretrained_cfg"]
    convert(tmp_path / "vit", tmp_path / "hub2", accept_assumed=("preprocess",), **io)
    pretrained = json.loads((tmp_path / "hub2" / "config.json").read_text())["pretrained_cfg"]
    assert (pretrained["mean"], pretrained["std"]) == ([0.5] * 3, [0.5] * 3)


def _predict(path, images, capsys, framework: str = "torch") -> list[dict]:
    capsys.readouterr()
    assert main(["predict", str(path), *map(str, images), "--framework", framework, "--top-k", "3", "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.slow
def test_a_siglip2_classifier_predicts_the_same_after_convert(tmp_path, capsys):
    """The new-user case: a ``Siglip2ForImageClassification`` folder from ``save_pretrained`` (assumed
    budget of 256 patches, mean/std 0.5) converted to canonical and orbax: ``vit info`` says the
    preprocessing is assumed, ``vit predict`` gives the source's top-3 and probabilities exactly (the
    orbax folder in the JAX twin, which reads it). An HF
    folder written from it holds no preprocessor_config.json (a warning says so) unless the assumption
    is accepted, then transformers' Siglip2ImageProcessor with the budget."""
    src = _folder(tmp_path, "siglip2")
    rng = np.random.default_rng(0)
    images = [tmp_path / f"{i}.png" for i in range(3)]
    for i, (h, w) in enumerate([(40, 96), (64, 64), (120, 30)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images[i])
    expected = {framework: _predict(src, images, capsys, framework) for framework in ("torch", "jax")}
    for dst, fmt, framework in (("o3.safetensors", "canonical", "torch"), ("orbax", "orbax", "jax")):
        assert main(["convert", str(src), str(tmp_path / dst), "--to", fmt]) == 0
        assert main(["info", str(tmp_path / dst)]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if "preprocessing" in x)
        assert "(assumed: no preprocessor_config.json; transformers Siglip2ImageProcessor defaults)" in line
        assert _predict(tmp_path / dst, images, capsys, framework) == expected[framework]
    assert main(["convert", str(src), str(tmp_path / "hf"), "--to", "hf_family"]) == 0
    assert "not written (their readers assume their own); write it with --accept-assumed preprocess" in (
        capsys.readouterr().out
    )
    assert not (tmp_path / "hf" / "preprocessor_config.json").exists()
    argv = ["convert", str(src), str(tmp_path / "hf2"), "--to", "hf_family", "--accept-assumed", "preprocess"]
    assert main(argv) == 0
    processor = json.loads((tmp_path / "hf2" / "preprocessor_config.json").read_text())
    assert (processor["image_processor_type"], processor["max_num_patches"]) == ("Siglip2ImageProcessor", 256)
