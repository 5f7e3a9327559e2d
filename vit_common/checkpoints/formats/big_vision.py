"""google-research/big_vision ViT checkpoints (.npz): the layout is described in ``formats.npz``."""

from vit_common.checkpoints.formats.npz import NpzFormat

FORMAT = NpzFormat("big_vision", "big_vision (google-research/big_vision) ViT .npz", (".npz",))
