"""The house's size rules (README's Layout): every library module fits a reader's sitting, and a
module's name says which one it is within its package tree."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("vit_common", "vit_jax", "vit_torch", "vit_compare", "vit_cli", "benchmarks")
MAX_LINES = 600


@pytest.mark.parametrize("package", LIBRARIES)
def test_no_library_module_is_over_600_lines(package):
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules, package
    long = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split at the module's seams): {long}"


@pytest.mark.parametrize("package", LIBRARIES)
def test_no_two_modules_of_a_package_tree_share_a_name(package):
    """The twins' mirrored names (vit_jax/model.py and vit_torch/model.py) are two trees, as intended."""
    names = Counter(p.name for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py")
    assert not {n: c for n, c in names.items() if c > 1}
