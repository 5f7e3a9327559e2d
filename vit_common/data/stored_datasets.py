"""What the readers of stored datasets share (``vit_common.data.datasets`` for image folders,
``vit_common.data.hf_datasets``, ``vit_common.data.arrayrecord``): the unsplit result of a reader, a
subset of a source, the file statistics of the fingerprint, and the limits on labels and split names.
Below the readers, so that none of them imports another that imports it back."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vit_common.system.validate import regular_file

MAX_CLASSES = 2**20  # a dataset's label values must lie below this (ImageNet-21k has 21,843 classes)
TEST_SPLITS = ("val", "validation", "valid", "test")  # names of a test split, in order of preference


def check_classes(where: str, classes: Sequence[str], labels: np.ndarray, *, every: bool = True) -> None:
    """A dataset's class names against its labels, as every reader checks them: each name a non-empty
    string, no name twice, a name for every label, and with ``every`` a training example of every class
    (a class without one would train a row of the head on nothing). ``where``: what declares the names
    (dataset.json, the features, the spec); ``labels``: int [N] the training labels.

    Raises:
        ValueError: one line naming ``where`` and the first name or label that contradicts it.
    """
    seen: set[str] = set()
    for c in classes:
        if not isinstance(c, str) or not c.strip():
            raise ValueError(f"{where}: class name {c!r}: expected a non-empty name for every class")
        if c in seen:
            raise ValueError(f"{where}: names class {c!r} twice; expected distinct class names")
        seen.add(c)
    held = set(np.unique(labels).tolist())
    if held and max(held) >= len(classes):
        raise ValueError(
            f"{where}: names {len(classes)} classes, but a record is labelled {max(held)}; expected labels in "
            f"[0, {len(classes) - 1}]"
        )
    unused = sorted(set(range(len(classes))) - held) if every else []
    if unused:
        names = ", ".join(repr(classes[k]) for k in unused[:5]) + (", ..." if len(unused) > 5 else "")
        raise ValueError(
            f"{where}: names {len(classes)} classes, but no record is labelled {names} (the records hold "
            f"{len(held)} classes); expected a record of every class"
        )


class DataReadError(ValueError):
    """An example that could not be read when it was used, after the dataset's up-front check passed (its
    file damaged, truncated or replaced since): the message names the file and the record or row."""


def read_error(name: str, e: BaseException) -> DataReadError:
    """The ``DataReadError`` of the example ``name`` (a source's ``name(i)``: a file, or "FILE: row K" /
    "FILE: record K") that raised ``e``, on one line: ``e``'s message, prefixed by ``name`` unless it
    starts with it; a message naming FILE (a damaged file) goes after ``name``, FILE named once."""
    text = " ".join(str(e).split()) or type(e).__name__
    text = text if len(text) <= 300 else text[:300] + "..."
    if text.startswith(name):
        return DataReadError(text)
    file = name.rpartition(": ")[0]
    if file and text.startswith(f"{file}: "):
        text = text[len(file) + 2 :]
    return DataReadError(f"{name}: {text}")


class Subset:
    """Examples ``indices`` of a stored source (the ``val_fraction`` split of an ``hf:`` or
    ``arrayrecord:`` set): element k is ``source[indices[k]]``."""

    def __init__(self, source, indices: np.ndarray):
        self.source, self.indices = source, np.asarray(indices, np.int64)
        self.labels = np.asarray(source.labels, np.int32)[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        return self.source[int(self.indices[i])]

    def name(self, i: int) -> str:
        """Where example ``i`` is stored (its source's name of it), for errors."""
        return self.source.name(int(self.indices[i]))


@dataclass(frozen=True)
class Stored:
    """What a reader of stored images (image folder, Hugging Face, ArrayRecord) finds before splitting.

    train / test: sources with ``labels`` int32 [N], ``images()`` and ``take(indices)``; ``test`` None
    when the dataset has no test split of its own. classes: the K names. files: {path relative to the
    dataset's folder: (size in bytes, modification time in ns)} of every file read, for the fingerprint.
    """

    train: object
    test: object | None
    classes: tuple[str, ...]
    files: dict[str, tuple[int, int]]


def file_stats(root: Path, paths: Sequence[str | os.PathLike]) -> dict[str, tuple[int, int]]:
    """{path relative to ``root``: (size, mtime ns)} of regular files (symlinks followed).

    Raises:
        ValueError / OSError: a path that is not a regular file (a FIFO, a device), see ``regular_file``.
    """
    out = {}
    for p in paths:
        st = os.stat(regular_file(p, "dataset file"))
        out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out
