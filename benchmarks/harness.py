"""Time contenders interleaved (A B C A B C ...) beside a large matmul, and turn times into records.

FLOPs: ``ViTConfig.flops()`` per image for a forward pass (its docstring is the formula); a training
step counts 3x that (the backward pass is twice the forward: Kaplan et al. 2020, PaLM appendix B),
the AdamW update left out. Model FLOP/s = FLOPs per step / median step time.

MFU is reported against (a) the rate of a square matmul in the benchmark dtype (``matmul_jax`` and
``matmul_torch`` run in the same rotation as the models; the faster of the two is the reference) and
(b) the datasheet peak of the device when ``DATASHEET_PEAKS`` knows it.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable, Sequence
from importlib import metadata

import numpy as np

from benchmarks.contenders import Contender, build, check
from vit_common.config import ViTConfig
from vit_common.system import host_memory

SCHEMA = "vit-bench/1"
TRAIN_FLOPS_FACTOR = 3
# Dense (no sparsity) peak FLOP/s by device-name substring and dtype. Source: NVIDIA datasheets
# (H100/H200 SXM: 989 TFLOP/s bf16/fp16 dense, 67 TFLOP/s fp32; A100 SXM: 312 and 19.5).
DATASHEET_PEAKS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
}
PACKAGES = ("jax", "jaxlib", "flax", "optax", "torch", "timm", "transformers", "numpy")
# Every record (one JSON line) has exactly these keys; None where a figure does not apply or is unknown.
RECORD_FIELDS: dict[str, str] = {
    "schema": "record format tag",
    "time": "start of the run, UTC ISO 8601",
    "machine": "platform, device, cpu, cpu_flags (AVX-512, AMX, ...), cores, torch threads, load average at start, "
    "XLA_FLAGS, malloc settings",
    "versions": "python and package versions",
    "variant": "variant name, e.g. B/16",
    "config": "the ViTConfig as a dict",
    "mode": "'infer' or 'train'",
    "dtype": "compute dtype",
    "batch": "images per step",
    "warmup": "untimed rounds",
    "repeats": "timed rounds",
    "iters": "calls per timed run",
    "contender": "vit_jax[@xla|@cudnn], vit_torch, vit_torch_compile, timm, timm_compile, hf, matmul_jax, matmul_torch",
    "kind": "'model' or 'matmul' (the reference)",
    "framework": "'jax' or 'torch'",
    "error": "why the contender could not be built, else None",
    "setup_s": "seconds to build, compile and (torch) run once",
    "memory_bytes": "framework-reported memory (see memory_kind); None where not reported",
    "memory_kind": "how memory_bytes was obtained",
    "times_s": "seconds per call, each timed run",
    "median_s": "median of times_s",
    "min_s": "fastest run",
    "max_s": "slowest run",
    "p25_s": "25th percentile",
    "p75_s": "75th percentile",
    "spread": "(p75 - p25) / median",
    "flops_per_image": "ViTConfig.flops(): forward FLOPs per image",
    "flops_per_step": "forward FLOPs x batch (x3 for training); 2 n^3 for a matmul",
    "flops_per_s": "flops_per_step / median_s",
    "matmul_n": "size of the reference matmul (matmul records)",
    "matmul_flops_per_s": "the faster matmul's FLOP/s in this group (the measured limit)",
    "mfu_matmul": "flops_per_s / matmul_flops_per_s",
    "peak_flops_per_s": "datasheet peak for the device and dtype, None when unknown",
    "mfu_datasheet": "flops_per_s / peak_flops_per_s",
    "images_per_s": "batch / median_s",
    "rel_speed": "fastest model median in the group / this median (1.0 = fastest)",
    "speed_vs": "{other contender: its median / this median} (> 1: this one is faster)",
    "load_avg_end": "1-minute load average when the group finished (a shared machine's noise)",
}


def versions() -> dict[str, str | None]:
    """Python and package versions (None when a package is not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


# The instruction-set extensions that decide which matmul and convolution kernels XLA:CPU and oneDNN pick
# (Linux /proc/cpuinfo spellings). The model string alone does not tell CPUs apart: cloud guests report
# "Intel(R) Xeon(R) Processor" or "AMD EPYC" for several generations.
CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def cpu_info(text: str) -> tuple[str | None, list[str]]:
    """The first model name in a /proc/cpuinfo text and the ``CPU_FLAGS`` its first ``flags`` line names."""
    lines = text.splitlines()
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    have = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())
    return (names[0] if names else None), [flag for flag in CPU_FLAGS if flag in have]


