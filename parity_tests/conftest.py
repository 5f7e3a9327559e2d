"""Fixtures of the cross-framework tests (both twins, or a twin and its reference library: the rule of
README's Layout, held for tests/ by tests/test_imports.py); the shared ones are in the root conftest."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
import pytest

import vit_jax.runner
import vit_torch.runner


@pytest.fixture
def x64():
    """Run the test with jax_enable_x64 on (float64 parity), off again afterwards."""
    with jax.enable_x64(True):
        yield


@pytest.fixture(autouse=True)
def _full_precision():
    """Pin full float32 matmul precision in both frameworks: no TF32 anywhere (a GPU's default TF32 makes
    ~1e-3 gaps that look like bugs); the twins' runners restore the settings after the test."""
    with vit_torch.runner.full_precision(), vit_jax.runner.full_precision():
        yield


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Environment of `vit train` subprocesses: this checkout on the path, one persistent compilation cache
    per test module (only the first run compiles; a cached executable is the same program, so results
    stay bit-exact) and XLA:CPU optimisation level 0 (compiles twice as fast; the same in every run)."""
    cache = tmp_path_factory.mktemp("jax_cache")
    return {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "XLA_FLAGS": "--xla_backend_optimization_level=0",
    }


@pytest.fixture(scope="module")
def npz(tmp_path_factory) -> Path:
    """28 tiny 8x8 images of 3 classes (a class-dependent bright stripe, so a model can learn something)."""
    rng = np.random.default_rng(0)
    y = np.arange(28) % 3
    x = rng.integers(0, 60, (28, 8, 8), dtype=np.uint8)
    for k in range(3):
        x[y == k, 2 * k : 2 * k + 3] += 150
    path = tmp_path_factory.mktemp("data") / "tiny.npz"
    np.savez(path, x=x, y=y)
    return path
