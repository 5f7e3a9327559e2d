"""Our own file: the canonical state as safetensors, with the ViTConfig in the header metadata."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
from safetensors import SafetensorError, safe_open

from vit_common.config import ViTConfig
from vit_common.formats.base import Decoded, FormatError, copy, to_canonical
from vit_common.io import save_safetensors
from vit_common.state import canonical_shapes, check_state

FORMAT_TAG = "vit-twins/canonical/1"


def save_canonical(path: str | os.PathLike, cfg: ViTConfig, state: Mapping[str, np.ndarray]) -> None:
    """Write our own file: canonical tensors plus ``cfg`` as JSON in the metadata.

    Raises:
        StateMismatchError: if ``state`` does not fit ``cfg`` (nothing is written).
    """
    check_state(canonical_shapes(cfg), state)
    save_safetensors(path, state, {"format": FORMAT_TAG, "vit_config": cfg.to_json()})


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) of a safetensors file.

    Raises:
        ValueError: the file is missing, truncated or not safetensors; the message names the path.
    """
    try:
        with safe_open(str(path), framework="np") as f:
            meta = dict(f.metadata() or {})
            return {k: f.get_tensor(k) for k in f.keys()}, meta
    except (SafetensorError, OSError) as e:
        raise FormatError(f"{path}: not a readable safetensors file ({e})") from e


def stored_config(meta: Mapping[str, str], context: str) -> ViTConfig:
    """The ViTConfig stored in our metadata (safetensors header or orbax folder).

    Raises:
        FormatError: no format tag or no config, or a config that does not parse or validate.
    """
    if meta.get("format") != FORMAT_TAG or "vit_config" not in meta:
        raise FormatError(
            f"{context}: no stored ViTConfig (format tag {meta.get('format')!r}, expected {FORMAT_TAG!r})"
        )
    try:
        return ViTConfig.from_json(meta["vit_config"])
    except (TypeError, ValueError, AttributeError) as e:
        raise FormatError(f"{context}: the stored ViTConfig is invalid ({e})") from e


def decode(cfg: ViTConfig, state: Mapping[str, np.ndarray], layout: str, context: str) -> Decoded:
    """Decoded result for a stored config and its canonical tensors (our file, orbax checkpoints).

    A head whose row count differs from the stored num_classes is read as stored and reported as a
    conflict (the caller asks for ``num_classes`` to resolve it).
    """
    conflicts = []
    head = state.get("head.weight")
    k = int(np.shape(head)[0]) if head is not None and np.ndim(head) == 2 else 0
    if k != cfg.num_classes:
        conflicts.append(f"the stored config has num_classes={cfg.num_classes} but the head has {k} rows")
        cfg = cfg.replace(num_classes=k)
    to_canonical([copy(n, n, s) for n, s in canonical_shapes(cfg).items()], state, context)
    return Decoded(cfg, dict(state), layout, {}, [], [], conflicts)


def load_canonical(path: str | os.PathLike) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """Read our own file back: (config, canonical state), checked against each other.

    Raises:
        ValueError (FormatError): not our file (no stored config) or unreadable; StateMismatchError if
            the tensors do not fit the stored config.
    """
    state, meta = read_safetensors(path)
    cfg = stored_config(meta, str(path))
    check_state(canonical_shapes(cfg), state, context=str(path))
    return cfg, state
