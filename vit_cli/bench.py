"""`vit bench`: throughput and MFU of the twins beside timm and Hugging Face, interleaved in one run."""

from __future__ import annotations

import argparse

from vit_common.system.validate import arg, int_in


def _csv(s: str) -> list[str]:
    return [v.strip() for v in s.split(",") if v.strip()]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="time inference and training steps of the twins, timm and Hugging Face; MFU",
        description="Time inference (forward, no grad) and a training step (forward, backward, AdamW) of "
        "vit_jax (jit), vit_torch (eager and torch.compile), timm and Hugging Face ViT on one config and "
        "dtype, interleaved A B C A B C beside a large matmul. Prints a table; writes JSON lines (--out) "
        "and a markdown table (--markdown) when asked. Defaults depend on the device: CPU float32, "
        "batch 8, Ti/S/B and a DINOv3-shaped B/16 (RoPE); GPU bfloat16, batch 256, Ti/S/B/L and the DINOv3 row.",
    )
    p.add_argument(
        "--variants",
        type=_csv,
        default=None,
        help="comma-separated, e.g. Ti/16,S/16,B/16; dinov3-B/16: timm vit_base_patch16_dinov3's blocks (RoPE) at B/16",
    )
    p.add_argument("--batch", type=arg(int_in, 1), default=None, help="images per step (default 8 CPU, 256 GPU)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="compute dtype (default float32 on CPU, bfloat16 on GPU)",
    )
    p.add_argument("--modes", type=_csv, default=["infer", "train"], help="infer,train (default both)")
    p.add_argument(
        "--contenders",
        type=_csv,
        default=None,
        help="comma-separated from vit_jax, vit_jax@xla, vit_jax@cudnn, vit_torch, "
        "vit_torch_compile, timm, timm_compile, hf (default: vit_jax, vit_torch, vit_torch_compile, timm, hf; "
        "on GPU timm_compile too)",
    )
    p.add_argument("--image-size", type=arg(int_in, 1), default=None, help="square image size (default 224)")
    p.add_argument("--repeats", type=arg(int_in, 1), default=5, help="timed rounds (default 5)")
    p.add_argument("--warmup", type=arg(int_in, 0), default=1, help="untimed rounds after compilation (default 1)")
    p.add_argument("--iters", type=arg(int_in, 1), default=None, help="calls per timed run (default 1 CPU, 10 GPU)")
    p.add_argument(
        "--matmul-n", type=arg(int_in, 1), default=None, help="reference matmul size (default 2048 CPU, 8192 GPU)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="write JSON lines here (default: none written), replaced at the start and appended to as each "
        "(variant, mode) group is measured, so a stopped run keeps its finished groups; the repository keeps "
        "its measurements as benchmarks/results/TIME-DEVICE-DTYPE.jsonl",
    )
    p.add_argument("--markdown", default=None, help="also write the markdown table to this file")
    p.add_argument(
        "--page",
        default=None,
        help="replace the benchmark block of this markdown page (docs/benchmarks.md) with the table",
    )
    p.add_argument(
        "--cpus",
        type=_csv,
        default=None,
        help="run on these CPU cores only, e.g. 0 (pins the process before JAX and PyTorch "
        "start their thread pools; on a shared machine one pinned core gives steadier ratios)",
    )
    p.add_argument("--json", action="store_true", help="print JSON lines instead of the table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    from benchmarks.contenders import CONTENDERS, check, variant_config

    if args.cpus:
        if not all(c.isdigit() for c in args.cpus):
            raise ValueError(f"--cpus={','.join(args.cpus)}: expected comma-separated core numbers")
        try:
            os.sched_setaffinity(0, {int(c) for c in args.cpus})
        except OSError as e:
            raise ValueError(f"--cpus={','.join(args.cpus)}: {e.strerror}") from None

    for mode in args.modes:
        check("vit_jax", mode)
    for name in args.contenders or []:
        check(name, "infer")
    for name in ("repeats", "warmup", "iters", "batch", "matmul_n"):
        v = getattr(args, name)
        if v is not None and (v < 0 or (v == 0 and name != "warmup")):
            raise ValueError(f"--{name.replace('_', '-')}={v}: expected a positive int")

    import jax
    from tqdm import tqdm

    from benchmarks import harness, report

    gpu = jax.default_backend() == "gpu"
    variants = args.variants or ["Ti/16", "S/16", "B/16"] + (["L/16"] if gpu else []) + ["dinov3-B/16"]
    overrides = {} if args.image_size is None else {"image_size": args.image_size}
    cfgs = {v: variant_config(v, **overrides) for v in variants}  # ValueError on a bad name
    names = args.contenders or [c for c in CONTENDERS if gpu or c != "timm_compile"]
    batch = args.batch or (256 if gpu else 8)
    dtype = args.dtype or ("bfloat16" if gpu else "float32")
    iters = args.iters or (10 if gpu else 1)
    matmul_n = args.matmul_n or (8192 if gpu else 2048)

    context = harness.default_context()
    out = args.out
    if out is not None:
        report.write_text(out, "")  # replaced now; each group is appended as soon as it is measured
    records: list[dict] = []
    total = len(cfgs) * len(args.modes) * (len(names) + 2) * (args.warmup + args.repeats)
    with tqdm(total=total, desc="bench", unit="run", leave=False) as bar:
        for variant, cfg in cfgs.items():
            for mode in args.modes:
                bar.set_postfix_str(f"{variant} {mode}")
                group = harness.run_group(
                    cfg,
                    variant,
                    mode,
                    batch,
                    dtype,
                    names,
                    warmup=args.warmup,
                    repeats=args.repeats,
                    iters=iters,
                    matmul_n=matmul_n,
                    context=context,
                    tick=bar.update,
                )
                if out is not None:
                    report.append_jsonl(group, out)
                records += group
    if args.json:
        import json

        for r in records:
            print(json.dumps(r, sort_keys=True))
    else:
        print(report.terminal_table(records))
        print(f"\nwrote {out}" if out is not None else "\n(--out FILE.jsonl keeps the measurements)")
    table = report.markdown_table(records)
    if args.markdown:
        report.write_text(args.markdown, table)
    if args.page:
        report.update_page(args.page, table)
    return 0
