"""Hostile inputs to `vit info`: FIFOs, empty, truncated and lying files, objects in an .npz."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from .harness import Case, check_case, small_model


def fifo_source(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "x.safetensors")
    return ["info", str(tmp / "x.safetensors")]


def fifo_config(tmp: Path) -> list[str]:
    (tmp / "hf").mkdir()
    os.mkfifo(tmp / "hf" / "config.json")
    save_file({"w": np.ones(3, np.float32)}, str(tmp / "hf" / "model.safetensors"))
    return ["info", str(tmp / "hf")]


def empty_file(tmp: Path) -> list[str]:
    (tmp / "e.safetensors").write_bytes(b"")
    return ["info", str(tmp / "e.safetensors")]


def truncated_safetensors(tmp: Path) -> list[str]:
    data = small_model(tmp).read_bytes()
    (tmp / "t.safetensors").write_bytes(data[: len(data) // 2])
    return ["info", str(tmp / "t.safetensors")]


def lying_header_length(tmp: Path) -> list[str]:
    (tmp / "l.safetensors").write_bytes((10**15).to_bytes(8, "little") + b"{}")
    return ["info", str(tmp / "l.safetensors")]


def npz_object_member(tmp: Path) -> list[str]:
    np.savez(tmp / "obj.npz", x=np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return ["info", str(tmp / "obj.npz")]


CASES = [
    # small inputs that would exhaust the machine or hang
    Case(fifo_source, r"{tmp}/x.safetensors: .*a FIFO, expected a regular checkpoint file", child=True),
    Case(fifo_config, r"{tmp}/hf: a folder that is neither a Hugging Face ViT folder", child=True),
    Case(empty_file, r"{tmp}/e.safetensors: not a checkpoint format"),
    Case(truncated_safetensors, r"{tmp}/t.safetensors"),
    Case(lying_header_length, r"{tmp}/l.safetensors"),
    Case(npz_object_member, r"{tmp}/obj.npz: member 'x' holds Python objects"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)