def host() -> dict:
    """The host: CPU model, the ``CPU_FLAGS`` it has (in that order; None where /proc/cpuinfo is absent),
    usable cores, load average (1, 5, 15 min; None where the OS has none)."""
    cpu, flags = platform.processor() or platform.machine(), None
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            name, flags = cpu_info(f.read())
        cpu = name or cpu
    return {
        "cpu": cpu,
        "cpu_flags": flags,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def machine() -> dict:
    """The machine: accelerator kind, ``host()``, torch's thread count, relevant env flags."""
    import jax
    import torch

    cpu = host()
    dev = jax.devices()[0]
    return {
        "platform": dev.platform,
        "device": dev.device_kind if dev.platform != "cpu" else cpu["cpu"],
        "torch_device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "cpu": cpu["cpu"],
        "cpu_flags": cpu["cpu_flags"],
        "cores": cpu["cores"],
        "torch_threads": torch.get_num_threads(),
        "load_avg": cpu["load_avg"],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "malloc": host_memory.state(),
    }


def datasheet_peak(device: str, dtype: str) -> float | None:
    for key, peaks in DATASHEET_PEAKS.items():
        if key in device:
            return peaks.get(dtype)
    return None


def matmul_contenders(n: int, dtype: str) -> list[Contender]:
    """[n, n] @ [n, n] in ``dtype`` through jax.jit and torch.mm; 2 n^3 FLOPs per call."""
    import jax
    import jax.numpy as jnp
    import torch

    host = np.random.default_rng(0).standard_normal((n, n), np.float32)
    a = jax.device_put(host.astype(dtype))
    mm = jax.jit(jnp.matmul).lower(a, a).compile()

    def run_jax(k: int) -> None:
        for _ in range(k):
            out = mm(a, a)
        out.block_until_ready()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = torch.from_numpy(host).to(device, getattr(torch, dtype))

    def run_torch(k: int) -> None:
        for _ in range(k):
            torch.mm(t, t)
        if device == "cuda":
            torch.cuda.synchronize()

    return [Contender("matmul_jax", "jax", run_jax), Contender("matmul_torch", "torch", run_torch)]


def interleave(
    contenders: Sequence[Contender], *, warmup: int, repeats: int, iters: int, tick: Callable[[], None] = lambda: None
) -> dict[str, list[float]]:
    """Seconds per call of each contender: ``warmup`` untimed rounds, then ``repeats`` timed rounds.

    Each round runs every contender once in a fixed order (A B C A B C ...), so that drift in the
    machine's load hits all alike; one timed run is ``iters`` calls followed by a device sync.
    """
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    for r in range(warmup + repeats):
        for c in contenders:
            t0 = time.perf_counter()
            c.run(iters)
            dt = (time.perf_counter() - t0) / iters
            if r >= warmup:
                times[c.name].append(dt)
            tick()
    return times


def summarize(times: Sequence[float]) -> dict:
    """Median, extremes, quartiles (seconds) and spread = interquartile range / median."""
    t = np.asarray(times, np.float64)
    p25, med, p75 = np.percentile(t, [25, 50, 75])
    return {
        "median_s": float(med),
        "min_s": float(t.min()),
        "max_s": float(t.max()),
        "p25_s": float(p25),
        "p75_s": float(p75),
        "spread": float((p75 - p25) / med),
        "times_s": [float(v) for v in t],
    }


def run_group(
    cfg: ViTConfig,
    variant: str,
    mode: str,
    batch: int,
    dtype: str,
    names: Sequence[str],
    *,
    warmup: int,
    repeats: int,
    iters: int,
    matmul_n: int,
    context: dict,
    tick: Callable[[], None] = lambda: None,
    compile_backend: str = "inductor",
) -> list[dict]:
    """Benchmark ``names`` on one (variant, mode); one record (``RECORD_FIELDS``) per contender and matmul.

    A contender that fails to build (e.g. torch.compile without a compiler) gets a record with
    ``error`` set and no times; the others still run. ``compile_backend``: see ``contenders.build``.

    Raises:
        ValueError: an unknown contender or mode.
    """
    for name in names:
        check(name, mode)
    flops_step = cfg.flops() * batch * (TRAIN_FLOPS_FACTOR if mode == "train" else 1)
    base = (
        dict.fromkeys(RECORD_FIELDS)
        | context
        | {
            "schema": SCHEMA,
            "variant": variant,
            "mode": mode,
            "dtype": dtype,
            "batch": batch,
            "warmup": warmup,
            "repeats": repeats,
            "iters": iters,
            "flops_per_image": cfg.flops(),
            "config": cfg.to_dict(),
        }
    )
    records: dict[str, dict] = {}
    built: list[Contender] = []
    for name in names:
        rec = records[name] = base | {"contender": name, "kind": "model", "flops_per_step": flops_step}
        t0 = time.perf_counter()
        try:
            c = build(name, cfg, mode, batch, dtype, compile_backend)
        except Exception as e:  # noqa: BLE001 -- a peer that cannot build is reported, not fatal
            rec["error"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
            continue
        rec.update(
            framework=c.framework,
            setup_s=time.perf_counter() - t0,
            memory_bytes=c.memory_bytes,
            memory_kind=c.memory_kind,
        )
        built.append(c)
    for c in matmul_contenders(matmul_n, dtype):
        records[c.name] = base | {
            "contender": c.name,
            "kind": "matmul",
            "framework": c.framework,
            "flops_per_step": 2 * matmul_n**3,
            "matmul_n": matmul_n,
        }
        built.append(c)
    for name, t in interleave(built, warmup=warmup, repeats=repeats, iters=iters, tick=tick).items():
        records[name].update(summarize(t))
    ref = max(records[m]["flops_per_step"] / records[m]["median_s"] for m in ("matmul_jax", "matmul_torch"))
    peak = datasheet_peak(context["machine"]["device"], dtype)
    timed = [r for r in records.values() if r["median_s"] is not None]
    models = {r["contender"]: r["median_s"] for r in timed if r["kind"] == "model"}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    for r in timed:
        r.update(
            flops_per_s=r["flops_per_step"] / r["median_s"],
            matmul_flops_per_s=ref,
            peak_flops_per_s=peak,
            load_avg_end=load,
        )
        r.update(mfu_matmul=r["flops_per_s"] / ref, mfu_datasheet=r["flops_per_s"] / peak if peak else None)
        if r["kind"] == "model":
            r.update(
                images_per_s=batch / r["median_s"],
                rel_speed=min(models.values()) / r["median_s"],
                speed_vs={o: t / r["median_s"] for o, t in models.items() if o != r["contender"]},
            )
    return list(records.values())


def default_context() -> dict:
    """Fields shared by every record of a run: time, machine, versions."""
    return {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
    }
