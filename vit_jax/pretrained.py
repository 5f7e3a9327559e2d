"""Saved or pretrained weights into the JAX twin: ``load_model`` (a file or folder of any format
``vit_common.checkpoints.convert`` reads, orbax included) and ``from_timm`` (a timm model by name).

Imports run one way: this module -> ``vit_jax.formats`` (orbax and the readers) -> ``vit_jax.weights`` (the model <->
the canonical state).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from vit_common.checkpoints.convert import read_checkpoint
from vit_jax.formats import READERS
from vit_jax.model import VisionTransformer
from vit_jax.torch_bridge import write_timm_model
from vit_jax.weights import from_numpy


def load_model(path, *, image_size=None, num_classes=None, sharding=None, **overrides) -> VisionTransformer:
    """Load any supported checkpoint file or folder (``vit_common.checkpoints.convert.FORMATS``; PyTorch .pth/.bin
    files need torch: convert them first) into the JAX twin, in eval mode.

    ``image_size`` resamples the position embedding to that size at load time; ``num_classes`` replaces
    a head of another size with a zero one; ``overrides`` replace config fields (``dtype="bfloat16"``,
    ``attn_impl="explicit"``, ``num_heads=12``, ...) or are ``load_checkpoint``'s other keywords
    (``fmt=`` to force a format, ``source_image_size=(H, W)``, ``strict=True`` to refuse any assumed
    field). Assumed fields are issued as UserWarnings. See ``vit_common.checkpoints.convert.load_checkpoint`` for
    the errors raised.

    The file is read lazily (memory-mapped where its format allows) and each tensor copied once into the
    model, so loading holds the model's bytes plus about one tensor, not two copies of the state.
    ``sharding(path, shape) -> jax.sharding.Sharding`` places each parameter as it is read, each device's
    block alone (``vit_jax.weights.from_numpy``).
    """
    cfg, state = read_checkpoint(
        path, image_size=image_size, num_classes=num_classes, readers=READERS, lazy=True, **overrides
    )
    return from_numpy(cfg, state, sharding=sharding)


def from_timm(name: str, pretrained: bool = False, **kwargs) -> VisionTransformer:
    """The JAX twin of ``timm.create_model(name, pretrained=pretrained, **kwargs)``, through timm's own
    loader (``pretrained=True`` downloads its weights).

    timm needs torch, which vit_jax never imports: a child process (``vit_jax.torch_bridge.write_timm_model``)
    builds the timm model, checks the torch twin against it and writes a timm ``.safetensors`` whose
    header holds the config; it is read here with ``strict=True``.

    Raises:
        ValueError: the child's error (an unknown name, a model the twins do not implement), verbatim.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name.replace('/', '_')}.safetensors"
        write_timm_model(name, out, pretrained, kwargs)
        return load_model(out, strict=True)
