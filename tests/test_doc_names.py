"""Every Python name the documentation gives of this project (``from vit_x import y``, ``vit_x.module.name``),
on README.md and on every page of the manual, exists, so a snippet a reader copies does not stop at an
ImportError; so does every file it names by its path; and every module of the four libraries has its API
reference page, every API page a module."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEXT = "\n".join(p.read_text() for p in PAGES)
FROM_IMPORTS = sorted(
    {
        f"{module}.{name.strip()}"
        for module, names in re.findall(r"from (vit_\w+(?:\.\w+)*) import ([\w, ]+)", TEXT)
        for name in names.split(",")
        if name.strip()
    }
)
DOTTED = sorted(
    name
    for name in set(
        re.findall(r"(?<![\w/.-])((?:vit_jax|vit_torch|vit_common|vit_compare|vit_cli|benchmarks)(?:\.\w+)+)", TEXT)
    )
    if not name.endswith((".md", ".py"))  # a page or a file (docs/benchmarks.md), not a name
)
LIBRARIES = ("vit_common", "vit_jax", "vit_torch", "vit_compare")


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
def test_doc_names_exist(dotted):
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"the documentation names {dotted}, which does not exist: {e}")


def test_doc_names_were_found():
    assert "vit_common.data.datasets.load_dataset" in FROM_IMPORTS and "vit_jax.data.train_iterator" in FROM_IMPORTS
    assert len(DOTTED) > 10


PATHS = sorted(
    set(re.findall(r"\b((?:vit_\w+|benchmarks|tests|parity_tests|docs)/[\w/]*\w\.(?:py|md|png|sh|jsonl))\b", TEXT))
)


def test_doc_paths_exist():
    """Every file the documentation names by its path (``vit_compare/inference.py``, ``docs/known_faults.md``)
    is there (a path written ``docs/x`` from the root, or ``x`` relative to docs/ in a link)."""
    assert len(PATHS) > 10 and "vit_compare/inference.py" in PATHS
    missing = [p for p in PATHS if not (ROOT / p).is_file()]
    assert not missing, missing


def _modules() -> set[str]:
    """Every module of the four libraries whose name has no part starting with ``_``, packages included."""
    found = set(LIBRARIES)
    for library in LIBRARIES:
        for m in pkgutil.walk_packages([str(ROOT / library)], prefix=f"{library}."):
            if not any(part.startswith("_") for part in m.name.split(".")):
                found.add(m.name)
    return found


def test_every_module_has_its_api_page():
    """docs/api/MODULE.md is ``::: MODULE`` (mkdocstrings renders it from the docstrings) for each module,
    and mkdocs.yml lists it; a page for a module that no longer exists is an error too."""
    pages = {p.stem: p.read_text() for p in (ROOT / "docs" / "api").glob("*.md")}
    modules = _modules()
    assert sorted(modules - set(pages)) == [], "modules without an API page"
    assert sorted(set(pages) - modules) == [], "API pages of no module"
    assert [m for m in modules if f"::: {m}\n" not in pages[m]] == []
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [m for m in sorted(modules) if f"api/{m}.md" not in nav] == [], "API pages missing from mkdocs.yml"
