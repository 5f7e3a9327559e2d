"""Checkpoints: every supported format read into, and written from, the canonical state.

This package's top is the API; ``formats`` is the registry (one module and one ``Format`` object per
format), ``convert`` the dispatch through it, ``metadata`` what a file says about its inputs and outputs
(preprocessing, class names). Framework-free: the two containers that need a framework (torch pickles,
orbax) are read and written through callables the twins provide (``vit_torch.formats``,
``vit_jax.formats``).

- ``load_checkpoint(path, ...) -> Checkpoint`` (config, canonical state, provenance, report)
- ``read_checkpoint(path, ...) -> (ViTConfig, state)``
- ``save_checkpoint(cfg, state, path, fmt=...)``
- ``convert(src, dst, ...)``
- ``read_info(path, family) -> ModelInfo`` (preprocessing and class names, with provenance)
"""

from vit_common.checkpoints.convert import (
    FORMATS,
    Checkpoint,
    convert,
    load_checkpoint,
    needs,
    output_format,
    read_checkpoint,
    save_checkpoint,
)
from vit_common.checkpoints.metadata import ModelInfo, read_info

__all__ = [
    "FORMATS",
    "Checkpoint",
    "ModelInfo",
    "convert",
    "load_checkpoint",
    "needs",
    "output_format",
    "read_checkpoint",
    "read_info",
    "save_checkpoint",
]
