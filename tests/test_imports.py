"""Imports point down: vit_common imports neither framework, each twin only its own (subprocess)."""

from __future__ import annotations

import subprocess
import sys

import pytest

JAX_MODULES = ("jax", "jaxlib", "flax", "optax", "orbax")
TORCH_MODULES = ("torch", "torchvision", "timm", "transformers")


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "statement, forbidden",
    [
        (
            "import vit_common, vit_common.checkpoints, vit_common.tolerance, vit_common.posemb, "
            "vit_common.data.images, vit_common.data.datasets, vit_common.data.train_config, "
            "vit_common.system.io, vit_common.system.validate, vit_cli.attention_maps",
            JAX_MODULES + TORCH_MODULES,
        ),
        ("import vit_torch", JAX_MODULES),
        ("import vit_jax", TORCH_MODULES),
        ("import vit_jax.train, vit_jax.data, vit_jax.finetune", TORCH_MODULES),
        ("import vit_cli.main as m; m.build_parser()", JAX_MODULES + TORCH_MODULES),
    ],
)
def test_import_isolation(statement, forbidden):
    loaded = _loaded_after(statement)
    assert not loaded & set(forbidden), f"{statement!r} loaded {sorted(loaded & set(forbidden))}"
    assert "numpy" in loaded  # the probe itself works
