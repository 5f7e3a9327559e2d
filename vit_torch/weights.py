"""The PyTorch twin <-> the canonical state (flat numpy dict, timm names, PyTorch layouts).

The twin's state_dict is the canonical state itself; this module only moves tensors between numpy
and torch, bfloat16 included (as ml_dtypes.bfloat16, bit for bit).
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_dtypes
import numpy as np
import torch

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
