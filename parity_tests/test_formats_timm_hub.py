"""timm hub folders (what timm's save_for_hf / push_to_hub write: config.json + model.safetensors) into both
twins, timm as the oracle, random weights at test width: the config is declared by the model timm builds
from the folder (nothing assumed), or, without timm, by what config.json states (the rest assumed and
warned); pretrained_cfg declares the preprocessing; hub ids resolve to such folders in the cache."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import timm
import torch

from vit_cli.main import main
from vit_common.checkpoints.convert import convert, load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.provenance import DECLARED
from vit_common.checkpoints.formats.timm import TimmWriteOptions
from vit_common.checkpoints.formats.timm_names import timm_version
from vit_common.data.images import Preprocess
from vit_common.tolerance import compare
from vit_jax.formats import READERS as JAX_READERS
from vit_torch import from_numpy, load_model
from vit_torch.formats import READERS

# vit_base_patch16_clip_224 at test width: timm's CLIP name implies pre_norm and LayerNorm eps 1e-5.
CLIP_TINY = dict(embed_dim=32, depth=2, num_heads=2, img_size=64, num_classes=7)
CLIP_PRE = Preprocess(
    (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711), "bicubic", 0.95, "center"
)


def _hub_folder(path, name: str, perturb, **kwargs):
    """timm.create_model(name, **kwargs) with perturbed random weights, saved by timm's save_for_hf."""
    torch.manual_seed(0)
    model = perturb(timm.create_model(name, pretrained=False, **kwargs)).eval()
    timm.models.save_for_hf(model, path, safe_serialization=True)
    return model


def _logits(model, x):
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


@pytest.mark.slow
def test_a_clip_hub_folder_loads_with_nothing_assumed(tmp_path, perturb, images, assert_twins_match):
    tm = _hub_folder(tmp_path / "clip", "vit_base_patch16_clip_224", perturb, **CLIP_TINY)
    ckpt = load_checkpoint(tmp_path / "clip", readers=READERS, strict=True)
    assert ckpt.report.format == "timm" and "architecture vit_base_patch16_clip_224" in ckpt.report.layout
    assert ckpt.report.assumed == [] and ckpt.report.warnings == []
    assert {o.kind for o in ckpt.report.provenance.values()} == {DECLARED}
    cfg = ckpt.cfg
    assert (cfg.ln_eps, cfg.norm_pre, cfg.patch_bias, cfg.num_heads, cfg.image_size) == (1e-5, True, False, 2, (64, 64))
    x = images(2, (64, 64))
    assert_twins_match(tmp_path / "clip", x, _logits(tm, x))
    assert timm.create_model(f"local-dir:{tmp_path / 'clip'}", pretrained=True).num_classes == 7  # timm's own read


@pytest.mark.slow
def test_the_jax_sides_child_process_reads_the_same_config(tmp_path, perturb):
    _hub_folder(tmp_path / "clip", "vit_base_patch16_clip_224", perturb, global_pool="avg", **CLIP_TINY)
    torch_side = load_checkpoint(tmp_path / "clip", readers=READERS, strict=True).cfg
    jax_side = load_checkpoint(tmp_path / "clip", readers=JAX_READERS, strict=True).cfg
    assert jax_side == torch_side and torch_side.pool == "gap" and torch_side.fc_norm


@pytest.mark.slow
def test_without_timm_the_architecture_table_declares_what_the_name_implies(tmp_path, perturb, images):
    """A JAX-only install (no timm): config.json states heads, pooling, size; the table of timm's
    architectures gives what vit_base_patch16_clip_224 implies (eps 1e-5, exact GELU): nothing assumed,
    and the model computes timm's logits. An architecture the table lacks leaves those assumed."""
    tm = _hub_folder(tmp_path / "clip", "vit_base_patch16_clip_224", perturb, **CLIP_TINY)
    for readers in ({}, {"timm": lambda folder: None}):  # no reader given; timm not installed
        ckpt = load_checkpoint(tmp_path / "clip", readers=readers, strict=True)
        prov = ckpt.report.provenance
        for name in ("num_heads", "pool", "image_size"):
            assert prov[name].kind == DECLARED and prov[name].source.startswith("config.json model_args"), name
        arch = f"architecture vit_base_patch16_clip_224 (timm {timm_version()} builds it so)"
        assert prov["ln_eps"].source == f"config.json {arch}" and prov["gelu"].source == f"config.json {arch}"
        assert ckpt.report.assumed == [] and ckpt.cfg == load_checkpoint(tmp_path / "clip", readers=READERS).cfg
    x = images(2, (64, 64))
    c = compare("logits", _logits(from_numpy(ckpt.cfg, ckpt.state), x), _logits(tm, x), "tensor", "float32")
    assert c.ok, c
    config = json.loads((tmp_path / "clip" / "config.json").read_text())
    (tmp_path / "clip" / "config.json").write_text(json.dumps(config | {"architecture": "my_clip"}))
    ckpt = load_checkpoint(tmp_path / "clip", readers={})
    assert sorted(ckpt.report.assumed) == ["gelu", "ln_eps"]
    assert any("my_clip with its own defaults" in n for n in ckpt.report.notes)


