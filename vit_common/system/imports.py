"""Importing libraries that replace Python's import function while they import.

grain (its Parquet source) and tensorflow_datasets (its dataset families) import parts of themselves
inside etils' ``epy.lazy_imports()``, which sets ``builtins.__import__`` to a function that returns lazy
stand-ins, for every thread, until the block ends. A garbage collection in that window runs the
finalizers of whatever garbage is pending, and an import inside one of them gets a stand-in and fails
(``TypeError: 'LazyModule' object is not callable``), as does pytest's handler that reports it. These
libraries are therefore imported with the cyclic collector paused (reference counting still frees).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block, then restore it as it was (a collector
    that was off stays off). For imports of grain and tensorflow_datasets (the module docstring says
    why); not for long work, whose cyclic garbage would wait until the block ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
