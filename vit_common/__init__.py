"""Shared, framework-free core of the ViT twins (numpy and the standard library; imports neither jax nor
torch).

The top of the package is the schema both twins need: ``config`` (``ViTConfig``, the variant table),
``state`` (the canonical flat state in timm's names), ``posemb`` (position-embedding resampling) and
``tolerance`` (the one table of parity bounds). The sub-packages do the other jobs: ``checkpoints``
(every file format, conversion, provenance), ``data`` (images, datasets), ``training`` (the training
configuration and the optimizer recipes) and ``system`` (safe writes, validation, host memory).
"""

from vit_common.config import VARIANTS, ViTConfig
from vit_common.state import StateMismatchError, canonical_shapes, check_state

__all__ = ["VARIANTS", "ViTConfig", "StateMismatchError", "canonical_shapes", "check_state"]
