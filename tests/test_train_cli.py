"""`vit train` on bad input: exit code 2 and a one-line reason, before any training starts."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from PIL import Image

from vit_cli.main import build_parser, main

TINY = (
    "--image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4 "
    "--epochs 1 --no-progress --no-parity"
).split()


def folder(root, classes, n=3, corrupt=None):
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(np.full((8, 8, 3), 30 * i, np.uint8)).save(root / c / f"{i}.png")
    if corrupt:
        (root / corrupt).write_bytes(b"GIF89a broken")
    return root


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "no such folder"),
        ("empty", "is empty"),
        ("one_class", "one class only"),
        ("corrupt", "b/1.gif"),
        ("patch", "not a multiple of patch_size"),
        ("dataset", "expected mnist5k"),
        ("batch", "batch_size=0"),
        ("timeout", "heartbeat_timeout=0: expected an int >= 1 (seconds)"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(case, message, tmp_path, capsys):
    out = tmp_path / "run"
    data = {
        "missing": tmp_path / "nowhere",
        "empty": tmp_path / "empty",
        "one_class": folder(tmp_path / "one", ["a"]),
        "corrupt": folder(tmp_path / "bad", ["a", "b"], corrupt="b/1.gif"),
    }
    (tmp_path / "empty" / "a").mkdir(parents=True)
    args = [
        "train",
        *TINY,
        "--out",
        str(out),
        "--dataset",
        f"imagefolder:{data.get(case, folder(tmp_path / 'ok', 'xy'))}",
    ]
    if case == "patch":
        args += ["--image-size", "10"]
    if case == "dataset":
        args += ["--dataset", "cifar10"]
    if case == "batch":
        args += ["--batch-size", "0"]
    if case == "timeout":
        args += ["--heartbeat-timeout", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit train: error: ") and message in err, err
    assert not out.exists()  # nothing written


def test_help_explains_every_flag():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("train", "evaluate", "predict"):
        for action in sub.choices[name]._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
