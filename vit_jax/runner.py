"""Run the JAX twin on numpy images at full precision: logits of batches, intermediates of a batch.

Mirrors ``vit_torch.runner`` (the same three names and signatures), so that code running either twin
on the same images writes one line per twin. Images are numpy [B, H, W, C] (normalised as
``vit_common.data.images.normalize``); results come back as numpy arrays. ``full_precision`` changes only
context-local JAX settings, restored on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import jax
import numpy as np
from flax import nnx


@contextlib.contextmanager
def full_precision(x64: bool = False) -> Iterator[None]:
    """Within the block: matmuls and convolutions at full float32 precision (``jax.default_matmul_precision
    ("highest")``: no bfloat16 passes on TPU, no TF32 on GPU; CPU is always full precision) and, with
    ``x64``, float64 arrays (``jax.enable_x64``). Both are JAX's own context managers: the settings before
    the block are back after it, exception or not."""
    with jax.enable_x64(x64), jax.default_matmul_precision("highest"):
        yield


def _naflex_forward(graphdef, patch_mask: np.ndarray, spatial_shapes: np.ndarray):
    """The jitted forward of one NaFlex batch's mask and shapes (host constants of the trace)."""
    return jax.jit(lambda s, p: nnx.merge(graphdef, s)(p, patch_mask=patch_mask, spatial_shapes=spatial_shapes))


def logits(model, batches: Iterable) -> Iterator[np.ndarray]:
    """Logits float32 [B, K] of ``model`` (eval mode) for each batch [B, H, W, C], in ``full_precision``;
    one jit compilation for all equal-shaped batches. A batch may be a NaFlex tuple (patches, patch_mask,
    spatial_shapes) (``vit_common.naflex``): compiled for its mask and shapes, host constants."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    with full_precision():
        for x in batches:
            if isinstance(x, tuple):
                yield np.asarray(_naflex_forward(graphdef, *x[1:])(state, x[0]), np.float32)
            else:
                yield np.asarray(forward(state, x), np.float32)


def intermediates(model, images) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(logits [B, K], {key: array}) of ``model.forward_intermediates`` on ``images`` [B, H, W, C] or a
    NaFlex tuple (patches, patch_mask, spatial_shapes), in ``full_precision`` (float64 arrays on when the
    images are float64); keys whose value is None (absent in this model) are left out. Arrays keep the
    model's dtype."""
    x, naflex = images, {}
    if isinstance(images, tuple):  # NaFlex
        x, naflex = images[0], {"patch_mask": images[1], "spatial_shapes": images[2]}
    with full_precision(x64=np.asarray(x).dtype == np.float64):
        out, inter = model.forward_intermediates(jax.numpy.asarray(x), **naflex)
        return np.asarray(out), {k: np.asarray(v) for k, v in inter.items() if v is not None}
