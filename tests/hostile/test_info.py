"""Hostile inputs to `vit info`: FIFOs and devices where a file is read (the checkpoint, a folder's config,
index, shard or preprocessor config), empty, truncated and lying files, objects in an .npz, config.json
sizes of a position table that the tensors contradict (SigLIP 2 NaFlex, RADIO, timm NaFlexVit)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vit_common.checkpoints.convert import save_checkpoint
from vit_common.checkpoints.formats.hf import HfWriteOptions
from vit_common.checkpoints.formats.timm import TimmWriteOptions
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


# SMALL as each family whose config.json sizes its position table: its table is 4x4 (image 32, patch 8)
_TABLE_FAMILIES = {
    "num_patches": (
        SMALL.replace(class_token=False, pool="map", gelu="tanh", posemb_resample="bilinear_aa", num_classes=0),
        "hf_family",
        HfWriteOptions(model_type="siglip2_vision_model"),
    ),
    "max_img_size": (
        SMALL.replace(
            num_classes=0, pool="summary", summary_idxs=(0,), final_norm=False, input_mean=(0.5,) * 3,
            input_std=(0.5,) * 3, patch_bias=False, posemb_prefix=False, posemb_resample="bilinear_crop",
            dynamic_img_size=True,
        ),
        "hf_family",
        None,
    ),
    "pos_embed_grid_size": (
        SMALL.replace(class_token=False, pool="gap", posemb_prefix=False, dynamic_img_size=True),
        "timm",
        TimmWriteOptions(architecture="naflexvit_base_patch16_gap"),
    ),
}  # fmt: skip


def table_size(key: str, value) -> Callable[[Path], list[str]]:
    """A folder of the family whose config.json sizes its position table with ``key`` (``_TABLE_FAMILIES``:
    SigLIP 2 NaFlex, RADIO, a timm NaFlexVit's ``model_args``), that key set to ``value``."""

    def build(tmp: Path) -> list[str]:
        cfg, fmt, options = _TABLE_FAMILIES[key]
        save_checkpoint(tmp / "hf", cfg, random_state(cfg, scale=0.2), fmt, options=options)
        config = json.loads((tmp / "hf" / "config.json").read_text())
        (config["model_args"] if fmt == "timm" else config)[key] = value
        (tmp / "hf" / "config.json").write_text(json.dumps(config))
        return ["info", str(tmp / "hf")]

    build.__name__ = f"{key} {value}"
    return build


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
    # a table's size that the tensors contradict: one line naming it (once a shape error, or image_size=0)
    Case(table_size("num_patches", 0), r"{tmp}/hf: config.json num_patches=0: expected a positive square G\*G"),
    Case(
        table_size("max_img_size", 64),
        r"{tmp}/hf: config.json max_img_size=64 with patch_size=8 gives a 8x8 position table \(64 rows\), but "
        r"radio_model.model.patch_generator.pos_embed has 16 rows: expected max_img_size=32",
    ),
    Case(
        table_size("pos_embed_grid_size", [2, 8]),
        r"{tmp}/hf/config.json: model_args pos_embed_grid_size=\[2, 8\] builds a 2x8 position table, but "
        r"embeds.pos_embed holds 4x4: expected pos_embed_grid_size \[4, 4\]",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)
