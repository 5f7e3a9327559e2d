"""Hostile inputs to `vit info`: FIFOs and devices where a file is read (the checkpoint, a folder's config,
index, shard or preprocessor config), empty, truncated and lying files, objects in an .npz."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vit_common.checkpoints.convert import save_checkpoint
from vit_common.state import random_state

from .harness import SMALL, Case, check_case, small_model


def fifo_source(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "x.safetensors")
    return ["info", str(tmp / "x.safetensors")]


def fifo_config(tmp: Path) -> list[str]:
    (tmp / "hf").mkdir()
    os.mkfifo(tmp / "hf" / "config.json")
    save_file({"w": np.ones(3, np.float32)}, str(tmp / "hf" / "model.safetensors"))
    return ["info", str(tmp / "hf")]


def special_in_hf_folder(name: str, kind: str) -> Callable[[Path], list[str]]:
    """An HF folder of the small model in two shards and an index, its ``name`` replaced by ``kind``: a
    FIFO, or a link to /dev/zero (a file that never ends)."""

    def build(tmp: Path) -> list[str]:
        hf = tmp / "hf"
        save_checkpoint(hf, SMALL, random_state(SMALL, scale=0.2), "hf")
        tensors = load_file(hf / "model.safetensors")
        (hf / "model.safetensors").unlink()
        keys = sorted(tensors)
        wmap = {k: f"model-0000{1 + (i >= len(keys) // 2)}-of-00002.safetensors" for i, k in enumerate(keys)}
        for shard in set(wmap.values()):
            save_file({k: tensors[k] for k in keys if wmap[k] == shard}, str(hf / shard), {"format": "pt"})
        (hf / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
        (hf / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "ViTImageProcessor"}))
        (hf / name).unlink()
        if kind == "FIFO":
            os.mkfifo(hf / name)
        else:
            os.symlink("/dev/zero", hf / name)
        return ["info", str(hf)]

    build.__name__ = f"{name} a {kind}"
    return build


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
    Case(fifo_config, r"{tmp}/hf/config.json: a FIFO, expected a regular config file", child=True),
    Case(
        special_in_hf_folder("model-00002-of-00002.safetensors", "link to /dev/zero"),
        r"{tmp}/hf/model-00002-of-00002.safetensors: a device, expected a regular checkpoint shard",
    ),
    Case(
        special_in_hf_folder("model.safetensors.index.json", "FIFO"),
        r"{tmp}/hf/model.safetensors.index.json: a FIFO, expected a regular index file",
    ),
    Case(
        special_in_hf_folder("preprocessor_config.json", "FIFO"),
        r"{tmp}/hf/preprocessor_config.json: a FIFO, expected a regular preprocessor config",
        child=True,
    ),
    Case(empty_file, r"{tmp}/e.safetensors: not a checkpoint format"),
    Case(truncated_safetensors, r"{tmp}/t.safetensors"),
    Case(lying_header_length, r"{tmp}/l.safetensors"),
    Case(npz_object_member, r"{tmp}/obj.npz: member 'x' holds Python objects"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)
