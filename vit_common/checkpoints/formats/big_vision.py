"""google-research/big_vision ViT checkpoints (.npz): the layout is described in ``formats.npz``."""

from vit_common.checkpoints.formats.npz import NpzFormat
from vit_common.data.images import PRESETS

FORMAT = NpzFormat(
    "big_vision",
    "big_vision (google-research/big_vision) ViT .npz",
    (".npz",),
    "embedding/kernel with MultiHeadDotProductAttention_0 counters",
    PRESETS["big_vision"],
    "big_vision value_range(-1, 1), bilinear resize",
)
