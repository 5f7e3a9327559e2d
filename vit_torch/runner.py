"""Run the torch twin on numpy images at full precision: logits of batches, intermediates of a batch.

Mirrors ``vit_jax.runner`` (the same three names and signatures), so that code running either twin
on the same images writes one line per twin. Images are numpy [B, H, W, C] (normalised as
``vit_common.data.images.normalize``), transposed to torch's [B, C, H, W] here and moved to the model's
device; results come back as numpy arrays on the host. ``full_precision`` restores what it changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from vit_torch.weights import tensor_to_numpy


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Within the block: CUDA matmuls and cuDNN convolutions at full float32 precision (TF32 off:
    ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``; TF32 rounds
    inputs to 10 mantissa bits, ~1e-3 relative). The process-wide flags are set back to what they were
    on exit, exception or not. CPU is always full precision."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _tensor(model: torch.nn.Module, images: np.ndarray) -> torch.Tensor:
    device = next(model.parameters()).device
    return torch.from_numpy(np.ascontiguousarray(np.asarray(images).transpose(0, 3, 1, 2))).to(device)


def logits(model: torch.nn.Module, batches: Iterable) -> Iterator[np.ndarray]:
    """Logits float32 [B, K] of ``model`` (eval mode, no grad) for each batch [B, H, W, C], in
    ``full_precision``. A batch may be a NaFlex tuple (patches, patch_mask, spatial_shapes)
    (``vit_common.naflex``)."""
    device = next(model.parameters()).device
    with full_precision(), torch.no_grad():
        for x in batches:
            if isinstance(x, tuple):
                patches, mask, shapes = x
                out = model(torch.from_numpy(patches).to(device), patch_mask=mask, spatial_shapes=shapes)
            else:
                out = model(_tensor(model, x))
            yield out.float().cpu().numpy()


def intermediates(model: torch.nn.Module, images) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(logits [B, K], {key: array}) of ``model.forward_intermediates`` on ``images`` [B, H, W, C] or a
    NaFlex tuple (patches, patch_mask, spatial_shapes), in ``full_precision`` with no grad; keys whose
    value is None (absent in this model) are left out. Arrays keep the model's dtype (bfloat16 as
    ``ml_dtypes.bfloat16``, ``vit_torch.weights.tensor_to_numpy``)."""
    with full_precision(), torch.no_grad():
        if isinstance(images, tuple):
            patches, mask, shapes = images
            device = next(model.parameters()).device
            x = torch.from_numpy(patches).to(device)
            out, inter = model.forward_intermediates(x, patch_mask=mask, spatial_shapes=shapes)
        else:
            out, inter = model.forward_intermediates(_tensor(model, images))
    return tensor_to_numpy(out), {k: tensor_to_numpy(v) for k, v in inter.items() if v is not None}
