"""The JAX twin <-> the canonical state (flat numpy dict, timm names, PyTorch layouts).

NNX module paths are timm's, so conversion is one rule per leaf kind:
Linear ``kernel`` (in, out) <-> ``weight`` (out, in); Conv ``kernel`` HWIO <-> ``weight`` OIHW;
LayerNorm ``scale`` <-> ``weight``; every other parameter keeps its name and layout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_common.checkpoints.convert import read_checkpoint
from vit_common.config import ViTConfig
from vit_common.state import canonical_shapes, check_state
from vit_jax.model import VisionTransformer


def _canonical_name(path: tuple) -> tuple[str, str]:
    """NNX path -> (canonical name, leaf kind)."""
    *mods, leaf = (str(p) for p in path)
    kind = {"kernel": "kernel", "scale": "scale"}.get(leaf, "plain")
    return ".".join(mods + ["weight" if kind != "plain" else leaf]), kind


def _to_canonical(arr: np.ndarray, kind: str) -> np.ndarray:
    if kind == "kernel":
        arr = arr.T if arr.ndim == 2 else arr.transpose(3, 2, 0, 1)  # (in, out) | HWIO -> OIHW
    return np.ascontiguousarray(arr)


def _from_canonical(arr: np.ndarray, kind: str) -> np.ndarray:
    if kind == "kernel":
        arr = arr.T if arr.ndim == 2 else arr.transpose(2, 3, 1, 0)  # (out, in) | OIHW -> HWIO
    return arr


def _param_paths(state: nnx.State) -> list[tuple[tuple, object]]:
    return list(nnx.to_flat_state(state))


def params_to_numpy(cfg: ViTConfig, params: nnx.State) -> dict[str, np.ndarray]:
    """A parameter-shaped State (the parameters, or their gradients) -> canonical names and layouts.

    Arrays keep their dtype (bfloat16 as ml_dtypes.bfloat16), in ``canonical_shapes(cfg)`` order.
    """
    out = {}
    for path, var in _param_paths(params):
        name, kind = _canonical_name(path)
        out[name] = _to_canonical(np.asarray(jax.device_get(var[...])), kind)
    order = canonical_shapes(cfg)
    return {k: out[k] for k in order if k in out} | {k: v for k, v in out.items() if k not in order}


def to_numpy(model: VisionTransformer) -> dict[str, np.ndarray]:
    """The canonical state of ``model``: {timm name: numpy array in PyTorch layout}, contiguous."""
    return params_to_numpy(model.cfg, nnx.state(model, nnx.Param))


def check_float64(cfg: ViTConfig) -> None:
    """Raise ValueError if cfg asks for float64 while jax_enable_x64 is off (JAX would silently use 32)."""
    if "float64" in (cfg.dtype, cfg.param_dtype) and not jax.config.jax_enable_x64:
        raise ValueError(
            f"dtype={cfg.dtype!r}, param_dtype={cfg.param_dtype!r} need float64, but jax_enable_x64 is off; "
            "call jax.config.update('jax_enable_x64', True) first"
        )


def from_numpy(cfg: ViTConfig, state: Mapping[str, np.ndarray], *, seed: int = 0) -> VisionTransformer:
    """Build a VisionTransformer for ``cfg`` holding exactly the tensors of ``state``, in eval mode.

    The model is built abstractly (``nnx.eval_shape``), so no random parameters are drawn; each
    parameter is filled from its canonical tensor and cast to ``cfg.param_dtype``. ``seed`` seeds the
    dropout/drop-path RNG streams only.

    Raises:
        StateMismatchError: lists every missing, unexpected and wrong-shape tensor together.
        ValueError: float64 requested while jax_enable_x64 is off.
    """
    check_float64(cfg)
    check_state(canonical_shapes(cfg), state)
    graphdef, params, rest = nnx.split(
        nnx.eval_shape(lambda: VisionTransformer(cfg, rngs=nnx.Rngs(seed))), nnx.Param, ...
    )
    pd = jnp.dtype(cfg.param_dtype)
    flat = []
    for path, var in _param_paths(params):
        name, kind = _canonical_name(path)
        flat.append((path, var.replace(jnp.asarray(_from_canonical(np.asarray(state[name]), kind), pd))))
    params = nnx.from_flat_state(flat)
    # RNG streams: build the model under jit and keep only the non-parameter state, so XLA drops the
    # random parameter initialisation as dead code.
    rest = (
        jax.jit(lambda: nnx.state(VisionTransformer(cfg, rngs=nnx.Rngs(seed)), nnx.Not(nnx.Param)))()
        if len(nnx.to_flat_state(rest))
        else rest
    )
    model = nnx.merge(graphdef, params, rest)
    model.eval()
    return model


def load_model(path, *, image_size=None, num_classes=None, **overrides) -> VisionTransformer:
    """Load any supported checkpoint file or folder (``vit_common.checkpoints.convert.FORMATS``; PyTorch .pth/.bin
    files need torch: convert them first) into the JAX twin, in eval mode.

    ``image_size`` resamples the position embedding to that size at load time; ``num_classes`` replaces
    a head of another size with a zero one; ``overrides`` replace config fields (``dtype="bfloat16"``,
    ``attn_impl="explicit"``, ``num_heads=12``, ...) or are ``load_checkpoint``'s other keywords
    (``fmt=`` to force a format, ``source_image_size=(H, W)``, ``strict=True`` to refuse any assumed
    field). Assumed fields are issued as UserWarnings. See ``vit_common.checkpoints.convert.load_checkpoint`` for
    the errors raised.
    """
    from vit_jax.formats import READERS

    cfg, state = read_checkpoint(path, image_size=image_size, num_classes=num_classes, readers=READERS, **overrides)
    return from_numpy(cfg, state)


def from_timm(name: str, pretrained: bool = False, **kwargs) -> VisionTransformer:
    """The JAX twin of ``timm.create_model(name, pretrained=pretrained, **kwargs)``, through timm's own
    loader (``pretrained=True`` downloads its weights).

    timm needs torch, which vit_jax never imports: a child process (``python -m vit_torch.timm_models``)
    builds the timm model, checks the torch twin against it and writes a timm ``.safetensors`` whose
    header holds the config; it is read here with ``strict=True``.

    Raises:
        ValueError: the child's error (an unknown name, a model the twins do not implement), verbatim.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name.replace('/', '_')}.safetensors"
        cmd = [sys.executable, "-m", "vit_torch.timm_models", name, str(out), "--kwargs", json.dumps(kwargs)]
        done = subprocess.run(cmd + ["--pretrained"] * pretrained, capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"timm model {name!r}: {done.stderr.strip().splitlines()[-1] if done.stderr else done}")
        return load_model(out, strict=True)
