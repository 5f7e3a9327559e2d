"""Fixtures of the cross-framework tests (both twins imported); the shared ones are in the root conftest."""

from __future__ import annotations

import jax
import pytest
import torch


@pytest.fixture
def x64():
    """Run the test with jax_enable_x64 on (float64 parity), off again afterwards."""
    with jax.enable_x64(True):
        yield


@pytest.fixture(autouse=True)
def _full_precision():
    """Pin full float32 matmul precision in both frameworks: no TF32 anywhere (a GPU's default TF32 makes
    ~1e-3 gaps that look like bugs)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with jax.default_matmul_precision("highest"):
        yield
