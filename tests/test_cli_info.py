"""`vit info`: golden parameter count, JSON output, exit code 2 on a bad variant or an unusable path."""

from __future__ import annotations

import json

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
