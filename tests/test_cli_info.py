"""`vit info`: golden parameter count, JSON output, exit code 2 on a bad variant or an unusable path, a NaFlex
model's counts at its patch budget (or a budget not declared)."""

from __future__ import annotations

import json

import pytest

from vit_cli.main import main


def test_info_b16_prints_golden_count(capsys):
    assert main(["info", "B/16"]) == 0
    out = capsys.readouterr().out
    assert "86,567,656" in out and "35.13" in out


def test_info_json(capsys):
    assert main(["info", "Ti/16", "--num-classes", "10", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["params"] == 5_717_416 - 990 * 193  # a 10-class head instead of 1000: 990 fewer rows of D+1
    assert d["config"]["num_classes"] == 10 and d["seq_len"] == 197


def test_info_bad_variant_exits_2(capsys):
    assert main(["info", "Q/16"]) == 2
    assert "unknown name 'Q'" in capsys.readouterr().err


def test_an_output_path_that_is_a_folder_exits_2(tmp_path, capsys, small_cfg, random_state):

    from vit_common.checkpoints.convert import save_checkpoint

    save_checkpoint(tmp_path / "m.safetensors", small_cfg, random_state(small_cfg))
    (tmp_path / "out.npz").mkdir()
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "out.npz")]) == 2
    assert "out.npz is a folder: expected a file path" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "m.safetensors")]) == 2
    assert "m.safetensors: the output is the source " in capsys.readouterr().err


def test_info_of_a_checkpoint_prints_the_provenance_of_each_field(tmp_path, capsys, small_cfg, random_state):
    """`vit info FILE`: a timm file as timm writes it (no config) lists each field with where it came
    from, marks the assumed ones and warns each with its flag; --set makes a field given."""

    from vit_common.system.io import save_safetensors

    save_safetensors(tmp_path / "timm.safetensors", random_state(small_cfg))
    assert main(["info", str(tmp_path / "timm.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "timm (timm state_dict)" in out and f"{small_cfg.param_count():,}" in out
    lines = {line.split()[0]: line for line in out.splitlines() if " = " in line}
    assert "derived" in lines["width"] and "tensor shapes" in lines["width"]
    assert lines["gelu"].strip() == "gelu = 'exact' (not stored; timm's default nn.GELU (exact erf))"
    assert "run-time" in lines["dropout"]
    assert "  assumed         6 fields assumed: image_size, num_heads, ln_eps, gelu, pool, posemb_prefix (" in out
    named = [line.split()[0] for line in out.splitlines() if " = " in line]
    assert "WARNING" not in out and len(named) == len(set(named)), "each field on one line, assumed ones in the block"
    assert main(["info", str(tmp_path / "timm.safetensors"), "--set", "num_heads=2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["provenance"]["num_heads"] == {"kind": "given", "source": "passed by the caller"}
    assert "num_heads" not in report["assumed"] and "gelu" in report["assumed"]
    assert main(["info", str(tmp_path / "timm.safetensors"), "--strict"]) == 2
    assert "strict reading refuses assumptions" in capsys.readouterr().err


# A tiny NaFlex model: a 4x4 position table resized bilinearly with antialias to each image's grid.
NAFLEX = dict(
    image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3, class_token=False,
    pool="map", posemb_resample="bilinear_aa", dynamic_img_size=True,
)  # fmt: skip


def test_info_of_a_naflex_model_counts_at_its_patch_budget_and_prints_every_channel(tmp_path, capsys, random_state):
    """`vit info` of a NaFlex model declaring a budget of 12 patches: GFLOPs and tokens are at those 12
    patches (the FLOPs of a 24x32 image, 3x4 patches), said in the line, not at the table's 4x4 grid;
    a one-value mean and std print as every channel's (an ImageNet mean as its three values)."""
    from vit_common.checkpoints.convert import save_checkpoint
    from vit_common.config import ViTConfig
    from vit_common.data.images import PRESETS, Preprocess

    cfg = ViTConfig(**NAFLEX)
    save_checkpoint(tmp_path / "n.safetensors", cfg, random_state(cfg), preprocess=Preprocess(max_patches=12))
    assert main(["info", str(tmp_path / "n.safetensors")]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    at_budget = cfg.flops(image_size=(24, 32))
    assert at_budget == cfg.flops(patches=12) < cfg.flops() and round(at_budget / 1e9, 2) == 0.0
    assert lines["GFLOPs"] == "  GFLOPs / image  0.00  (forward, 2 x multiply-adds, at the patch budget, 12 patches)"
    assert lines["tokens"] == "  tokens          12  (patch budget 12 + 0 prefix; the position table's grid 4x4)"
    assert lines["preprocessing"] == (
        "  preprocessing   aspect kept, resized (bilinear, Pillow) to at most 12 patches, (pixel / 255 - mean 0.5 "
        f"(every channel)) / std 0.5 (every channel)  (declared: {tmp_path / 'n.safetensors'} metadata)"
    )
    assert main(["info", str(tmp_path / "n.safetensors"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["gflops"], report["seq_len"]) == (at_budget / 1e9, 12)
    assert PRESETS["imagenet"].describe(224).endswith("mean [0.485, 0.456, 0.406]) / std [0.229, 0.224, 0.225]")


def test_a_big_vision_naflex_npz_declares_no_patch_budget(tmp_path, capsys, random_state):
    """A big_vision naflex_vit .npz stores no preprocessing: `vit info` says its patch budget is not
    declared (FLOPs at the table's grid, said so); the budget is not guessed: using its preprocessing
    without max_patches is one line asking for --max-patches, and a given one is recorded as given."""
    from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
    from vit_common.checkpoints.formats.npz import NpzWriteOptions
    from vit_common.checkpoints.metadata import with_overrides
    from vit_common.config import ViTConfig

    cfg = ViTConfig(**{**NAFLEX, "gelu": "tanh"})
    save_checkpoint(tmp_path / "n.npz", cfg, random_state(cfg), "big_vision", options=NpzWriteOptions(naflex=True))
    assert main(["info", str(tmp_path / "n.npz")]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["GFLOPs"].endswith("(forward, 2 x multiply-adds, at the grid 4x4; the patch budget is not declared)")
    assert lines["tokens"] == "  tokens          16  (grid 4x4 + 0 prefix)"
    assert lines["preprocessing"] == (
        "  preprocessing   aspect kept, resized (bilinear, Pillow) to a patch budget not declared (--max-patches N), "
        "(pixel / 255 - mean 0.5 (every channel)) / std 0.5 (every channel)  (assumed: big_vision value_range(-1, "
        "1), bilinear resize)"
    )
    info = load_checkpoint(tmp_path / "n.npz").info
    assert info.no_budget and info.preprocess.max_patches is None
    with pytest.raises(ValueError) as refused:
        with_overrides(info, {}, None)
    assert str(refused.value) == (
        "a NaFlex model whose file declares no patch budget (a big_vision naflex_vit .npz): expected max_patches "
        "(--max-patches N), the most patches each image is resized to"
    )
    given = with_overrides(info, {"max_patches": 9}, None)
    assert (given.preprocess.max_patches, given.no_budget) == (9, False)
    assert given.preprocess_source == "given (max_patches) over assumed: big_vision value_range(-1, 1), bilinear resize"
