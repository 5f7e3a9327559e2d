"""Checkpoints: every supported format read into, and written from, the canonical state.

This package's top is the API; ``formats`` is the registry (one module and one ``Format`` object per
format), ``convert`` the dispatch through it, ``metadata`` what a file says about its inputs and outputs
(preprocessing, class names), ``hub`` the Hugging Face hub ids. Framework-free: the two containers
that need a framework (torch pickles, orbax) are read and written through callables the twins provide
(``vit_torch.formats``, ``vit_jax.formats``).

- ``open_checkpoint(path) -> Source`` (the container, found from its contents; pass it on to open it once;
  ``path`` may be a hub model id ``hf-hub:ORG/NAME[@REVISION]``, resolved by ``hub`` through
  huggingface_hub's cache)
- ``load_checkpoint(path or Source, ...) -> Checkpoint`` (config, canonical state, report with provenance,
  ``ModelInfo``: preprocessing and class names, with provenance)
- ``read_checkpoint(path, ...) -> (ViTConfig, state)``
- ``save_checkpoint(path, cfg, state, fmt=..., options=...)`` (``options``: the format's ``WriteOptions``)
- ``convert(src, dst, ...)``
- ``REGISTRY`` (``registry``): every format's object, which answers what depends on the format
"""

from vit_common.checkpoints.convert import (
    FORMATS,
    Checkpoint,
    convert,
    load_checkpoint,
    needs,
    open_checkpoint,
    output_format,
    read_checkpoint,
    save_checkpoint,
)
from vit_common.checkpoints.metadata import ModelInfo
from vit_common.checkpoints.registry import REGISTRY

__all__ = [
    "FORMATS",
    "Checkpoint",
    "REGISTRY",
    "ModelInfo",
    "convert",
    "load_checkpoint",
    "needs",
    "open_checkpoint",
    "output_format",
    "read_checkpoint",
    "save_checkpoint",
]
