"""The CPU backend as several single-threaded XLA devices, one per core, data parallel.

A small ViT on CPU spends its time in small ops that a thread pool does not speed up; one device per
core runs the batch's shards side by side instead. XLA reads its flags when JAX starts, so this is set
before JAX is imported, here in framework-free code (importing any ``vit_jax`` module imports JAX).
"""

from __future__ import annotations

import os
import sys


def split_cpu(cpu_devices: int, batch_size: int, accum_steps: int = 1) -> None:
    """Make the CPU backend ``cpu_devices`` single-threaded XLA devices (0 =
    one per usable core, as many as divide the micro-batch ``batch_size // accum_steps``; 1 = one
    multi-threaded device), through ``XLA_FLAGS``.

    Only possible before JAX is imported, and only for one process; XLA_FLAGS that already set a device
    count win. GPU/TPU runs are unaffected.

    Raises:
        ValueError: ``cpu_devices`` < 0.
    """
    n = cpu_devices
    if n < 0:
        raise ValueError(f"--cpu-devices={n}: expected an int >= 0")
    if n == 0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        micro = max(batch_size // max(accum_steps, 1), 1)
        n = max(d for d in range(1, cores + 1) if micro % d == 0)
    flags = os.environ.get("XLA_FLAGS", "")
    single = "jax" not in sys.modules and "JAX_COORDINATOR_ADDRESS" not in os.environ
    if n > 1 and single and "device_count" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={n} --xla_cpu_multi_thread_eigen=false".strip()
        )
