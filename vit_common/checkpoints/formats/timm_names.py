"""What a timm ViT architecture name implies, without timm: the table ``timm_architectures.json``
beside this module, generated from timm by ``python -m vit_torch.timm_architectures`` (its docstring says
how) and tested against timm (``tests/test_timm_architectures.py``).

A timm hub folder's config.json names its ``architecture``; timm builds it with that entry point's
defaults (num_heads, LayerNorm eps 1e-5 for CLIP towers, GELU, pooling, image size...) overridden by
``model_args``. A reader without timm takes those defaults from the table (declared, naming the timm
version), so nothing the name fixes is assumed; a writer names the architecture whose defaults equal the
config (``matching_name``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from vit_common.config import FUNCTION_FIELDS, ViTConfig

TABLE_PATH = Path(__file__).with_name("timm_architectures.json")
_DEFAULTS = ViTConfig()
# Fields a writer's name must match (all that change the function but the head's class count and bias).
_MATCHED = tuple(f for f in FUNCTION_FIELDS if f not in ("num_classes", "head_bias"))


def entry(cfg: ViTConfig) -> dict[str, Any]:
    """The table's row for ``cfg``: its function fields that differ from ``ViTConfig``'s defaults."""
    d, base = cfg.to_dict(), _DEFAULTS.to_dict()
    return {k: d[k] for k in FUNCTION_FIELDS if d[k] != base[k]}


@functools.cache
def _table() -> dict[str, Any]:
    return json.loads(TABLE_PATH.read_text())


def timm_version() -> str:
    """The timm version the table was generated from."""
    return _table()["timm_version"]


def architecture_config(name: str) -> ViTConfig | None:
    """The config timm builds for the architecture ``name`` (image size, heads, eps, classes... its entry
    point's defaults), or None for a name the table does not hold."""
    row = _table()["architectures"].get(name)
    return None if row is None else ViTConfig.from_dict(row)


def not_implemented(name: str) -> str | None:
    """Why the twins cannot build the timm architecture ``name`` (timm's model, read when the table was
    made), or None."""
    return _table()["not_implemented"].get(name)


def matching_name(cfg: ViTConfig) -> str | None:
    """A timm architecture whose defaults equal ``cfg`` in every function field but the head (``vit_``
    names first, then the shortest), or None."""
    want = {k: getattr(cfg, k) for k in _MATCHED}
    names = sorted(_table()["architectures"], key=lambda n: (not n.startswith("vit_"), len(n), n))
    for name in names:
        c = architecture_config(name)
        if all(getattr(c, k) == v for k, v in want.items()):
            return name
    return None
