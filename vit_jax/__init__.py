"""The Flax NNX twin: images [B, H, W, C]."""

from vit_common.config import VARIANTS, ViTConfig
from vit_jax.model import VisionTransformer
from vit_jax.pretrained import from_timm, load_model
from vit_jax.weights import from_numpy, to_numpy

__all__ = ["VARIANTS", "ViTConfig", "VisionTransformer", "from_numpy", "from_timm", "load_model", "to_numpy"]
