"""google-research/vision_transformer checkpoints (.npz): the layout is described in ``formats.npz``."""

from vit_common.checkpoints.formats.npz import NpzFormat
from vit_common.data.images import PRESETS

FORMAT = NpzFormat(
    "original_vit",
    "original ViT (google-research/vision_transformer) .npz",
    (),
    "embedding/kernel with MultiHeadDotProductAttention_1 counters",
    PRESETS["big_vision"],
    "the original ViT's evaluation: [-1, 1], bilinear resize",
)
