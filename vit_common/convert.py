"""One entry point for reading any supported checkpoint into (config, canonical state)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from vit_common.config import ViTConfig
from vit_common.formats.canonical import load_canonical


def read_checkpoint(path: str | os.PathLike, **overrides: Any) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """Read a checkpoint file or folder into (config, canonical state).

    ``overrides`` replace config fields that do not change tensor shapes (dtype, attn_impl, dropout...).

    Raises:
        ValueError: unreadable or unsupported file, naming the path.
    """
    cfg, state = load_canonical(path)
    return (cfg.replace(**overrides) if overrides else cfg), state
