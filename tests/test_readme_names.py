"""Every Python name README.md gives of this project (``from vit_x import y``, ``vit_x.module.name``) exists,
so a snippet a reader copies does not stop at an ImportError; so does every file it names by its path."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
FROM_IMPORTS = sorted(
    {
        f"{module}.{name.strip()}"
        for module, names in re.findall(r"from (vit_\w+(?:\.\w+)*) import ([\w, ]+)", README)
        for name in names.split(",")
        if name.strip()
    }
)
DOTTED = sorted(
    set(re.findall(r"\b((?:vit_jax|vit_torch|vit_common|vit_compare|vit_cli|benchmarks)(?:\.\w+)+)", README))
)


def resolve(dotted: str) -> object:
    """The object ``dotted`` names: its longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("dotted", sorted(set(FROM_IMPORTS) | set(DOTTED)))
def test_readme_names_exist(dotted):
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"README.md names {dotted}, which does not exist: {e}")


def test_readme_names_were_found():
    assert "vit_common.data.datasets.load_dataset" in FROM_IMPORTS and "vit_jax.data.train_iterator" in FROM_IMPORTS
    assert len(DOTTED) > 10


PATHS = sorted(set(re.findall(r"\b((?:vit_\w+|benchmarks|tests|parity_tests|docs)/[\w/]*\w\.(?:py|md|png))\b", README)))


def test_readme_paths_exist():
    """Every file README.md names by its path (``vit_compare/inference.py``, ``docs/known_faults.md``) is there."""
    root = Path(__file__).resolve().parents[1]
    assert len(PATHS) > 10 and "vit_compare/inference.py" in PATHS
    missing = [p for p in PATHS if not (root / p).is_file()]
    assert not missing, missing
