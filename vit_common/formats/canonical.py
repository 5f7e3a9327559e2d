"""Our own file: the canonical state as safetensors, with the ViTConfig in the header metadata."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from vit_common.config import ViTConfig
from vit_common.formats.base import Decoded, FormatError, copy, to_canonical
from vit_common.state import canonical_shapes, check_state

FORMAT_TAG = "vit-twins/canonical/1"


def atomic_write(path: str | os.PathLike, write) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place.

    Nothing is left at ``path`` (or beside it) if ``write`` raises. The file gets the usual mode of a
    new file (0666 less the umask), not mkstemp's 0600.

    Raises:
        IsADirectoryError: ``path`` is an existing folder (checked before ``write`` runs).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder: expected a file path")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_dir(path: str | os.PathLike, write) -> None:
    """Call ``write(tmp_dir)`` on a fresh folder beside ``path``, then put it in place of ``path``.

    An existing ``path`` is replaced only after ``write`` succeeded; nothing is left behind if it raises.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        write(tmp)
        os.chmod(tmp, 0o777 & ~_umask())
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "x")
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_safetensors(
    path: str | os.PathLike, state: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``state`` as safetensors atomically; tensors are made contiguous first (K10)."""
    tensors = {k: np.ascontiguousarray(v) for k, v in state.items()}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=dict(metadata or {})))


def save_canonical(
    path: str | os.PathLike, cfg: ViTConfig, state: Mapping[str, np.ndarray], extra: Mapping[str, str] = ()
) -> None:
    """Write our own file: canonical tensors plus ``cfg`` as JSON in the metadata, and the ``extra``
    metadata entries (preprocessing and class names, ``vit_common.metadata.info_metadata``).

    Raises:
        StateMismatchError: if ``state`` does not fit ``cfg`` (nothing is written).
    """
    check_state(canonical_shapes(cfg), state)
    save_safetensors(path, state, {**dict(extra), "format": FORMAT_TAG, "vit_config": cfg.to_json()})


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
