"""Shared, framework-free core of the ViT twins: config, canonical state, position embeddings.

numpy and the standard library only; imports neither jax nor torch.
"""

from vit_common.config import VARIANTS, ViTConfig
from vit_common.state import StateMismatchError, canonical_shapes, check_state

__all__ = ["VARIANTS", "ViTConfig", "StateMismatchError", "canonical_shapes", "check_state"]
