"""README's and docs/safety.md's "Hostile inputs" line reports this folder's counts: every test of it is one
input tried."""

from __future__ import annotations

import importlib
import math
import pkgutil
from pathlib import Path

from .harness import ROOT


def _tests(module) -> int:
    """How many tests pytest makes of ``module``'s test functions: each one's parametrize lists multiplied."""
    functions = [f for name, f in vars(module).items() if name.startswith("test_") and callable(f)]
    return sum(
        math.prod(len(m.args[1]) for m in getattr(f, "pytestmark", []) if m.name == "parametrize") for f in functions
    )


def counts() -> dict[str, int]:
    """What README reports: every input this folder tries (its tests but this module's), and the faults
    (each fails a test, so 0)."""
    here = Path(__file__)
    modules = [
        importlib.import_module(f".{m.name}", __package__)
        for m in pkgutil.iter_modules([str(here.parent)])
        if m.name.startswith("test_") and m.name != here.stem
    ]
    tried = sum(_tests(m) for m in modules)
    return {"inputs tried": tried, "crashes": 0, "hangs": 0, "silent results": 0, "data lost": 0}


def test_readme_reports_the_suites_counts():
    line = ", ".join(f"{k} {v}" for k, v in counts().items())
    for page in ("README.md", "docs/safety.md"):
        assert f"Hostile inputs ({line})" in (ROOT / page).read_text(), page
