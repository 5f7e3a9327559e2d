"""Run a twin over image batches: the one place the CLI turns images into logits.

Images are numpy float32 [B, H, W, C] (normalised as ``vit_jax.data.normalize``); logits come back
as numpy float32 [B, K]. Matmuls run at full float32 precision in both frameworks (no TF32).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np


def jax_logits(model, batches: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    """Logits of the JAX twin (eval mode), one jit compilation for all equal-shaped batches."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    with jax.default_matmul_precision("highest"):
        for x in batches:
            yield np.asarray(forward(state, x), np.float32)


def torch_logits(model, batches: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    """Logits of the torch twin (eval mode, no grad); images are transposed to [B, C, H, W]."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = next(model.parameters()).device
    with torch.no_grad():
        for x in batches:
            t = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(device)
            yield model(t).float().cpu().numpy()


def load(path, framework: str, options=()):
    """``vit_jax.load_model`` or ``vit_torch.load_model`` of ``path`` (any supported format), with
    ``options``: config overrides and the other ``load_checkpoint`` keywords (``checkpoint_options``)."""
    if framework == "jax":
        from vit_jax import load_model
    elif framework == "torch":
        from vit_torch import load_model
    else:
        raise ValueError(f"framework={framework!r}: expected 'jax' or 'torch'")
    return load_model(path, **dict(options))


def logits(model, framework: str, batches: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    return (jax_logits if framework == "jax" else torch_logits)(model, batches)
