"""The GPU check: B/16 parity of the twins, then bf16 throughput of every contender; JSON under OUT.

Run through ``benchmarks/gpu_check.sh`` (sets the environment). Writes, as soon as each part is done:
    OUT/parity.json       B/16 float32 with full matmul precision pinned (JAX "highest", no TF32 in
                          torch): every intermediate of vit_jax against vit_torch; and bf16 compute of
                          both twins against a float64 reference (vit_torch in float64).
    OUT/throughput.jsonl  harness records (``benchmarks.harness.RECORD_FIELDS``), bf16, inference and
                          training, attention through XLA, cuDNN and torch SDPA.
    OUT/table.md          the markdown table of the throughput records.
With --smoke (any machine: mu/16, batch 2) parity.json carries "smoke": true and table.md opens with a
line saying the numbers check the script, not a GPU.
Groups run in order of importance and stop when the time budget is spent, so a cut-off run still
leaves everything measured so far. Exit code 1 if a parity check fails, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

import numpy as np

from vit_common import host_memory

# (variant, mode, batch), most important first: the B/16 targets, then the largest and smallest.
GROUPS = [
    ("B/16", "infer", 256),
    ("B/16", "train", 256),
    ("L/16", "infer", 256),
    ("L/16", "train", 128),
    ("S/16", "infer", 256),
    ("S/16", "train", 256),
    ("Ti/16", "infer", 256),
    ("Ti/16", "train", 256),
]
CONTENDERS = ["vit_jax@xla", "vit_jax@cudnn", "vit_torch", "timm", "hf"]
SMOKE_LINE = "SMOKE RUN (--smoke: mu/16, batch 2): these numbers check the script, they measure nothing."


def _write_json(path: str, obj) -> None:
    from benchmarks.report import write_text

    write_text(path, json.dumps(obj, indent=1, sort_keys=True))


def parity(context: dict, variant: str) -> dict:
    """``variant`` on 2 images: float32 twins (pinned precision) and bf16 twins against float64."""
    import jax
    import torch
    from flax import nnx

    from benchmarks.contenders import inputs, random_state
    from vit_common.config import ViTConfig
    from vit_common.tolerance import compare
    from vit_jax.weights import from_numpy as jax_from_numpy
    from vit_torch.weights import from_numpy as torch_from_numpy
    from vit_torch.weights import tensor_to_numpy

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = ViTConfig.from_name(variant)
    state = random_state(cfg)
    images, _ = inputs(cfg, 2)

    def run_jax(c: ViTConfig) -> dict[str, np.ndarray]:
        graphdef, st = nnx.split(jax_from_numpy(c, state))
        fwd = jax.jit(lambda s, x: nnx.merge(graphdef, s).forward_intermediates(x)[1])
        out = fwd(st, images.transpose(0, 2, 3, 1).astype(c.dtype))
        return {k: np.asarray(v.astype("float32") if v.dtype != np.float64 else v) for k, v in out.items()}

    def run_torch(c: ViTConfig) -> dict[str, np.ndarray]:
        model = torch_from_numpy(c, state, device=device)
        with torch.inference_mode():
            out = model.forward_intermediates(torch.from_numpy(images).to(device))[1]
        return {k: tensor_to_numpy(v.float() if v.dtype == torch.bfloat16 else v) for k, v in out.items()}

    def compare_all(a: dict, ref: dict, dtype: str) -> list[dict]:
        rows = []
        for k in ref:
            what = "attention" if k.startswith("attn") and dtype != "bfloat16" else "tensor"
            c = compare(k, a[k], ref[k], what, dtype)
            rows.append(asdict(c) | {"ok": c.ok})
        return rows

    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        f32 = compare_all(run_jax(cfg), run_torch(cfg), "float32")
    finally:
        jax.config.update("jax_default_matmul_precision", None)
    ref64 = run_torch(cfg.replace(dtype="float64", param_dtype="float64"))
    bf16_cfg = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    result = {
        **context,
        "variant": variant,
        "batch": 2,
        "float32_jax_vs_torch": f32,
        "bfloat16_jax_vs_float64": compare_all(run_jax(bf16_cfg), ref64, "bfloat16"),
        "bfloat16_torch_vs_float64": compare_all(run_torch(bf16_cfg), ref64, "bfloat16"),
    }
    result["ok"] = all(
        r["ok"]
        for key in ("float32_jax_vs_torch", "bfloat16_jax_vs_float64", "bfloat16_torch_vs_float64")
        for r in result[key]
    )
    return result


def main(argv: list[str] | None = None) -> int:
    host_memory.reuse_freed_memory()  # as `vit bench` does, so the records carry the same setting
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"), help="output folder ($OUT)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting groups after this (s)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="check the script itself: variant mu/16, batch 2, one group per mode, any device",
    )
    args = p.parse_args(argv)
    groups = [("mu/16", m, 2) for m in ("infer", "train")] if args.smoke else GROUPS
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)

    from benchmarks import harness, report
    from vit_common.config import ViTConfig

    context = harness.default_context()
    print(json.dumps(context["machine"]), json.dumps(context["versions"]), flush=True)
    try:
        par = parity(context, "mu/16" if args.smoke else "B/16")
    except Exception as e:  # noqa: BLE001 -- keep going to the throughput part, and say what failed
        par = {**context, "ok": False, "error": f"{type(e).__name__}: {e}"}
    _write_json(os.path.join(args.out, "parity.json"), par | {"smoke": args.smoke})
    print(f"parity ok={par['ok']} ({time.perf_counter() - t_start:.0f} s)", flush=True)

    records: list[dict] = []
    for variant, mode, batch in groups:
        if time.perf_counter() - t_start > args.budget_s:
            print(f"budget spent, skipping {variant} {mode}", flush=True)
            continue
        t0 = time.perf_counter()
        group = harness.run_group(
            ViTConfig.from_name(variant),
            variant,
            mode,
            batch,
            "bfloat16",
            CONTENDERS,
            warmup=1,
            repeats=5,
            iters=10,
            matmul_n=256 if args.smoke else 8192,
            context=context,
        )
        records += group
        with open(os.path.join(args.out, "throughput.jsonl"), "a") as f:  # append: a cut-off run keeps it
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in group)
        print(report.terminal_table(group), f"\n({time.perf_counter() - t0:.0f} s)", flush=True)
    if records:
        table = report.markdown_table(records)
        if args.smoke:
            table = f"{SMOKE_LINE}\n\n{table}"
        report.write_text(os.path.join(args.out, "table.md"), table)
    return 0 if par["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
