"""The PyTorch twin: images [B, C, H, W]; its state_dict is timm's."""

from vit_common.config import VARIANTS, ViTConfig
from vit_torch.model import VisionTransformer
from vit_torch.weights import from_numpy, load_model, to_numpy

__all__ = ["VARIANTS", "ViTConfig", "VisionTransformer", "from_numpy", "load_model", "to_numpy"]
