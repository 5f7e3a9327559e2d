"""Each framework's commands need only that framework: `vit predict` / `vit evaluate --framework torch` run
with jax unimportable, `--framework jax` with torch unimportable, and a command whose framework is
missing says, in one line, which extra to install. Runs in subprocesses whose import system refuses
the blocked packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vit_common.checkpoints.convert import save_checkpoint
from vit_common.data.images import Preprocess
from vit_common.system.extras import install_hint

ROOT = Path(__file__).resolve().parents[1]
JAX = "jax,jaxlib,flax,optax,orbax,grain"
TORCH = "torch,torchvision,timm,transformers"
BLOCKED = textwrap.dedent("""
    import importlib.abc, sys

    class Refuse(importlib.abc.MetaPathFinder):
        def __init__(self, names):
            self.names = set(names)

        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, Refuse(sys.argv[1].split(",")))
    from vit_cli.main import main
    code = main(sys.argv[2:])
    loaded = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1].split(",")))
    assert not loaded, loaded
    sys.exit(code)
""")


def vit(blocked: str, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", BLOCKED, blocked, *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def files(tmp_path_factory, random_state, image_folder, tiny_cfg):
    """A tiny checkpoint with class names and preprocessing, and an image folder of its classes."""
    root = tmp_path_factory.mktemp("one_framework")
    cfg = tiny_cfg
    state = random_state(cfg)
    save_checkpoint(root / "m.safetensors", cfg, state, "canonical", preprocess=Preprocess(), classes=["a", "b", "c"])
    image_folder(root / "imgs", "abc", n=2, size=(10, 12), band=True)
    return root


@pytest.mark.slow
def test_predict_and_evaluate_with_torch_need_no_jax(files):
    proc = vit(JAX, "predict", files / "m.safetensors", files / "imgs", "--framework", "torch", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert len(lines) == 6 and {ln["top"][0]["class"] for ln in lines} <= {"a", "b", "c"}
    proc = vit(
        JAX,
        "evaluate",
        files / "m.safetensors",
        "--dataset",
        f"imagefolder:{files / 'imgs'}",
        "--val-fraction",
        "0.5",
        "--framework",
        "torch",
        "--confusion",
        files / "c.png",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["classes"] == ["a", "b", "c"] and result["images"] == 3


@pytest.mark.slow
def test_predict_with_jax_needs_no_torch(files):
    proc = vit(TORCH, "predict", files / "m.safetensors", files / "imgs" / "a", "--framework", "jax")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.splitlines()) == 2


@pytest.mark.slow
def test_attention_with_jax_reads_a_timm_hub_folder_without_torch(files, tiny_cfg, random_state):
    """A timm hub folder of ``model.safetensors`` needs no torch in the JAX twin: timm's own reading of its
    config.json is skipped where torch is blocked, not an error."""
    save_checkpoint(files / "hub", tiny_cfg, random_state(tiny_cfg), "timm")
    proc = vit(TORCH, "attention", "--checkpoint", files / "hub", files / "imgs" / "a", "--out", files / "att")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list((files / "att").glob("*_attention.json"))) == 2


@pytest.mark.parametrize("args", [["train", "--epochs", "1"], ["predict", "m.safetensors", "imgs"]])
def test_a_missing_framework_is_one_line_naming_the_extra(files, args):
    proc = vit(JAX, *[files / a if a in ("m.safetensors", "imgs") else a for a in args])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"vit {args[0]}: error: this needs jax, which is not installed: {install_hint('jax')}"
    ], proc.stderr