def test_a_config_json_that_contradicts_the_tensors_is_refused(tmp_path, perturb):
    _hub_folder(tmp_path / "clip", "vit_base_patch16_clip_224", perturb, **CLIP_TINY)
    config = json.loads((tmp_path / "clip" / "config.json").read_text())
    config["model_args"]["depth"] = 3
    (tmp_path / "clip" / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        FormatError, match=r"config.json disagrees with the tensors: depth=3 \(the tensors give depth=2\)"
    ):
        load_checkpoint(tmp_path / "clip", readers={})
    with pytest.raises(ValueError, match=r"the config \(depth=3, .*\) declares 63,392 parameters"):  # timm's
        load_checkpoint(tmp_path / "clip", readers=READERS)


def test_a_hub_folder_of_a_gated_mlp_model_reads_through_timm_exactly(tmp_path, perturb, images):
    """vit_giant_patch14_dinov2 (timm's SwiGLUPacked: mlp.fc1 packs gate then value): timm's own model says
    the packing, so nothing is assumed and both halves land where the twins read them."""
    tm = _hub_folder(
        tmp_path / "g", "vit_giant_patch14_dinov2", perturb, embed_dim=32, depth=1, num_heads=2, img_size=28
    )
    ckpt = load_checkpoint(tmp_path / "g", readers=READERS, strict=True)
    assert ckpt.cfg.mlp_type == "swiglu" and ckpt.report.assumed == []
    x = images(2, (28, 28))
    c = compare("logits", _logits(from_numpy(ckpt.cfg, ckpt.state), x), _logits(tm, x), "tensor", "float32")
    assert c.ok, c


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, size",
    [
        ("eva02_base_patch14_224", 28),  # split q/k/v without a key bias, split SwiGLU with its inner norm
        ("vit_base_patch16_dinov3_qkvb", 32),  # RoPE dinov3, q/v biases, registers
        ("vit_pe_core_tiny_patch16_384", 32),  # RoPE cat xy offset 1, norm_pre, a MAP head of 8 heads
        ("vit_base_patch16_rope_mixed_224", 32),  # learned RoPE frequencies (rope.freqs)
    ],
)
def test_a_hub_folder_of_a_rope_backbone_loads_with_nothing_assumed(tmp_path, perturb, images, name, size):
    """timm Eva models (once refused: "is a Eva"): config.json declares the architecture, timm builds it,
    and the torch twin equals timm's model."""
    kw = dict(embed_dim=32, depth=1, num_heads=2, img_size=size, num_classes=3)
    tm = _hub_folder(tmp_path / "m", name, perturb, **kw)
    ckpt = load_checkpoint(tmp_path / "m", readers=READERS, strict=True)
    assert ckpt.cfg.rope != "none" and ckpt.report.assumed == []
    x = images(2, (size, size))
    c = compare("logits", _logits(from_numpy(ckpt.cfg, ckpt.state), x), _logits(tm, x), "tensor", "float32")
    assert c.ok, c


def test_pretrained_cfg_declares_the_preprocessing_and_label_names(tmp_path, perturb):
    _hub_folder(tmp_path / "clip", "vit_base_patch16_clip_224", perturb, **CLIP_TINY)
    info = load_checkpoint(tmp_path / "clip", readers=READERS).info
    assert info.preprocess == CLIP_PRE and info.warnings == []
    assert info.preprocess_source == f"declared: {tmp_path / 'clip' / 'config.json'} pretrained_cfg"
    assert info.classes is None
    config = json.loads((tmp_path / "clip" / "config.json").read_text())
    config["label_names"] = [f"c{i}" for i in range(7)]
    config["pretrained_cfg"] |= {"crop_mode": "squash", "interpolation": "bilinear"}
    (tmp_path / "clip" / "config.json").write_text(json.dumps(config))
    info = load_checkpoint(tmp_path / "clip", readers=READERS).info
    assert info.classes == tuple(f"c{i}" for i in range(7))
    assert info.preprocess == CLIP_PRE.replace(crop_mode="squash", interpolation="bilinear")
    config["pretrained_cfg"]["crop_mode"] = "border"
    (tmp_path / "clip" / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match="pretrained_cfg crop_mode='border'; the project crops"):
        load_checkpoint(tmp_path / "clip", readers=READERS)


