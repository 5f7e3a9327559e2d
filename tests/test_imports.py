"""Imports point down: vit_common imports neither framework, each twin only its own (subprocess)."""

from __future__ import annotations

import ast
import functools
import json
import re
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


@pytest.mark.slow
@pytest.mark.parametrize(
    "statement, forbidden",
    [
        (
            "import vit_common, vit_common.checkpoints, vit_common.tolerance, vit_common.posemb, "
            "vit_common.data.images, vit_common.data.datasets, vit_common.data.batches, "
            "vit_common.training.train_config, vit_common.system.io, vit_common.system.validate, "
            "vit_common.system.host_devices, vit_common.attention_maps",
            JAX_MODULES + TORCH_MODULES,
        ),
        ("import vit_torch", JAX_MODULES),
        ("import vit_jax", TORCH_MODULES),
        (
            "import vit_jax.optim, vit_jax.trainer, vit_jax.checkpointing, vit_jax.resume, vit_jax.loop, "
            "vit_jax.data, vit_jax.finetune, vit_jax.launch",
            TORCH_MODULES,
        ),
        (
            "import vit_compare.inference, vit_compare.training, vit_compare.exports, vit_compare.report, "
            "vit_compare.run_model",
            JAX_MODULES + TORCH_MODULES,
        ),
        ("import vit_cli.main as m; m.build_parser()", JAX_MODULES + TORCH_MODULES),
        ("from vit_cli.convert import Adapters; Adapters('torch', 'READERS')", TORCH_MODULES),  # until looked into
    ],
)
def test_import_isolation(statement, forbidden):
    loaded = _loaded_after(statement)
    assert not loaded & set(forbidden), f"{statement!r} loaded {sorted(loaded & set(forbidden))}"
    assert "numpy" in loaded  # the probe itself works


JAX_FAMILY = {"jax", "jaxlib", "flax", "optax", "orbax", "grain", "vit_jax"}
TORCH_FAMILY = {"torch", "torchvision", "timm", "transformers", "vit_torch"}


ROOT = Path(__file__).resolve().parents[1]


def _imported(node) -> set[str]:
    """Top-level package names imported anywhere under ``node`` (an ast node); a ``vit_compare`` module
    brings the packages it imports (anywhere in it, through the vit_compare modules it imports too): a
    test that calls it runs the frameworks it runs."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            modules = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            modules = [n.module, *(f"{n.module}.{a.name}" for a in n.names)]  # from vit_compare import training
        else:
            continue
        for m in modules:
            names.add(m.split(".")[0])
            if m.startswith("vit_compare."):
                names |= _compare_module(m)
    return names


@functools.cache
def _compare_module(module: str) -> set[str]:
    """``_imported`` of the vit_compare module ``module``; empty when it names no module (a function)."""
    path = ROOT / f"{module.replace('.', '/')}.py"
    return _imported(ast.parse(path.read_text())) if path.is_file() else set()


@pytest.mark.slow
def test_tests_need_one_framework_and_parity_tests_two():
    """The rule of README's Layout: a file of tests/ (its subfolders too) imports at most one framework
    (JAX's family or torch's, its twin included) at its top and in any one function; both, or a twin and
    its reference library, is a parity test (parity_tests/). A vit_compare module counts with the
    frameworks it imports: ``vit_compare.report`` none, ``vit_compare.inference`` both."""
    assert not _imported(ast.parse("from vit_compare.report import write_parity_report")) & (JAX_FAMILY | TORCH_FAMILY)
    assert {"vit_jax", "vit_torch"} <= _imported(ast.parse("from vit_compare.inference import run_parity"))
    files = sorted((ROOT / "tests").rglob("*.py"))
    assert any(p.parent != ROOT / "tests" for p in files)  # the subfolders are read too
    both = []
    for path in files:
        tree = ast.parse(path.read_text())
        top = _imported(ast.Module([n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], []))
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for scope in [top, *(top | _imported(f) for f in functions)]:
            if scope & JAX_FAMILY and scope & TORCH_FAMILY:
                both.append(f"{path.relative_to(ROOT)}: {sorted(scope & (JAX_FAMILY | TORCH_FAMILY))}")
                break
    assert not both, both


ROOTS = ("vit_common", "vit_jax", "vit_torch", "vit_compare", "vit_cli", "benchmarks")


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


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every circle of ``graph`` ({node: the nodes it points to}), once each, from its smallest node."""
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
    return cycles


@pytest.mark.slow
def test_no_import_cycle():
    """No module of the project imports (at its top or inside a function: a function-level import is
    how a circle hides) a module that imports it back, directly or through others."""
    files = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for r in ROOTS
        for p in (ROOT / r).rglob("*.py")
    }
    graph = {m: _imports(p, set(files)) - {m} for m, p in files.items()}
    cycles = _cycles(graph)
    assert not cycles, cycles


