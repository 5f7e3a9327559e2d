"""Small configs and random canonical states for the format tests (numpy only)."""

from __future__ import annotations

import numpy as np

from vit_common.config import ViTConfig
from vit_common.state import canonical_shapes

SMALL = ViTConfig(image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)


def random_state(cfg: ViTConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """A canonical state of standard-normal tensors (every value distinct, so a swapped or transposed
    tensor cannot go unnoticed)."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in canonical_shapes(cfg).items()}


def assert_same_state(a: dict, b: dict) -> None:
    """Bit-exact equality: same keys, dtypes, shapes and bytes."""
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape, (k, x.dtype, y.dtype, x.shape, y.shape)
        assert x.tobytes() == y.tobytes(), k
