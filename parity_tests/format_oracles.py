"""Shared helpers for the format parity tests: run both twins and compare with an oracle's logits."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

import vit_jax
import vit_torch
from vit_common.convert import load_checkpoint
from vit_common.tolerance import compare
from vit_jax.formats import READERS as JAX_READERS
from vit_torch.formats import READERS as TORCH_READERS


def twin_logits(path, images_nchw: np.ndarray, **load_options) -> tuple[np.ndarray, np.ndarray]:
    """(JAX twin logits, torch twin logits) of the checkpoint at ``path`` (any format: read once with
    both frameworks' readers, since vit_jax.load_model cannot read .pth nor vit_torch.load_model orbax)."""
    ckpt = load_checkpoint(path, readers={**TORCH_READERS, **JAX_READERS}, **load_options)
    mj = vit_jax.from_numpy(ckpt.cfg, ckpt.state)
    mt = vit_torch.from_numpy(ckpt.cfg, ckpt.state)
    lj = np.asarray(nnx.jit(lambda m, x: m(x))(mj, jnp.asarray(images_nchw.transpose(0, 2, 3, 1))))
    with torch.no_grad():
        lt = mt(torch.from_numpy(images_nchw)).numpy()
    return lj, lt


def assert_twins_match(path, images_nchw: np.ndarray, reference: np.ndarray, **load_options) -> None:
    """Both twins' float32 logits equal ``reference`` within the table's float32 bound."""
    lj, lt = twin_logits(path, images_nchw, **load_options)
    for name, got in (("jax", lj), ("torch", lt)):
        c = compare(f"{name} logits", got, reference, "tensor", "float32")
        assert c.ok, c


def perturb_(module: torch.nn.Module, seed: int = 0, scale: float = 0.02) -> torch.nn.Module:
    """Add seeded noise to every parameter, so that zero biases, unit norms and LayerScale gammas all
    carry information a converter could lose."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module.eval()
