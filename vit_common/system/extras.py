"""How to install an optional part of vit-twins, said the one way that works.

vit-twins is not on a package index, so ``pip install "vit-twins[jax]"`` finds nothing; an extra is
installed from a checkout of the repository (``pip install -e ".[jax]"``), or from a wheel built there
(``pip wheel --no-deps -w dist .``, then ``pip install "dist/vit_twins-VERSION-py3-none-any.whl[jax]"``).
"""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """The pip command that installs the optional dependencies ``extra`` (a pyproject.toml extra:
    'jax', 'torch', 'data', 'datasets', 'tfds', 'hub', 'wandb', 'lora', 'dev'), with where to run it."""
    return f'pip install -e ".[{extra}]" in a checkout of vit-twins'
