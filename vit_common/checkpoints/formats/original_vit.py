"""google-research/vision_transformer checkpoints (.npz): the layout is described in ``formats.npz``."""

from vit_common.checkpoints.formats.npz import NpzFormat

FORMAT = NpzFormat("original_vit", "original ViT (google-research/vision_transformer) .npz", ())
