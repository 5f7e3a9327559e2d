"""The PyTorch twin: images [B, C, H, W]; its state_dict is timm's."""

from vit_common.config import VARIANTS, ViTConfig
from vit_torch.model import VisionTransformer
from vit_torch.pretrained import load_model
from vit_torch.weights import from_numpy, to_numpy


def from_timm(name: str, pretrained: bool = False, **kwargs):
    """The torch twin of ``timm.create_model(name, pretrained=pretrained, **kwargs)`` (timm's own loader;
    see ``vit_torch.timm_models``). Raises FormatError for models the twins do not implement."""
    from vit_torch.timm_models import from_timm as build

    return build(name, pretrained, **kwargs)


__all__ = ["VARIANTS", "ViTConfig", "VisionTransformer", "from_numpy", "from_timm", "load_model", "to_numpy"]
