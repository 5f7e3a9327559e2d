"""vit_common.system.host_memory: a large block freed by a worker thread is reused, not unmapped and re-faulted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vit_common.system import host_memory

# Allocate, fill and free 256 MB twice in a worker thread (as XLA's temporaries); print the minor page
# faults of the second round. Settings are process-wide, so each case runs in its own interpreter.
# (C malloc, not numpy: numpy asks for huge pages, XLA does not.)
PROBE = """
import ctypes, ctypes.util, resource, sys, threading
from vit_common.system.host_memory import reuse_freed_memory, state
if sys.argv[1] == "apply":
    reuse_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
faults = []
def rounds():
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(2**28)
        ctypes.memset(block, 1, 2**28)  # 256 MB, every page written
        libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
t = threading.Thread(target=rounds)
t.start()
t.join()
print(faults[1])
print(state())
"""


def _is_glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # no such name (macOS), no confstr (Windows)
        return False


glibc = pytest.mark.skipif(not _is_glibc(), reason="mallopt is glibc's")


def _probe(mode: str, env: dict | None = None) -> tuple[int, str]:
    env = {**os.environ, **(env or {})}
    run = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=env)
    faults, state = run.stdout.split("\n")[:2]
    return int(faults), state


@pytest.mark.slow
@glibc
def test_second_allocation_reuses_pages():
    faults, state = _probe("apply")
    assert state.startswith("glibc ") and "arena_max=1 mmap_max=0" in state
    assert faults < 1_000, f"{faults} page faults on reuse (a fresh 256 MB block has 65,536 pages)"


@pytest.mark.slow
@glibc
def test_without_the_settings_every_round_faults_again():
    # The fault the module exists for: glibc unmaps the freed block, the next round faults it all in.
    faults, state = _probe("default")
    assert state.startswith("default")
    assert faults > 60_000


@glibc
def test_opt_out_leaves_malloc_alone():
    faults, state = _probe("apply", {host_memory.OPT_OUT: "1"})
    assert state == f"default ({host_memory.OPT_OUT} is set)"
    assert faults > 60_000


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_opt_out_values(value, monkeypatch):
    monkeypatch.setattr(host_memory, "_state", "default (reuse_freed_memory not called)")
    monkeypatch.setenv(host_memory.OPT_OUT, value)
    assert host_memory.reuse_freed_memory() == f"default ({host_memory.OPT_OUT} is set)"


def test_applied_settings_are_reported_for_the_life_of_the_process(monkeypatch):
    applied = "glibc 2.36 mallopt: arena_max=1 mmap_max=0 trim_threshold=2147483647"
    monkeypatch.setattr(host_memory, "_state", applied)
    monkeypatch.setenv(host_memory.OPT_OUT, "1")  # too late: mallopt cannot be undone by this module
    assert host_memory.reuse_freed_memory() == applied and host_memory.state() == applied
