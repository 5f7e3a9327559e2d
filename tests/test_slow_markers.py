"""The fast loop (``pytest -m "not slow"``, docs/contributors.md) runs a part of every test file: each file
of tests/ and parity_tests/ keeps at least one test function outside ``slow``, and the marker is used (a
marker declared and never used gives no fast loop). Read from the sources, so this test costs no imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for d in ("tests", "parity_tests") for p in (ROOT / d).rglob("test_*.py"))


def _is_slow(node: ast.expr) -> bool:
    """``pytest.mark.slow`` (or a list holding it, as a module's ``pytestmark``)."""
    if isinstance(node, ast.List | ast.Tuple):
        return any(_is_slow(e) for e in node.elts)
    return isinstance(node, ast.Attribute) and node.attr == "slow" and ast.unparse(node) == "pytest.mark.slow"


def _tests(path: Path) -> tuple[int, int]:
    """(test functions, those marked slow) of the file ``path``; a module-level ``pytestmark`` of slow marks
    them all."""
    tree = ast.parse(path.read_text())
    module_slow = any(
        isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets) and _is_slow(n.value)
        for n in tree.body
    )
    helpers = {  # ``name.__test__ = False``: a helper pytest does not collect
        t.value.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute) and t.attr == "__test__" and isinstance(t.value, ast.Name)
    }
    functions = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_") and n.name not in helpers
    ]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        functions += [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    slow = sum(module_slow or any(_is_slow(d) for d in f.decorator_list) for f in functions)
    return len(functions), slow


def test_is_slow_reads_the_marker():
    assert _is_slow(ast.parse("pytest.mark.slow", mode="eval").body)
    assert _is_slow(ast.parse("[pytest.mark.slow, pytest.mark.x]", mode="eval").body)
    assert not _is_slow(ast.parse("pytest.mark.skip", mode="eval").body)


@pytest.mark.slow
def test_every_test_file_keeps_a_test_outside_slow():
    counts = {p.relative_to(ROOT).as_posix(): _tests(p) for p in FILES}
    assert len(counts) > 50
    assert [f for f, (n, slow) in counts.items() if n and slow == n] == [], "files whose every test is slow"
    assert sum(slow for _, slow in counts.values()) >= 10, "the slow marker is hardly used"
