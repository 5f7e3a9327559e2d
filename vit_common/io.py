"""The one place that writes files: every file and folder the project writes goes through here.

Writes are atomic: the content is written to a temporary file (or folder) beside the target and renamed
into place only when it is complete, so a crash, a full disk or an exception leaves either the old file or
nothing, never a partial one. New files get the usual mode (0666 / 0777 less the umask), not mkstemp's
0600. Format-specific writers (safetensors, .npz, torch.save, orbax, PNG) hand a callback to
``atomic_write`` / ``atomic_write_dir``; JSON and text have helpers of their own.

Reading JSON is here too, so that every JSON file is parsed the same way and every error names its path.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place.

    Parent folders are created. Nothing is left at ``path`` (or beside it) if ``write`` raises; an
    existing file at ``path`` stays as it was.

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


def atomic_write_dir(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
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


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def json_text(obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """``obj`` as JSON text ending in a newline (the form every JSON file the project writes has)."""
    return json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n"


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> None:
    """Write ``obj`` as JSON atomically (``json_text``)."""
    write_text(path, json_text(obj, indent=indent, sort_keys=sort_keys))


def write_jsonl(path: str | os.PathLike, records: list[Mapping[str, Any]]) -> None:
    """One JSON object per line (sorted keys), written atomically."""
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def open_log(path: str | os.PathLike):
    """A text file opened for appending lines (a metrics log): the one write that is not atomic, since
    it grows while a run lasts. The caller writes whole lines, flushes, and closes it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a", encoding="utf-8")


def read_json(path: str | os.PathLike) -> Any:
    """The parsed content of a JSON file.

    Raises:
        ValueError: the file cannot be read or is not JSON; the message names the path.
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from e


def save_safetensors(
    path: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> None:
    """Write numpy ``tensors`` as a safetensors file, atomically; tensors are made contiguous first
    (safetensors refuses views such as a transpose)."""
    from safetensors.numpy import save_file

    contiguous = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(contiguous, tmp, metadata=dict(metadata or {})))


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` as an uncompressed .npz (no pickled objects), atomically."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    atomic_write(path, write)
