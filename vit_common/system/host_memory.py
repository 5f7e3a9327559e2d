"""Process-wide glibc malloc settings that keep large freed blocks for reuse instead of unmapping them.

Why: XLA on CPU allocates an executable's temporaries as one block per call (498 MB for a Ti/16
training step at batch 8), from its worker threads. glibc serves a block that size in a thread's
arena with mmap and unmaps it on free, so each step touches fresh pages: 132,000 minor page faults
per step (``getrusage``), a fifth of the step's time on a 2-core machine. With one arena, no mmap and
a 2 GiB trim threshold (``mallopt``, glibc malloc(3)) the block comes from the main heap and stays
mapped between steps: no faults after the first step. PyTorch's eager allocations benefit as well.

Cost: memory freed by the process is kept (up to the peak), not returned to the system. Set
``VIT_DEFAULT_MALLOC=1`` (any value but empty, 0, false, no, off) to leave malloc as it is. Other C
libraries (macOS, musl) are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# glibc <malloc.h> parameter numbers.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
TRIM_THRESHOLD = 2**31 - 1  # the largest value mallopt takes (an int): 2 GiB
OPT_OUT = "VIT_DEFAULT_MALLOC"

_state = "default (reuse_freed_memory not called)"


def reuse_freed_memory() -> str:
    """Apply the settings above once, as early as possible (before JAX starts its threads).

    Returns and remembers (``state()``) what was done: 'glibc mallopt: ...', or 'default (why)'.
    Never raises: where the settings cannot be applied, malloc stays as it is.
    """
    global _state
    if _state.startswith("glibc"):  # applied already; settings stay for the life of the process
        return _state
    if os.environ.get(OPT_OUT, "").strip().lower() not in ("", "0", "false", "no", "off"):
        _state = f"default ({OPT_OUT} is set)"
        return _state
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version.restype = ctypes.c_char_p  # a glibc-only symbol
        version = libc.gnu_get_libc_version().decode()
    except (OSError, AttributeError, TypeError):
        _state = "default (not glibc)"
        return _state
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    ok = all(libc.mallopt(p, v) == 1 for p, v in settings)
    _state = (
        f"glibc {version} mallopt: arena_max=1 mmap_max=0 trim_threshold={TRIM_THRESHOLD}"
        if ok
        else f"default (glibc {version} refused mallopt)"
    )
    return _state


def state() -> str:
    """What ``reuse_freed_memory`` did in this process (for benchmark records)."""
    return _state
