"""Hostile inputs to `vit parity`: non-finite weights fail the check (no agreement from NaN)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vit_common.state import random_state

from .harness import SMALL, Case, check_case, ours


def nan_weights_parity(tmp: Path) -> list[str]:
    state = random_state(SMALL, scale=0.2)
    state["blocks.0.mlp.fc1.weight"][0, 0] = np.inf
    ours(tmp / "inf.safetensors", SMALL.to_json(), state)
    return ["parity", str(tmp / "inf.safetensors")]


def _parity_fails(tmp: Path, out: str) -> None:
    assert "FAIL" in out and "agreement" not in out


CASES = [
    # silent wrong results
    Case(nan_weights_parity, "", code=1, check=_parity_fails),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)
