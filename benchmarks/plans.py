"""Memory plans of `vit train`'s training step for large models on devices this machine may not have
(``vit_jax.memory_plan``: the Trainer's own step compiled ahead of time, never run).

    JAX_PLATFORMS=cpu PYTHONPATH=CUDA_PLUGIN_DIR python -m benchmarks.plans --gpu-target h200.txtpb
    JAX_PLATFORMS=cpu PYTHONPATH=LIBTPU_DIR python -m benchmarks.plans --tpu-topology v5e:1x1
    python -m benchmarks.plans                      # this machine's first device (a CPU: the host)
    python -m benchmarks.plans --table benchmarks/results/plans-*.jsonl   # the manual's table

prints one JSON object per (model, remat): the plan's bytes per device (parameters, optimizer state,
batch, activations, XLA temporaries, total), the device's memory and whether the plan fits (or
``error``: the plan's refusal, where the compiler itself refuses a step over the device's memory, as
libtpu does). The step is the one ``vit train --variant V --image-size 224 --dtype bfloat16 --batch-size B
[--remat]`` compiles
(float32 parameters and AdamW state, bfloat16 compute, 1000 classes) for one device. The models: B/16,
So400m/14, g/14 and ``7B/16``, ViT-7B-shaped (DINOv3 ViT-7B's width 4096, depth 40, 32 heads and
SwiGLU feed-forward of 8192; no registers or RoPE, which change the bytes little).

``--gpu-target FILE``: an XLA ``GpuTargetConfigProto`` in text form (XLA keeps one per GPU model under
``xla/backends/gpu/target_config/specs/``, e.g. ``h200.txtpb``; keep only the fields your jaxlib's XLA
knows); it needs JAX's CUDA plugin importable without a GPU (``pip install --no-deps --target DIR
jax-cuda13-plugin==V jax-cuda13-pjrt==V``, V your jax version). XLA runs with its Triton GEMM fusions off
(their tile search needs a device). ``--tpu-topology NAME`` (libtpu's names, 'v5e:1x1'): needs libtpu
importable (``pip install --no-deps --target DIR libtpu==V``, the version your jax names).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MODELS = ("B/16", "So400m/14", "g/14", "7B/16")
SEVEN_B = dict(width=4096, depth=40, num_heads=32, mlp_dim=8192, mlp_type="swiglu", patch_size=16)


def model_config(name: str, dtype: str):
    """The ViTConfig of ``name`` (a variant, or '7B/16') at 224 px, 1000 classes, ``dtype`` compute."""
    from vit_common.config import ViTConfig

    if name == "7B/16":
        cfg = ViTConfig(**SEVEN_B, image_size=224, num_classes=1000, pool="token", class_token=True)
    else:
        cfg = ViTConfig.from_name(name).replace(image_size=(224, 224), num_classes=1000)
    return cfg.replace(dtype=dtype)


def placeholder_data(cfg, rows: int):
    """A dataset of ``rows`` blank images of ``cfg``'s shape and classes: the Trainer reads only its
    shapes, its classes and its length (the steps of an epoch)."""
    import numpy as np

    from vit_common.data.datasets import ArraySource, Dataset

    h, w = cfg.image_size
    src = ArraySource(np.zeros((rows, h, w, cfg.in_chans), np.uint8), np.arange(rows) % cfg.num_classes)
    return Dataset("blank", src, src, tuple(map(str, range(cfg.num_classes))), (h, w), cfg.in_chans)


def plan_record(name: str, batch: int, dtype: str, remat: bool, target) -> dict:
    """The record printed for one model (``target``: (platform, mesh, memory, device name) or None)."""
    import contextlib

    from vit_common.training.train_config import TrainConfig
    from vit_jax.memory_plan import plan
    from vit_jax.platforms import building_for
    from vit_jax.trainer import Trainer

    cfg = model_config(name, dtype)
    tcfg = TrainConfig(batch_size=batch, remat=remat, epochs=1)
    started = time.perf_counter()
    with building_for(target[0]) if target else contextlib.nullcontext():
        trainer = Trainer(cfg, tcfg, placeholder_data(cfg, batch), target[1] if target else None)
    p = plan(trainer, *(target[2:] if target else ()))
    return {
        "model": name,
        "parameters_count": cfg.param_count(),
        "batch": batch,
        "dtype": dtype,
        "remat": remat,
        "device": p.device,
        "device_memory_bytes": p.device_memory,
        "parameters_bytes": p.parameters,
        "optimizer_state_bytes": p.optimizer_state,
        "batch_bytes": p.batch,
        "activations_bytes": p.activations,
        "temporaries_bytes": p.temporaries,
        "total_bytes": p.total,
        "fits": p.fits(),
        "compile_s": round(time.perf_counter() - started, 1),
    }


def table(records: list[dict]) -> str:
    """The manual's table of plan records (GiB per device), a row each."""
    gib = 2**30
    rows = [
        "| model | device | batch | remat | parameters | optimizer state | activations | XLA temporaries | total "
        "| device memory | fits |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in (r for r in records if "error" not in r):
        cells = [r[k] / gib for k in ("parameters_bytes", "optimizer_state_bytes", "activations_bytes")]
        cells += [r["temporaries_bytes"] / gib, r["total_bytes"] / gib, (r["device_memory_bytes"] or 0) / gib]
        rows.append(
            f"| {r['model']} | {r['device']} | {r['batch']} | {'on' if r['remat'] else 'off'} | "
            + " | ".join(f"{c:.2f}" for c in cells)
            + f" | {'yes' if r['fits'] else 'no'} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default {','.join(MODELS)})")
    p.add_argument("--batch", type=int, default=32, help="images per step on the one device (default 32)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--remat", choices=("off", "on", "both"), default="both")
    t = p.add_mutually_exclusive_group()
    t.add_argument("--gpu-target", default=None, help="GpuTargetConfigProto text file: plan for that GPU")
    t.add_argument("--tpu-topology", default=None, help="a TPU slice of one chip, libtpu's name (v5e:1x1)")
    p.add_argument("--table", nargs="+", metavar="JSONL", help="print the records of these files as a table")
    args = p.parse_args(argv)
    if args.table:
        records = []
        for path in args.table:
            with open(path) as f:
                records += [json.loads(line) for line in f if line.strip()]
        print(table(records))
        return 0
    if args.batch < 1:
        p.error(f"--batch={args.batch}: expected a positive int")
    target_text = None
    if args.gpu_target:
        try:
            with open(args.gpu_target) as f:
                target_text = f.read()
        except OSError as e:
            p.error(f"--gpu-target={args.gpu_target}: {e}")
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_enable_triton_gemm=false".strip()
    from vit_jax import memory_plan

    target = None
    if target_text is not None:
        try:
            platform, mesh = memory_plan.gpu_target(target_text)
        except ValueError as e:
            p.error(f"--gpu-target={args.gpu_target}: {e}")
        device = mesh.devices.flat[0].device_kind
        target = (platform, mesh, memory_plan.gpu_memory(target_text), device)
    elif args.tpu_topology:
        platform, mesh = memory_plan.tpu_target(args.tpu_topology)
        target = (platform, mesh, None, None)
    remats = {"off": (False,), "on": (True,), "both": (False, True)}[args.remat]
    for name in args.models.split(","):
        for remat in remats:
            try:
                record = plan_record(name, args.batch, args.dtype, remat, target)
            except ValueError as e:  # a compiler that refuses a step over the device's memory (libtpu's)
                record = {"model": name, "batch": args.batch, "dtype": args.dtype, "remat": remat, "error": str(e)}
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
