"""`vit info`: golden parameter count, JSON output, exit code 2 on a bad variant."""

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
