"""The PyTorch twin <-> the canonical state (flat numpy dict, timm names, PyTorch layouts).

The twin's state_dict is the canonical state itself; this module only moves tensors between numpy
and torch, bfloat16 included (as ml_dtypes.bfloat16, bit for bit).
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_dtypes
import numpy as np
import torch

from vit_common.checkpoints.convert import read_checkpoint
from vit_common.config import ViTConfig
from vit_common.state import canonical_shapes, check_state
from vit_torch.model import VisionTransformer


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A contiguous numpy copy of ``t`` (bfloat16 -> ml_dtypes.bfloat16, bit-exact)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def numpy_to_tensor(a: np.ndarray) -> torch.Tensor:
    """A torch tensor holding ``a`` (ml_dtypes.bfloat16 -> torch.bfloat16, bit-exact)."""
    a = np.ascontiguousarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def to_numpy(model: VisionTransformer) -> dict[str, np.ndarray]:
    """The canonical state of ``model``: its state_dict as contiguous numpy arrays."""
    return {k: tensor_to_numpy(v) for k, v in model.state_dict().items()}


def from_numpy(
    cfg: ViTConfig, state: Mapping[str, np.ndarray], *, device: str | torch.device = "cpu"
) -> VisionTransformer:
    """Build a VisionTransformer for ``cfg`` holding exactly the tensors of ``state``, in eval mode.

    The model is built on the meta device (no random init) and filled with ``state`` cast to
    ``cfg.param_dtype``.

    Raises:
        StateMismatchError: lists every missing, unexpected and wrong-shape tensor together.
    """
    check_state(canonical_shapes(cfg), state)
    with torch.device("meta"):
        model = VisionTransformer(cfg)
    pd = getattr(torch, cfg.param_dtype)
    tensors = {k: numpy_to_tensor(np.asarray(v)).to(device=device, dtype=pd) for k, v in state.items()}
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.eval()


def load_model(
    path, *, image_size=None, num_classes=None, device: str | torch.device = "cpu", **overrides
) -> VisionTransformer:
    """Load any supported checkpoint file or folder (``vit_common.checkpoints.convert.FORMATS``; orbax folders need
    jax: convert them first) into the torch twin, in eval mode.

    ``image_size`` resamples the position embedding to that size at load time; ``num_classes`` replaces
    a head of another size with a zero one; ``overrides`` replace config fields (``dtype="bfloat16"``,
    ``attn_impl="explicit"``, ``num_heads=12``, ...) or are ``load_checkpoint``'s other keywords
    (``fmt=`` to force a format, ``source_image_size=(H, W)``, ``strict=True`` to refuse any assumed
    field). Assumed fields are issued as UserWarnings. See ``vit_common.checkpoints.convert.load_checkpoint`` for
    the errors raised.
    """
    from vit_torch.formats import READERS

    cfg, state = read_checkpoint(path, image_size=image_size, num_classes=num_classes, readers=READERS, **overrides)
    return from_numpy(cfg, state, device=device)
