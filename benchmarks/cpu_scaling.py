"""How the parts of a ViT block speed up from one CPU core to all of them, in JAX and in PyTorch.

Why it exists: on CPU, ``vit_jax``'s training step trails the torch peers, and a profile puts the gap
in attention. This measures two parts of a block's work (LayerNorm, GELU and the residual adds are in
neither), forward + backward, float32, each on one pinned core and then on all usable cores (one child
process per core set, pinned with ``sched_setaffinity`` before JAX and torch start their thread pools):

- ``attention``: softmax attention on q, k, v of [B, L, N, D/N] (as the qkv projection leaves
  them). JAX: ``vit_jax.model._attend`` (what the twin runs on CPU, head transposes included) under
  ``jax.jit(jax.value_and_grad(...))``; torch: ``F.scaled_dot_product_attention`` on [B, N, L, D/N]
  views of them (timm's path; on CPU its fused flash-attention kernel). FLOPs: 4 B N L^2 (D/N)
  forward (q.k and probabilities.v), 2x that backward. torch's fused backward also recomputes q.k
  (a fifth matmul, not credited: its FLOP/s are understated by about 1/7).
- ``linear``: the block's four matmuls on x [B*L, D]: qkv (D -> 3D), proj (D -> D), fc1 (D -> F),
  fc2 (F -> D), with gradients for the inputs and the weights, each framework with its own layer's
  weight layout: JAX ``x @ kernel`` (flax, [in, out]), torch ``F.linear`` (timm, [out, in]). FLOPs:
  2 B L D (4D + 2F) forward, 2x backward.

Each part's loss is sum(output^2 * fixed random weights g) (squared, so that no framework can skip a
forward matmul: the gradient needs the output), so both frameworks do the same work. The
parts run interleaved (A B C D A B C D ...) after warm-up; a record per (core set, framework, part).

    python -m benchmarks.cpu_scaling                     # Ti/16 and S/16, batch 8, 1 core vs all
    python -m benchmarks.cpu_scaling --variants B/16 --repeats 9 --out scaling.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np

from benchmarks import harness
from benchmarks.contenders import Contender
from vit_common.config import ViTConfig

SCHEMA = "vit-cpu-scaling/1"
PARTS = ("attention", "linear")
FRAMEWORKS = ("jax", "torch")
BACKWARD_FACTOR = harness.TRAIN_FLOPS_FACTOR  # forward + backward = 3x the forward's FLOPs
# Keys whose meaning is the same as in `vit bench` records (harness.RECORD_FIELDS).
_SHARED_FIELDS = "schema versions variant config warmup repeats times_s median_s min_s max_s p25_s p75_s spread".split()
# Every record (one JSON line) has exactly these keys.
RECORD_FIELDS: dict[str, str] = {k: harness.RECORD_FIELDS[k] for k in _SHARED_FIELDS} | {
    "time": "start of the child run, UTC ISO 8601",
    "machine": "as in vit bench records (cores = the cores this child was pinned to)",
    "batch": "images per call",
    "part": "'attention' or 'linear' (see module doc)",
    "framework": "'jax' or 'torch'",
    "cpus": "the core numbers the child was pinned to",
    "cores": "len(cpus)",
    "flops": "forward + backward FLOPs per call (module doc)",
    "flops_per_s": "flops / median_s",
}


def part_flops(cfg: ViTConfig, batch: int, part: str) -> int:
    """Forward + backward FLOPs of ``part`` for one block at ``batch`` images (module doc formulas)."""
    b, length, d, heads = batch, cfg.seq_len, cfg.width, cfg.num_heads
    if part == "attention":
        fwd = 4 * b * heads * length**2 * (d // heads)
    elif part == "linear":
        fwd = 2 * b * length * d * (4 * d + 2 * cfg.mlp_dim)
    else:
        raise ValueError(f"part {part!r}: expected one of {PARTS}")
    return BACKWARD_FACTOR * fwd


def inputs(cfg: ViTConfig, batch: int) -> dict[str, np.ndarray]:
    """float32 operands shared by both frameworks: q, k, v and the loss weights g [B, L, N, D/N];
    x [B*L, D], h [B*L, F], weights w_qkv [D, 3D], w_proj [D, D], w_fc1 [D, F], w_fc2 [F, D] ([in, out]),
    and the loss weights of the four outputs g_qkv, g_proj, g_fc1, g_fc2 [B*L, out]."""
    rng = np.random.default_rng(0)
    b, length, d, heads, f = batch, cfg.seq_len, cfg.width, cfg.num_heads, cfg.mlp_dim
    m = b * length
    shapes = {name: (b, length, heads, d // heads) for name in ("q", "k", "v", "g")}
    shapes |= {"x": (m, d), "w_qkv": (d, 3 * d), "w_proj": (d, d), "w_fc1": (d, f), "w_fc2": (f, d)}
    shapes |= {"g_qkv": (m, 3 * d), "g_proj": (m, d), "g_fc1": (m, f), "h": (m, f), "g_fc2": (m, d)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _loss(y, g):
    """sum(y^2 * g): the same expression in JAX and torch (both overload the operators)."""
    return (y * y * g).sum()


def jax_functions(cfg: ViTConfig, a: dict[str, np.ndarray]) -> dict[str, tuple[Callable, list]]:
    """{part: (jitted forward + backward, its arguments)} for JAX, on the operands of ``inputs``."""
    import jax
    import jax.numpy as jnp

    from vit_jax.model import _attend

    j = {k: jnp.asarray(v) for k, v in a.items()}
    scale = cfg.head_dim**-0.5

    def attention_loss(q, k, v, g):
        return _loss(_attend(q, k, v, scale)[0], g)

    def linear_loss(x, h, w_qkv, w_proj, w_fc1, w_fc2, g_qkv, g_proj, g_fc1, g_fc2):
        return _loss(x @ w_qkv, g_qkv) + _loss(x @ w_proj, g_proj) + _loss(x @ w_fc1, g_fc1) + _loss(h @ w_fc2, g_fc2)

    lin_names = ("x", "h", "w_qkv", "w_proj", "w_fc1", "w_fc2", "g_qkv", "g_proj", "g_fc1", "g_fc2")
    return {
        "attention": (jax.jit(jax.value_and_grad(attention_loss, argnums=(0, 1, 2))), [j[k] for k in "qkvg"]),
        "linear": (jax.jit(jax.value_and_grad(linear_loss, argnums=tuple(range(6)))), [j[k] for k in lin_names]),
    }


def _jax_parts(cfg: ViTConfig, a: dict[str, np.ndarray]) -> dict[str, Callable[[int], None]]:
    import jax

    def runner(f, args):
        def run(n: int) -> None:
            for _ in range(n):
                out = f(*args)
            jax.block_until_ready(out)

        return run

    return {part: runner(f, args) for part, (f, args) in jax_functions(cfg, a).items()}


def torch_functions(a: dict[str, np.ndarray]) -> dict[str, tuple[Callable[[], object], tuple]]:
    """{part: (function returning the loss tensor, the leaves it differentiates)} for torch, on the
    operands of ``inputs``; the leaves are in the order of ``jax_functions``' gradients."""
    import torch
    import torch.nn.functional as F

    def leaf(name: str) -> torch.Tensor:
        v = a[name].T if name.startswith("w_") else a[name]  # weights [out, in], as torch.nn.Linear keeps them
        return torch.from_numpy(np.ascontiguousarray(v)).requires_grad_()

    q, k, v = (leaf(n) for n in ("q", "k", "v"))  # [B, L, N, D/N]
    g = torch.from_numpy(a["g"])
    x, h, w_qkv, w_proj, w_fc1, w_fc2 = (leaf(n) for n in ("x", "h", "w_qkv", "w_proj", "w_fc1", "w_fc2"))
    gs = {n: torch.from_numpy(a[n]) for n in ("g_qkv", "g_proj", "g_fc1", "g_fc2")}

    def attention():
        heads = [t.transpose(1, 2) for t in (q, k, v)]  # [B, N, L, D/N] views, as timm's permute gives
        return _loss(F.scaled_dot_product_attention(*heads).transpose(1, 2), g)

    def linear():
        return (
            _loss(F.linear(x, w_qkv), gs["g_qkv"])
            + _loss(F.linear(x, w_proj), gs["g_proj"])
            + _loss(F.linear(x, w_fc1), gs["g_fc1"])
            + _loss(F.linear(h, w_fc2), gs["g_fc2"])
        )

    return {"attention": (attention, (q, k, v)), "linear": (linear, (x, h, w_qkv, w_proj, w_fc1, w_fc2))}


