"""Shared fixtures for cross-framework tests (both twins imported)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch


@pytest.fixture
def x64():
    """Run the test with jax_enable_x64 on (float64 parity), off again afterwards."""
    with jax.enable_x64(True):
        yield


@pytest.fixture(autouse=True)
def _full_precision():
    """Pin full float32 matmul precision in both frameworks (K07): no TF32 anywhere."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with jax.default_matmul_precision("highest"):
        yield


def images_nchw(batch: int, hw: tuple[int, int], chans: int = 3, dtype=np.float32, seed: int = 0) -> np.ndarray:
    """Deterministic standard-normal images [B, C, H, W]."""
    return np.random.default_rng(seed).standard_normal((batch, chans, *hw)).astype(dtype)
