"""Fixtures of every test: `vit train` runs inside the tests compile into a per-session cache, not the
user's (~/.cache/vit-twins/jax), unless JAX_COMPILATION_CACHE_DIR already names one."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_compile_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as m:
        if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            m.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax_cache")))
        yield