def _torch_parts(a: dict[str, np.ndarray]) -> dict[str, Callable[[int], None]]:
    def runner(f, leaves):
        def run(n: int) -> None:
            for _ in range(n):
                for t in leaves:
                    t.grad = None
                f().backward()

        return run

    return {part: runner(f, leaves) for part, (f, leaves) in torch_functions(a).items()}


def measure(
    variants: list[str], batch: int, warmup: int, repeats: int, cpus: list[int], image_size: int | None = None
) -> list[dict]:
    """Records (``RECORD_FIELDS``) for every variant x framework x part, run on the cores this process has.

    Call it in a process already pinned to ``cpus`` (``main`` does this per child).
    """
    import torch

    torch.set_num_threads(len(cpus))
    context = harness.default_context()
    records = []
    for variant in variants:
        cfg = ViTConfig.from_name(variant, **({} if image_size is None else {"image_size": image_size}))
        a = inputs(cfg, batch)
        runs = {"jax": _jax_parts(cfg, a), "torch": _torch_parts(a)}
        contenders = [Contender(f"{fw}/{p}", fw, runs[fw][p]) for p in PARTS for fw in FRAMEWORKS]
        for c in contenders:
            c.run(1)  # compile (jax), first allocation (torch)
        times = harness.interleave(contenders, warmup=warmup, repeats=repeats, iters=1)
        for name, t in times.items():
            fw, part = name.split("/")
            stats = harness.summarize(t)
            flops = part_flops(cfg, batch, part)
            records.append(
                context
                | {"schema": SCHEMA, "variant": variant, "config": cfg.to_dict(), "batch": batch}
                | {"warmup": warmup, "repeats": repeats}
                | {"part": part, "framework": fw}
                | {"cpus": cpus, "cores": len(cpus), "flops": flops}
                | stats
                | {"flops_per_s": flops / stats["median_s"]}
            )
    return records


