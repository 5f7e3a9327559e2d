"""A ViTConfig stored beside the tensors (our safetensors metadata, timm files we wrote, orbax folders):
reading it back with every field declared, and the metadata entries that keep assumed fields assumed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded
from vit_common.checkpoints.formats.provenance import ASSUMED_KEY, carried_assumptions, declared
from vit_common.checkpoints.formats.rules import copy, to_canonical
from vit_common.config import FUNCTION_FIELDS, ViTConfig
from vit_common.state import canonical_shapes
from vit_common.system import io
from vit_common.system.validate import check_holds

FORMAT_TAG = "vit-twins/canonical/1"


def config_from_json(text: str, context: str) -> tuple[ViTConfig, list[str]]:
    """A stored ViTConfig (JSON) and notes on fields it predates.

    Configs written before ``pool_include_prefix`` existed pooled a MAP head over every token, and
    global pooling over the patch tokens only: a missing field takes the value that computes what the
    writer computed.

    Raises:
        FormatError: not JSON, not an object, or an invalid config.
    """
    try:
        d = io.parse_json(text, f"{context}: the stored ViTConfig")
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        notes = []
        if "pool_include_prefix" not in d and d.get("pool") == "map":
            d["pool_include_prefix"] = True
            notes.append("stored config predates pool_include_prefix: its MAP head pools every token")
        return ViTConfig.from_dict(d), notes
    except (TypeError, ValueError, AttributeError) as e:
        raise FormatError(f"{context}: the stored ViTConfig is invalid ({e})") from e


def stored_config(meta: Mapping[str, str], context: str) -> ViTConfig:
    """The ViTConfig stored in our metadata (safetensors header or orbax folder).

    Raises:
        FormatError: no format tag or no config, or a config that does not parse or validate.
    """
    if meta.get("format") != FORMAT_TAG or "vit_config" not in meta:
        raise FormatError(
            f"{context}: no stored ViTConfig (format tag {meta.get('format')!r}, expected {FORMAT_TAG!r})"
        )
    return config_from_json(meta["vit_config"], context)[0]


def decode_stored(
    cfg: ViTConfig, state: Mapping[str, np.ndarray], layout: str, context: str, source: str, assumed=None
) -> Decoded:
    """Decoded result for a stored config and its canonical tensors (our file, orbax checkpoints, timm
    files we wrote): every field declared by ``source``, except those listed in ``assumed`` (the stored
    ``ASSUMED_KEY`` entry: fields its writer had to assume), which stay assumed.

    A head whose row count differs from the stored num_classes is read as stored and reported as a
    conflict (the caller asks for ``num_classes`` to resolve it).

    Raises:
        ValueError: the stored config declares more parameters than the tensors hold (``check_holds``).
        StateMismatchError: the tensors do not fit the stored config.
    """
    conflicts = []
    head = state.get("head.weight")
    k = int(np.shape(head)[0]) if head is not None and np.ndim(head) == 2 else 0
    if k != cfg.num_classes:
        conflicts.append(f"the stored config has num_classes={cfg.num_classes} but the head has {k} rows")
        cfg = cfg.replace(num_classes=k)
    check_holds(cfg, state, context)
    to_canonical([copy(n, n, s) for n, s in canonical_shapes(cfg).items()], state, context)
    provenance = {name: declared(source) for name in FUNCTION_FIELDS}
    carried_assumptions(assumed, provenance, context)
    return Decoded(cfg, dict(state), layout, provenance, [], [], conflicts)


def assumed_meta(assumed) -> dict[str, str]:
    """The metadata entry that keeps fields assumed across a conversion (none if nothing was)."""
    return {ASSUMED_KEY: json.dumps(sorted(assumed))} if assumed else {}
