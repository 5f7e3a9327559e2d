"""The `vit` command's habits: whole flag names only, a subcommand's own usage and the close flags for
a flag it does not know, `vit --version`, `vit info`'s columns."""

from __future__ import annotations

import argparse
import re
from importlib.metadata import version

import pytest

from vit_cli.main import build_parser, main


def _parsers():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, sub.choices


def test_no_parser_takes_a_prefix_of_a_flag(capsys):
    parser, commands = _parsers()
    assert not parser.allow_abbrev and not any(p.allow_abbrev for p in commands.values())
    with pytest.raises(SystemExit) as e:
        main(["train", "--epoch", "3"])  # argparse's prefix matching would take it as --epochs 3
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.splitlines() == [  # vit train's 60 lines of usage: a pointer to --help
        "usage: vit train [FLAGS] ... ('vit train --help' lists them)",
        "vit train: error: unrecognized arguments: --epoch 3 (--epoch: did you mean --epochs?)",
    ]


def test_an_unknown_flag_far_from_any_gets_no_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["info", "B/16", "--zzz"])
    err = capsys.readouterr().err
    assert err.startswith("usage: vit info ") and err.rstrip().endswith(
        "vit info: error: unrecognized arguments: --zzz"
    )


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"vit {version('vit-twins')}\n"


def test_info_keeps_a_gap_between_every_field_and_its_value(capsys):
    assert main(["info", "B/16"]) == 0
    rows = dict(re.findall(r"^    (\w+) {2,}(\S.*)$", capsys.readouterr().out, re.M))
    assert rows["pool_include_prefix"] == "False" and rows["image_size"] == "[224, 224]" and len(rows) >= 30