def table(records: list[dict]) -> str:
    """Markdown: per variant and part, each framework's time on 1 core and on all, and the speedup."""
    by = {(r["variant"], r["part"], r["framework"], r["cores"]): r for r in records}
    counts = sorted({r["cores"] for r in records})
    head = "| variant | part (fwd + bwd) | framework | " + " | ".join(
        f"{n} core{'s' if n > 1 else ''} ms (GFLOP/s)" for n in counts
    )
    head += f" | speedup {counts[0]} -> {counts[-1]} |" if len(counts) > 1 else " |"
    lines = [head, "|---" * (3 + len(counts) + (len(counts) > 1)) + "|"]
    for variant in dict.fromkeys(r["variant"] for r in records):
        for part in PARTS:
            for fw in FRAMEWORKS:
                recs = [by[variant, part, fw, n] for n in counts]
                cells = [f"{r['median_s'] * 1e3:.1f} ({r['flops_per_s'] / 1e9:.1f})" for r in recs]
                if len(recs) > 1:
                    cells.append(f"{recs[0]['median_s'] / recs[-1]['median_s']:.2f}x")
                lines.append(f"| {variant} | {part} | {fw} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cpu_list(s: str) -> list[int]:
    if not s or not all(c.strip().isdigit() for c in s.split(",")):
        raise argparse.ArgumentTypeError(f"{s!r}: expected comma-separated core numbers, e.g. 0,1")
    return sorted({int(c) for c in s.split(",")})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.cpu_scaling", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--variants", default="Ti/16,S/16", help="comma-separated (default Ti/16,S/16)")
    p.add_argument("--batch", type=int, default=8, help="images per call (default 8)")
    p.add_argument("--image-size", type=int, default=None, help="square image size (default: the variant's, 224)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds (default 2)")
    p.add_argument("--repeats", type=int, default=15, help="timed rounds (default 15)")
    p.add_argument("--out", default=None, help="JSON lines file (default: print only)")
    p.add_argument("--child-cpus", type=_cpu_list, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    variants = list(dict.fromkeys(v.strip() for v in args.variants.split(",") if v.strip()))
    if not variants:
        p.error(f"--variants={args.variants!r}: expected comma-separated variant names, e.g. Ti/16,S/16")
    overrides = {} if args.image_size is None else {"image_size": args.image_size}
    for v in variants:
        try:
            ViTConfig.from_name(v, **overrides)  # a bad variant or size is named before any child starts
        except ValueError as e:
            p.error(str(e))
    for name in ("batch", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}={getattr(args, name)}: expected a positive int")
    if args.warmup < 0:
        p.error(f"--warmup={args.warmup}: expected an int >= 0")
    if args.out is not None and (not args.out or os.path.isdir(args.out)):
        p.error(f"--out={args.out!r}: expected a file path")

    if args.child_cpus is not None:
        try:
            os.sched_setaffinity(0, args.child_cpus)  # before JAX and torch create their thread pools
        except OSError as e:
            p.error(f"--child-cpus={','.join(map(str, args.child_cpus))}: {e.strerror}")
        from vit_common.system.host_memory import reuse_freed_memory

        reuse_freed_memory()
        recs = measure(variants, args.batch, args.warmup, args.repeats, args.child_cpus, args.image_size)
        print(json.dumps(recs))
        return 0

    usable = sorted(os.sched_getaffinity(0))
    core_sets = [usable[:1]] + ([usable] if len(usable) > 1 else [])
    records: list[dict] = []
    for cpus in core_sets:
        cmd = [sys.executable, "-m", "benchmarks.cpu_scaling", "--child-cpus", ",".join(map(str, cpus))]
        cmd += ["--variants", ",".join(variants), "--batch", str(args.batch)]
        cmd += ["--warmup", str(args.warmup), "--repeats", str(args.repeats)]
        cmd += [] if args.image_size is None else ["--image-size", str(args.image_size)]
        child = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # its stderr goes to ours
        if child.returncode != 0:
            p.exit(1, f"{p.prog}: the run on cores {cpus} failed with exit code {child.returncode} (see above)\n")
        records += json.loads(child.stdout.strip().splitlines()[-1])
    print(table(records))
    if args.out:
        from benchmarks.report import write_jsonl

        try:
            write_jsonl(records, args.out)
        except OSError as e:
            p.exit(2, f"{p.prog}: --out={args.out!r}: {e}\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