@pytest.mark.slow
def test_a_hub_id_of_a_timm_repo_loads_from_the_cache(tmp_path, perturb, hub_cache, monkeypatch, images):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    tm = _hub_folder(tmp_path / "clip", "vit_base_patch16_clip_224", perturb, **CLIP_TINY)
    hub_cache(tmp_path / "hub", "timm/vit_base_patch16_clip_224.tiny", tmp_path / "clip")
    model = load_model("hf-hub:timm/vit_base_patch16_clip_224.tiny", strict=True)
    x = images(2, (64, 64))
    c = compare("logits", _logits(model, x), _logits(tm, x), "tensor", "float32")
    assert c.ok, c
    assert load_checkpoint("hf-hub:timm/vit_base_patch16_clip_224.tiny").info.preprocess == CLIP_PRE


def test_vit_info_on_a_clip_hub_folder_assumes_nothing(tmp_path, perturb, capsys):
    _hub_folder(tmp_path / "clip", "vit_base_patch16_clip_224", perturb, **CLIP_TINY)
    assert main(["info", str(tmp_path / "clip"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "timm" and out["assumed"] == [] and out["warnings"] == []
    assert out["config"]["ln_eps"] == 1e-5 and out["config"]["norm_pre"] is True


# timm architectures at test width (timm's constructor keywords on top of the name's defaults) whose hub
# folders convert into a timm hub folder of ours: CLIP (eps 1e-5), DINOv2-, SigLIP-style, DeiT distilled.
WRITTEN = {
    "clip": ("vit_base_patch16_clip_224", dict(CLIP_TINY, act_layer="quick_gelu")),
    "dinov2_style": (
        "vit_small_patch14_reg4_dinov2",
        dict(embed_dim=32, depth=2, num_heads=2, img_size=28, num_classes=3),
    ),
    "siglip_style": ("vit_base_patch16_siglip_224", dict(embed_dim=32, depth=2, num_heads=2, img_size=32)),
    "avg_fc_norm": ("vit_base_patch16_224", dict(embed_dim=32, depth=1, num_heads=2, img_size=32, global_pool="avg")),
    "deit_distilled": ("deit_base_distilled_patch16_224", dict(embed_dim=32, depth=1, num_heads=2, img_size=32)),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(WRITTEN))
def test_a_hub_folder_converts_into_one_timm_loads_strictly(tmp_path, perturb, images, family):
    name, kwargs = WRITTEN[family]
    tm = _hub_folder(tmp_path / "src", name, perturb, **kwargs)
    report = convert(tmp_path / "src", tmp_path / "out", to_fmt="timm", readers=READERS)
    assert report.written_format == "timm" and report.assumed == []
    assert (
        report.load_call == f"import timm\nmodel = timm.create_model('local-dir:{tmp_path / 'out'}', pretrained=True)"
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "model.safetensors",
    ]
    back = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()  # strict load
    x = images(2, tm.patch_embed.img_size)
    assert np.array_equal(_logits(back, x), _logits(tm, x))
    for readers in (READERS, {}):  # timm's reading, and our header's config without timm
        again = load_checkpoint(tmp_path / "out", readers=readers, strict=True)
        assert again.cfg == load_checkpoint(tmp_path / "src", readers=READERS).cfg
        assert again.info.preprocess_source.startswith("declared:")


def test_the_written_folder_carries_preprocessing_and_class_names_as_timm_reads_them(tmp_path, perturb):
    _hub_folder(tmp_path / "src", "vit_base_patch16_clip_224", perturb, **CLIP_TINY)
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    config["label_names"] = [f"class {i}" for i in range(7)]
    (tmp_path / "src" / "config.json").write_text(json.dumps(config))
    convert(tmp_path / "src", tmp_path / "out", to_fmt="timm", readers=READERS)
    model = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True)
    data = timm.data.resolve_model_data_config(model)
    assert tuple(data["mean"]) == CLIP_PRE.mean and tuple(data["std"]) == CLIP_PRE.std
    assert (data["interpolation"], data["crop_pct"], data["crop_mode"]) == ("bicubic", 0.95, "center")
    assert model.pretrained_cfg["label_names"] == [f"class {i}" for i in range(7)]
    info = load_checkpoint(tmp_path / "out", readers=READERS).info
    assert info.preprocess == CLIP_PRE and info.classes == tuple(f"class {i}" for i in range(7))


def test_a_model_no_timm_architecture_holds_is_refused_by_name(tmp_path, small_cfg, random_state):
    cfg = small_cfg.replace(ln_eps=1e-12)  # transformers ViT's eps
    with pytest.raises(
        ValueError, match=r"the timm hub folder format cannot hold this model: ln_eps=1e-12 \(config.json names"
    ):
        save_checkpoint(tmp_path / "out", cfg, random_state(cfg), "timm")
    assert not (tmp_path / "out").exists()
    save_checkpoint(tmp_path / "out.safetensors", cfg, random_state(cfg), "timm")  # a file records it


def test_vit_convert_to_timm_into_a_folder(tmp_path, perturb, capsys):
    _hub_folder(tmp_path / "src", "vit_base_patch16_clip_224", perturb, **CLIP_TINY)
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--to", "timm"]) == 0
    out = capsys.readouterr().out
    assert f"timm.create_model('local-dir:{tmp_path / 'out'}', pretrained=True)" in out
    assert timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).num_classes == 7


def test_a_timm_export_shares_the_bytes_of_the_file_holding_its_tensors(tmp_path, small_cfg, random_state, images):
    cfg = small_cfg.replace(num_heads=2)
    state = random_state(cfg, seed=5)
    save_checkpoint(tmp_path / "model.safetensors", cfg, state, "canonical")
    shared = TimmWriteOptions(str(tmp_path / "model.safetensors"))
    r = save_checkpoint(tmp_path / "model_timm", cfg, state, "timm", options=shared)
    save_checkpoint(tmp_path / "model_timm.safetensors", cfg, state, "timm", options=shared)
    for p in (tmp_path / "model_timm" / "model.safetensors", tmp_path / "model_timm.safetensors"):
        assert os.path.samefile(p, tmp_path / "model.safetensors") and not p.is_symlink()  # a hard link
    assert "local-dir:" in r.load_call
    model = timm.create_model(f"local-dir:{tmp_path / 'model_timm'}", pretrained=True).eval()
    x = images(2, cfg.image_size)
    assert np.array_equal(_logits(model, x), _logits(from_numpy(cfg, state), x))
    for path in (tmp_path / "model_timm", tmp_path / "model_timm.safetensors"):
        back = load_checkpoint(path, readers={})
        assert back.cfg == cfg and all(np.array_equal(back.state[k], v) for k, v in state.items())
    other = random_state(cfg, seed=6)  # another model's tensors: written, said so
    r = save_checkpoint(tmp_path / "other", cfg, other, "timm", options=shared)
    assert any("does not hold exactly these tensors (blocks.0.attn.proj.bias" in n for n in r.notes), r.notes
    assert not os.path.samefile(tmp_path / "other" / "model.safetensors", tmp_path / "model.safetensors")
    back = load_checkpoint(tmp_path / "other", readers={})
    assert all(np.array_equal(back.state[k], v) for k, v in other.items())


def test_a_hub_folder_with_pytorch_model_bin_loads_too(tmp_path, perturb, images):
    torch.manual_seed(0)
    tm = perturb(timm.create_model("vit_base_patch16_clip_224", pretrained=False, **CLIP_TINY)).eval()
    timm.models.save_for_hf(tm, tmp_path / "clip")  # timm's default: pytorch_model.bin, no safetensors
    assert sorted(p.name for p in (tmp_path / "clip").iterdir()) == ["config.json", "pytorch_model.bin"]
    ckpt = load_checkpoint(tmp_path / "clip", readers=READERS, strict=True)
    assert ckpt.report.assumed == [] and ckpt.cfg.ln_eps == 1e-5
    x = images(2, (64, 64))
    c = compare("logits", _logits(from_numpy(ckpt.cfg, ckpt.state), x), _logits(tm, x), "tensor", "float32")
    assert c.ok, c
