"""Hostile inputs to `vit parity` and `vit train-parity`: non-finite weights fail the check (no agreement
from NaN); a batch larger than the data is refused before either twin is built; LoRA settings that cannot
be are refused before any step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vit_common.state import random_state

from .harness import SMALL, Case, check_case, npz_dataset, ours, small_model, write_png
from .test_predict_evaluate import naflex_model


def nan_weights_parity(tmp: Path) -> list[str]:
    state = random_state(SMALL, scale=0.2)
    state["blocks.0.mlp.fc1.weight"][0, 0] = np.inf
    ours(tmp / "inf.safetensors", SMALL.to_json(), state)
    return ["parity", str(tmp / "inf.safetensors")]


def train_parity_batch(batch: int, train: int, test: int, *outputs: str):
    """``vit train-parity`` with ``--batch-size batch`` on an npz dataset of ``train`` + ``test`` images,
    writing ``outputs`` (flags, relative paths: refused, it makes none of their folders)."""

    def build(tmp: Path) -> list[str]:
        data = npz_dataset(tmp / "d.npz", [0, 1] * (train // 2), [0, 1] * (test // 2))
        tiny = "--image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32".split()
        argv = ["train-parity", "--steps", "1", *tiny, "--batch-size", str(batch), "--dataset", f"npz:{data}"]
        return [*argv, *outputs]

    build.__name__ = f"train-parity batch {batch} of {train} images{''.join(' ' + o for o in outputs)}"
    return build


def train_parity_lora(*extra: str, init: bool = True):
    """``vit train-parity --lora ...`` (``extra``) from the small model's file (``init``) on an npz dataset."""

    def build(tmp: Path) -> list[str]:
        data = npz_dataset(tmp / "d.npz", [0, 1] * 4, [0, 1])
        model = ["--init", str(small_model(tmp))] if init else []
        return ["train-parity", "--steps", "1", "--batch-size", "4", "--dataset", f"npz:{data}", *model, *extra]

    build.__name__ = f"train-parity {' '.join(extra)}{'' if init else ' without --init'}"
    return build


def parity_max_patches(n: str, naflex: bool = True, images: bool = True):
    """``vit parity --max-patches n`` of a NaFlex model (``naflex``, else a fixed-size one), with a folder of
    one PNG as ``--images`` (``images``)."""

    def build(tmp: Path) -> list[str]:
        model = naflex_model(tmp) if naflex else small_model(tmp)
        (tmp / "imgs").mkdir()
        write_png(tmp / "imgs" / "a.png", (40, 24))
        folder = ["--images", str(tmp / "imgs")] if images else []
        return ["parity", str(model), *folder, "--max-patches", n]

    kind = "NaFlex" if naflex else "fixed-size"
    build.__name__ = f"parity {kind} --max-patches {n}{'' if images else ' without --images'}"
    return build


def _parity_fails(tmp: Path, out: str) -> None:
    assert "FAIL" in out and "agreement" not in out


CASES = [
    # silent wrong results
    Case(nan_weights_parity, "", code=1, check=_parity_fails),
    # cost out of proportion: padding computed for nothing
    Case(train_parity_batch(9, 8, 4), r"batch_size=9: expected at most the 8 training images of npz:{tmp}/d.npz"),
    Case(train_parity_batch(4096, 6, 2), r"batch_size=4096: expected at most the 6 training images"),
    Case(
        train_parity_batch(9, 8, 2, "--json", "a/b/r.json", "--plot", "c/p.png"),
        r"batch_size=9: expected at most the 8 training images",
    ),
    # LoRA settings that cannot be (a rank above the width, targets naming no layer, nothing to fine-tune)
    Case(train_parity_lora("--lora", "33"), r"lora=33: expected a rank from 1 to the model's width 32"),
    Case(train_parity_lora("--lora", "0"), r"argument --lora: "),
    Case(
        train_parity_lora("--lora", "2", "--lora-targets", "qkv,query"), r"no linear layer of the model matches query"
    ),
    Case(train_parity_lora("--lora", "2", init=False), r"lora=2: expected --init too"),
    Case(train_parity_lora("--lora", "2", "--lora-dropout", "0.1"), r"lora_dropout=0.1: the parity mode has no shared"),
    # NaFlex budgets, as predict and evaluate refuse them: memory first, before any image is read
    Case(
        parity_max_patches("100000"),
        r"{tmp}/n.safetensors: max_patches=100000 at a batch of 1 images needs about 80.1 GB",
        env={"VIT_MAX_BYTES": "4000000000"},
    ),
    Case(parity_max_patches("16", naflex=False), r"{tmp}/m.safetensors: max_patches=16 for a fixed-size model"),
    Case(parity_max_patches("16", images=False), r"--max-patches 16 is the budget of --images: pass --images DIR"),
    Case(parity_max_patches("0"), r"argument --max-patches: "),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)
