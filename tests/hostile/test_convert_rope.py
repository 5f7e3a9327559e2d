"""Hostile RoPE inputs to `vit convert`, each through a file: a head dimension not divisible by 4, a periods
or frequency tensor of the wrong shape, an unknown rope type or layout. Our file, one of our timm files
and a timm hub folder; a hub folder's timm Eva name whose LayerNorm eps is not the model's, an unknown Eva
name, and Eva options for a model timm holds as a VisionTransformer. One line naming the value and what
was expected, exit 2, nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vit_common.checkpoints.formats.canonical import FORMAT_TAG
from vit_common.checkpoints.formats.timm import META_TAG
from vit_common.config import ViTConfig
from vit_common.state import random_state

from .harness import SMALL, Case, check_case

# A small RoPE ViT (head_dim 16): each builder changes one thing of it.
ROPE = ViTConfig(image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)
ROPE = ROPE.replace(posemb="none", rope="cat")
DINOV3 = ROPE.replace(rope="dinov3", rope_layout="half", rope_temperature=100.0, rope_periods="stored")
MIXED = ROPE.replace(rope="mixed")


def stored(name: str, cfg: ViTConfig, changes: dict, tensors: dict | None = None, timm: bool = False):
    """A builder of our file (or, with ``timm``, one of our timm .safetensors) holding ``cfg``'s tensors
    (``tensors`` replacing some) and its config with ``changes``: ``vit convert`` it."""

    def build(tmp: Path) -> list[str]:
        state = random_state(cfg, scale=0.2) | (tensors or {})
        text = json.dumps(cfg.to_dict() | changes)
        meta = {"format": "pt", META_TAG[0]: META_TAG[1]} if timm else {"format": FORMAT_TAG}
        save_file(state, str(tmp / "m.safetensors"), meta | {"vit_config": text})
        return ["convert", str(tmp / "m.safetensors"), str(tmp / "out.safetensors")]

    build.__name__ = name
    return build


def hub_folder(name: str, timm_name: str, model_args: dict, tensor: tuple[str, tuple] | None = None):
    """A builder of a timm hub folder (timm's save_for_hf of a tiny ``timm_name``) whose config.json's
    model_args say ``model_args`` (or whose tensor ``tensor[0]`` is cut to shape ``tensor[1]``)."""

    def build(tmp: Path) -> list[str]:
        import timm
        import torch

        torch.manual_seed(0)
        m = timm.create_model(timm_name, pretrained=False, embed_dim=32, depth=1, num_heads=2, img_size=32)
        timm.models.save_for_hf(m, tmp / "hub", safe_serialization=True)
        config = json.loads((tmp / "hub" / "config.json").read_text())
        config["model_args"] = config.get("model_args", {}) | model_args
        (tmp / "hub" / "config.json").write_text(json.dumps(config))
        if tensor is not None:
            weights = load_file(tmp / "hub" / "model.safetensors")
            weights[tensor[0]] = np.ascontiguousarray(weights[tensor[0]][tuple(slice(n) for n in tensor[1])])
            save_file(weights, str(tmp / "hub" / "model.safetensors"))
        return ["convert", str(tmp / "hub"), str(tmp / "out.safetensors")]

    build.__name__ = name
    return build


def hub_name_of_another_eps(tmp: Path) -> list[str]:
    """A RoPE-ViT (LayerNorm eps 1e-6) written as a hub folder named for DINOv3, whose name builds 1e-5."""
    argv = hub_folder("", "vit_base_patch16_rope_224", {})(tmp)
    return [*argv[:2], str(tmp / "out"), "--to", "timm", "--timm-architecture", "vit_base_patch16_dinov3"]


def timm_options(name: str, cfg: ViTConfig, out: str, *flags: str):
    """A builder of our file of ``cfg`` converted to timm at ``out`` (a file, or a hub folder without a
    suffix) with the timm Eva write ``flags``."""

    def build(tmp: Path) -> list[str]:
        argv = stored("", cfg, {})(tmp)
        return [*argv[:2], str(tmp / out), "--to", "timm", *flags]

    build.__name__ = name
    return build


def shape_line(expected: str) -> Callable[[Path, str], None]:
    """The line under the error that names the tensor, its shape and the shape expected."""

    def check(tmp: Path, output: str) -> None:
        assert expected in output, output

    return check


HEAD_DIM = r"the stored ViTConfig is invalid \(rope='cat' needs head_dim divisible by 4 .*got head_dim="
CASES = [
    # a head dimension not divisible by 4 (two axes, rotated pairs)
    Case(stored("head dim 6, ours", ROPE, dict(width=24, num_heads=4, mlp_dim=48)), HEAD_DIM + "6"),
    Case(stored("head dim 10, our timm file", ROPE, dict(width=20, mlp_dim=40), timm=True), HEAD_DIM + "10"),
    Case(
        hub_folder("head dim 6, timm hub folder", "vit_base_patch16_rope_224", dict(embed_dim=24, num_heads=4)),
        r"{tmp}/hub/config.json: model_args num_heads=4 with embed_dim=24 give head_dim=6; .*need head_dim "
        "divisible by 4",
    ),
    # a periods or frequency tensor of the wrong shape
    Case(
        stored("periods of 3, ours", DINOV3, {}, {"rope.periods": np.ones(3, np.float32)}),
        r"state does not match the config: {tmp}/m.safetensors",
        check=shape_line("rope.periods has (3,), expected (4,)"),
    ),
    Case(
        stored("freqs of 9 pairs, ours", MIXED, {}, {"rope.freqs": np.ones((2, 2, 2, 9), np.float32)}),
        r"state does not match the config: {tmp}/m.safetensors",
        check=shape_line("rope.freqs has (2, 2, 2, 9), expected (2, 2, 2, 8)"),
    ),
    Case(
        hub_folder(
            "freqs of 1 head, timm hub folder", "vit_base_patch16_rope_mixed_224", {}, ("rope.freqs", (2, 1, 1))
        ),
        r"state does not match the config: {tmp}/hub",
        check=shape_line("rope.freqs has (2, 1, 1, 8), expected (2, 1, 2, 8)"),
    ),
    # an unknown rope type or layout
    Case(stored("rope spiral, ours", ROPE, dict(rope="spiral")), r"rope='spiral': expected one of \('none', 'dinov3'"),
    Case(
        stored("rope layout diagonal, our timm file", ROPE, dict(rope_layout="diagonal"), timm=True),
        r"rope_layout='diagonal': expected one of \('interleaved', 'half'\)",
    ),
    Case(
        hub_name_of_another_eps,
        r"--timm-architecture 'vit_base_patch16_dinov3': a hub folder's name fixes the LayerNorm eps, and it is "
        r"not one known to build ln_eps=1e-06 \(eva02_tiny_patch14_224",
    ),
    # timm Eva write options: an unknown Eva name for a file, either option for a timm VisionTransformer
    Case(
        timm_options("Eva name foo, timm file", ROPE, "out.safetensors", "--timm-architecture", "foo"),
        r"--timm-architecture 'foo': expected a timm Eva name \(vit_base_patch16_dinov3, ",
    ),
    Case(
        timm_options("Eva name, plain ViT", SMALL, "out.pth", "--timm-architecture", "eva02_tiny_patch14_224"),
        r"--timm-architecture 'eva02_tiny_patch14_224': an option of RoPE backbones \(timm Eva\); this model is a "
        "timm VisionTransformer",
    ),
    Case(
        timm_options("Eva qkv split, plain ViT hub folder", SMALL, "out", "--timm-eva-qkv", "split"),
        r"--timm-eva-qkv 'split': an option of RoPE backbones \(timm Eva\)",
    ),
    Case(
        hub_folder("rope_type spiral, timm hub folder", "vit_base_patch16_rope_224", dict(rope_type="spiral")),
        r"timm cannot build 'local-dir:{tmp}/hub' \(ValueError: Unknown RoPE type: spiral\)",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)
