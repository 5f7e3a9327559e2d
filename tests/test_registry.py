"""The registry holds each format whole: every answer that depends on a format comes from its object
(write options and their flags, export names, reference libraries, what files declare, the detection
error), and a command opens its source once."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import vit_common.checkpoints.formats.source as source_module
from vit_cli.main import main
from vit_common.checkpoints import REGISTRY, load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf import HfWriteOptions
from vit_common.checkpoints.formats.npz import NpzWriteOptions
from vit_common.data.images import PRESETS, Preprocess
from vit_common.state import random_state
from vit_common.system.io import save_safetensors


def test_each_format_answers_its_own_questions(tmp_path):
    """The answers that used to be tables keyed by format name elsewhere (vit train's export names,
    vit_torch.oracles' library switch, metadata.py's assumed preprocessing), as the formats give them."""
    exports = {f.name: f.export_name() for f in REGISTRY.values()}
    assert exports == {
        "orbax": "model_orbax",
        "canonical": "model.safetensors",
        "hf": "model_hf",
        "hf_family": "model_hf_family",
        "eva_original": "model_eva_original",
        "hf_dinov3": "model_hf_dinov3",
        "dinov3_original": "model_dinov3_original.pth",
        "timm": "model_timm.safetensors",
        "original_vit": "model_original_vit.npz",
        "big_vision": "model_big_vision.npz",
    }
    assert REGISTRY["timm"].export_name(Path("in/w.pth")) == "model_timm.pth"
    assert REGISTRY["timm"].export_name(Path("in/w.safetensors")) == "model_timm.safetensors"
    assert REGISTRY["timm"].export_name(tmp_path) == "model_timm"  # a timm hub folder: a hub folder
    assert REGISTRY["timm"].export_name(Path("hf-hub:timm/vit_base_patch16_224.augreg_in1k")) == "model_timm"
    references = {n: (f.reference.library, f.reference.loader) if f.reference else None for n, f in REGISTRY.items()}
    assert references == {
        "orbax": None,
        "canonical": None,
        "hf": ("transformers", "from_pretrained"),
        "hf_family": ("transformers", "from_pretrained"),
        "eva_original": ("timm", "state_dict"),
        "hf_dinov3": ("transformers", "from_pretrained"),
        "dinov3_original": None,
        "timm": ("timm", "state_dict"),
        "original_vit": ("timm", "npz"),
        "big_vision": ("timm", "npz"),
    }
    assumed = {n: f.assumed_preprocess for n, f in REGISTRY.items()}
    assert assumed == {
        "orbax": Preprocess(),
        "canonical": Preprocess(),
        "hf": PRESETS["hf_vit"],
        "hf_family": PRESETS["hf_vit"],
        "eva_original": REGISTRY["eva_original"].assumed_preprocess,
        "hf_dinov3": Preprocess(
            PRESETS["imagenet"].mean, PRESETS["imagenet"].std, "bilinear", 1.0, "squash", rescale_before_resize=True
        ),  # DINOv3ViTImageProcessor's defaults: it rescales, then resizes floats
        "dinov3_original": Preprocess(PRESETS["imagenet"].mean, PRESETS["imagenet"].std, "bilinear", 1.0, "squash"),
        "timm": PRESETS["imagenet"],
        "original_vit": PRESETS["big_vision"],
        "big_vision": PRESETS["big_vision"],
    }
    for f in REGISTRY.values():
        assert f.signature and f.assumed_why, f.name
        for field in dataclasses.fields(f.write_options):
            assert field.metadata["flag"].startswith("--") and field.metadata["help"], (f.name, field.name)


def test_the_detection_error_names_every_registered_format(tmp_path):
    save_safetensors(tmp_path / "x.safetensors", {"something.else": np.zeros(3, np.float32)})
    with pytest.raises(FormatError, match="match none of the formats") as e:
        load_checkpoint(tmp_path / "x.safetensors")
    for f in REGISTRY.values():
        assert f"{f.name} ({f.signature})" in str(e.value)


def test_the_hf_format_knows_every_hf_family_model_type():
    """hf refuses the hf_family format's model types with a pointer to it and --hf-model-type offers the
    written ones, both from hf_common's list: it names the family modules' model types, in their order."""
    from vit_common.checkpoints.formats.hf_common import FAMILY_MODEL_TYPES
    from vit_common.checkpoints.formats.hf_families import FAMILIES

    assert FAMILY_MODEL_TYPES == tuple(FAMILIES)


def test_write_options_are_typed_per_format(tmp_path, tiny_cfg):
    save_checkpoint(tmp_path / "v5", tiny_cfg, random_state(tiny_cfg), "hf", options=HfWriteOptions("v5"))
    from safetensors.numpy import load_file

    assert any(".layers.0.attention.q_proj." in k for k in load_file(tmp_path / "v5" / "model.safetensors"))
    with pytest.raises(ValueError, match="NpzWriteOptions are not the hf format's options"):
        save_checkpoint(tmp_path / "x", tiny_cfg, random_state(tiny_cfg), "hf", options=NpzWriteOptions(scan=True))
    assert not (tmp_path / "x").exists()


def test_convert_flags_come_from_the_write_options(tmp_path, capsys, tiny_cfg):
    """--hf-spelling, --npz-prefix and --scan are generated from the dataclasses; one that belongs to
    another format than the output's is refused before anything is read or written."""
    save_checkpoint(tmp_path / "m.safetensors", tiny_cfg, random_state(tiny_cfg), "canonical")
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "b.npz"), "--scan"]) == 0
    assert load_checkpoint(tmp_path / "b.npz").report.layout.count("scan-stacked") == 1
    capsys.readouterr()
    argv = ["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "h"), "--to", "hf", "--npz-prefix", "params/"]
    assert main(argv) == 2
    assert (
        "vit convert: error: --npz-prefix: an option of original_vit / big_vision files, but the output format is hf"
        in (capsys.readouterr().err)
    )
    assert not (tmp_path / "h").exists()


@pytest.fixture
def opens(monkeypatch):
    """{'sniff': n, 'tensors': n}: how often the checkpoint file's container is sniffed (Python ``open``
    of the path outside the tensor read) and its tensors or metadata read (``safe_open``, which checks
    the header before ``read_safetensors`` maps the file)."""
    counts = {"sniff": 0, "tensors": 0, "path": None, "reading": False}
    real, real_read = source_module.safe_open, source_module.read_safetensors

    def counting_safe_open(path, *args, **kwargs):
        if str(path) == counts["path"]:
            counts["tensors"] += 1
        return real(path, *args, **kwargs)

    def reading(path):
        counts["reading"] = True
        try:
            return real_read(path)
        finally:
            counts["reading"] = False

    def hook(event, args):
        if event == "open" and counts["path"] is not None and str(args[0]) == counts["path"] and not counts["reading"]:
            counts["sniff"] += 1

    import safetensors

    monkeypatch.setattr(source_module, "read_safetensors", reading)
    monkeypatch.setattr(source_module, "safe_open", counting_safe_open)
    monkeypatch.setattr(safetensors, "safe_open", counting_safe_open)
    sys.addaudithook(hook)
    yield counts
    counts["path"] = None  # an audit hook cannot be removed: it stops counting


@pytest.mark.slow
@pytest.mark.parametrize("command", ["convert", "info", "predict"])
def test_a_command_opens_its_source_once(command, tmp_path, opens, tiny_cfg):
    from PIL import Image

    path = tmp_path / "m.safetensors"
    save_checkpoint(
        path, tiny_cfg, random_state(tiny_cfg), "canonical", preprocess=PRESETS["imagenet"], classes=["a", "b", "c"]
    )
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "x.png")
    argv = {
        "convert": ["convert", str(path), str(tmp_path / "t.safetensors"), "--to", "timm"],
        "info": ["info", str(path)],
        "predict": ["predict", str(path), str(tmp_path / "x.png")],
    }[command]
    opens["path"] = str(path)
    assert main(argv) == 0
    assert (opens["sniff"], opens["tensors"]) == (1, 1), opens
