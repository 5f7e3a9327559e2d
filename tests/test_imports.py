"""Imports point down: vit_common imports neither framework, each twin only its own (subprocess)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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
        ("import vit_jax.train, vit_jax.data, vit_jax.finetune, vit_jax.run", TORCH_MODULES),
        ("import vit_cli.main as m; m.build_parser()", JAX_MODULES + TORCH_MODULES),
    ],
)
def test_import_isolation(statement, forbidden):
    loaded = _loaded_after(statement)
    assert not loaded & set(forbidden), f"{statement!r} loaded {sorted(loaded & set(forbidden))}"
    assert "numpy" in loaded  # the probe itself works


JAX_FAMILY = {"jax", "jaxlib", "flax", "optax", "orbax", "grain", "vit_jax"}
TORCH_FAMILY = {"torch", "torchvision", "timm", "transformers", "vit_torch"}


def _imported(node) -> set[str]:
    """Top-level package names imported anywhere under ``node`` (an ast node)."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            names |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names.add(n.module.split(".")[0])
    return names


def test_tests_need_one_framework_and_parity_tests_two():
    """The rule of README's Layout: a file of tests/ (its subfolders too) imports at most one framework
    (JAX's family or torch's, its twin included) at its top and in any one function; both, or a twin and
    its reference library, is a parity test (parity_tests/)."""
    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "tests").rglob("*.py"))
    assert any(p.parent != root / "tests" for p in files)  # the subfolders are read too
    both = []
    for path in files:
        tree = ast.parse(path.read_text())
        top = _imported(ast.Module([n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], []))
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for scope in [top, *(top | _imported(f) for f in functions)]:
            if scope & JAX_FAMILY and scope & TORCH_FAMILY:
                both.append(f"{path.relative_to(root)}: {sorted(scope & (JAX_FAMILY | TORCH_FAMILY))}")
                break
    assert not both, both


ROOTS = ("vit_common", "vit_jax", "vit_torch", "vit_cli", "benchmarks")


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere in it (function bodies too), by module name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ROOTS:
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            }
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in ROOTS}
    return found & modules


def test_no_import_cycle():
    """No module of the project imports (at its top or inside a function: a function-level import is
    how a circle hides) a module that imports it back, directly or through others."""
    root = Path(__file__).resolve().parents[1]
    files = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for r in ROOTS
        for p in (root / r).rglob("*.py")
    }
    graph = {m: _imports(p, set(files)) - {m} for m, p in files.items()}
    cycles = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for d in sorted(graph[node]):
                if d == start:
                    cycles.append(" -> ".join([*path, start]))
                elif d > start and d not in path:
                    stack.append((d, [*path, d]))
    assert not cycles, cycles