# What each package may import, anywhere in it (function bodies too): the floors of README's Layout,
# from the top (vit_cli) down to vit_common, which imports none of the others.
MAY_IMPORT = {
    "vit_common": set(),
    "vit_jax": {"vit_common"},
    "vit_torch": {"vit_common"},
    "vit_compare": {"vit_common", "vit_jax", "vit_torch"},
    "benchmarks": {"vit_common", "vit_jax", "vit_torch", "vit_compare"},
    "vit_cli": {"vit_common", "vit_jax", "vit_torch", "vit_compare", "benchmarks"},
}


def _package_graph() -> dict[str, dict[str, set[str]]]:
    """{package of ROOTS: {another package of ROOTS it imports: the files that import it}}, over every
    module, imports inside functions included."""
    graph: dict[str, dict[str, set[str]]] = {r: {} for r in ROOTS}
    for r in ROOTS:
        for path in sorted((ROOT / r).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = {node.module.split(".")[0]}
                else:
                    continue
                for name in names & set(ROOTS) - {r}:
                    graph[r].setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return graph


def test_no_library_package_imports_vit_cli():
    """vit_cli is the top floor: no other package imports it, not even inside a function (tests may)."""
    graph = _package_graph()
    assert {"vit_compare", "benchmarks"} <= set(graph["vit_cli"])  # the probe sees imports
    found = sorted(f for deps in graph.values() for f in deps.get("vit_cli", ()))
    assert not found, found


def test_the_package_graph_points_down_without_a_circle():
    """Packages import only the floors below them (``MAY_IMPORT``), so no two import each other (the
    module-level cycle test does not see a circle of packages through different modules)."""
    graph = _package_graph()
    assert {"vit_jax", "vit_torch"} <= set(graph["vit_compare"])  # the probe sees imports in functions
    assert set(MAY_IMPORT) == set(ROOTS)
    up = [
        f"{p} imports {d}: {', '.join(sorted(files))}"
        for p, deps in graph.items()
        for d, files in sorted(deps.items())
        if d not in MAY_IMPORT[p]
    ]
    assert not up, up
    cycles = _cycles({p: set(deps) for p, deps in graph.items()})
    assert not cycles, cycles


BRIDGE = "vit_jax/torch_bridge.py"


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of ``tree`` (module, classes, functions)."""
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, scopes)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def test_vit_jax_reaches_torch_only_through_its_bridge():
    """vit_jax imports nothing of torch's family, anywhere, and imports nothing by name (import_module,
    __import__); it starts child processes (``-m`` in a command) in one module, vit_jax/torch_bridge.py,
    and only there names vit_torch in code: as the module of such a command, right after "-m"."""
    commands, named = {}, {}
    for path in sorted((ROOT / "vit_jax").rglob("*.py")):
        tree, rel = ast.parse(path.read_text()), str(path.relative_to(ROOT))
        assert not _imported(tree) & TORCH_FAMILY, rel
        calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
        assert not [f for f in calls if getattr(f, "attr", getattr(f, "id", None)) in ("import_module", "__import__")]
        lists = [n for n in ast.walk(tree) if isinstance(n, (ast.List, ast.Tuple))]
        after_m = {
            id(b)
            for n in lists
            for a, b in zip(n.elts[:-1], n.elts[1:], strict=True)
            if isinstance(a, ast.Constant) and a.value == "-m"
        }
        if after_m:
            commands[rel] = len(after_m)
        docstrings = _docstrings(tree)
        for c in ast.walk(tree):
            if isinstance(c, ast.Constant) and isinstance(c.value, str) and id(c) not in docstrings:
                if re.fullmatch(r"vit_torch(\.\w+)*", c.value):
                    named.setdefault(rel, []).append((c.value, id(c) in after_m))
    assert list(commands) == [BRIDGE], commands
    assert list(named) == [BRIDGE] and all(after for _, after in named[BRIDGE]), named


PLOTTED = """
import importlib, json, pkgutil, sys, tempfile
from pathlib import Path

import vit_cli
for m in pkgutil.iter_modules(vit_cli.__path__):
    importlib.import_module(f"vit_cli.{m.name}")
import vit_compare.training
from vit_jax.launch import plot_curves

before = sorted({m.split(".")[0] for m in sys.modules} & {"wandb", "matplotlib"})
metrics = Path(tempfile.mkdtemp()) / "metrics.jsonl"
metrics.write_text(json.dumps({"step": 1, "loss": 1.0, "accuracy": 0.5}))
plot_curves(metrics, metrics.with_name("curves.png"))
print(json.dumps([before, "matplotlib" in sys.modules, "matplotlib.pyplot" in sys.modules]))
"""


def test_commands_import_neither_wandb_nor_matplotlib_until_a_figure_is_drawn():
    """Every command module (vit_cli's, the training launcher, train-parity's plot) imports neither wandb
    (which timm's package brings) nor matplotlib; drawing curves.png imports matplotlib's ``Figure``,
    not pyplot (which would choose a backend for the whole process)."""
    out = subprocess.run([sys.executable, "-c", PLOTTED], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout.splitlines()[-1]) == [[], True, False]
