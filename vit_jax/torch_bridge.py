"""The one place the JAX twin asks PyTorch for something: a child process, ``python -m
vit_torch.timm_models`` (timm needs torch, which vit_jax never imports), whose answer is read back here.

``read_timm_hub_config(folder)``: the ViTConfig timm builds from a timm hub folder (``READERS["timm"]`` of
``vit_jax.formats``); ``write_timm_model(name, out, ...)``: a timm model by name, checked against the
torch twin and written as a timm ``.safetensors`` whose header holds the config (``vit_jax.from_timm``).
The child's command line is ``vit_torch.timm_models.main``'s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.stored_config import config_from_json
from vit_common.config import ViTConfig


def _child(*args: str) -> list[str]:
    """The child's command: this Python running ``vit_torch.timm_models`` with ``args``."""
    return [sys.executable, "-m", "vit_torch.timm_models", *args]


def _installed(name: str) -> bool:
    """Whether ``name`` can be imported: False where it is absent or blocked (``sys.modules[name] = None``,
    or an import hook refusing it), which ``importlib.util.find_spec`` reports by raising."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def read_timm_hub_config(folder: str | os.PathLike) -> ViTConfig | None:
    """The ViTConfig timm builds from a timm hub folder, read in a child process
    (``python -m vit_torch.timm_models local-dir:FOLDER --config``: timm needs torch, which vit_jax never
    imports), or None when timm or torch is not installed.

    Raises:
        FormatError: the child's error (a model timm cannot build or the twins lack), its last line.
    """
    if not (_installed("timm") and _installed("torch")):
        return None
    done = subprocess.run(_child(f"local-dir:{folder}", "--config"), capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise FormatError(f"{folder}: {last.removeprefix('python -m vit_torch.timm_models: error: ')}")
    return config_from_json(lines[-1], f"{folder} (read by timm)")[0]


def write_timm_model(name: str, out: Path, pretrained: bool = False, kwargs: dict | None = None) -> None:
    """``timm.create_model(name, pretrained=pretrained, **kwargs)`` built in a child process (``python -m
    vit_torch.timm_models NAME OUT``), checked against the torch twin there and written to ``out``, a
    timm ``.safetensors`` whose header holds the config (``pretrained=True`` downloads timm's weights).

    Raises:
        ValueError: the child's error (an unknown name, a model the twins do not implement), verbatim.
    """
    cmd = _child(name, str(out), "--kwargs", json.dumps(kwargs or {}))
    done = subprocess.run(cmd + ["--pretrained"] * pretrained, capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"timm model {name!r}: {done.stderr.strip().splitlines()[-1] if done.stderr else done}")
