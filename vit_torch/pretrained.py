"""Saved or pretrained weights into the torch twin: ``load_model`` (a file or folder of any format
``vit_common.checkpoints.convert`` reads, PyTorch .pth/.bin included).

Imports run one way: this module -> ``vit_torch.formats`` (the PyTorch containers) -> ``vit_torch.weights``
(the model <-> the canonical state).
"""

from __future__ import annotations

import torch

from vit_common.checkpoints.convert import read_checkpoint
from vit_torch.formats import READERS
from vit_torch.model import VisionTransformer
from vit_torch.weights import from_numpy


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

    The file is read lazily (memory-mapped where its format allows) into a model built on the meta
    device, each tensor copied once, so loading holds the model's bytes, not two copies of the state.
    """
    cfg, state = read_checkpoint(
        path, image_size=image_size, num_classes=num_classes, readers=READERS, lazy=True, **overrides
    )
    return from_numpy(cfg, state, device=device)
