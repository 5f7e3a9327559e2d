"""What rotary position embeddings (RoPE) cost on CPU: a DINOv3-shaped model in the twins beside timm's
Eva, and RoPE's share of one block, inference (no gradients), float32.

Two interleaved groups (A B C A B C ..., ``harness.interleave``; medians and ratios, because the
machine may be shared):

- ``model``: the forward of ``dinov3-B/16`` (``contenders.variant_config``: timm
  ``vit_base_patch16_dinov3``'s choices) in ``vit_jax`` (jit), ``vit_torch`` and timm's ``Eva``, the
  contenders ``vit bench`` times. ``speed_vs_timm`` = timm's median / the contender's (> 1: faster).
- ``block``: one of its blocks on x [B, L, D] in each twin, with the model's RoPE tables (``rope``)
  and the same block and weights without them (``plain``), and the rotation alone (``op``: the
  twin's ``apply_rope`` of q and of k [B, L, N, hd], the tables as the model holds them: jit
  constants in JAX, computed once per forward in torch). ``tables`` times the torch twin's
  ``RotaryEmbedding`` call, made once per forward. RoPE's share of a block:
  ``(rope - plain) / rope`` (``delta_share``) and ``op / rope`` (``op_share``).

    python -m benchmarks.rope_speed                                  # batch 8, 224 px, print
    python -m benchmarks.rope_speed --batch 2 --cpus 0 --block-repeats 21 --out benchmarks/results/rope-speed-cpu.json

``--cpus`` pins the process before JAX and torch start their thread pools (on a shared machine one
pinned core gives steadier ratios; torch's threads then number one).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

import numpy as np

from benchmarks import harness
from benchmarks.contenders import Contender, build, variant_config
from vit_common.config import ViTConfig
from vit_common.system import io

VARIANT = "dinov3-B/16"
MODELS = ("vit_jax", "vit_torch", "timm")


def _jax_parts(cfg: ViTConfig, x: np.ndarray) -> list[Contender]:
    import jax
    from flax import nnx

    from vit_jax.model import Block
    from vit_jax.rope import RotaryEmbedding, apply_rope

    block = Block(cfg, 0.0, rngs=nnx.Rngs(0))  # the block's own initialisation: the values do not change the work
    block.eval()
    graphdef, state = nnx.split(block)
    sin, cos = RotaryEmbedding(cfg)(cfg.grid)  # constants of the jitted programs, as in the model
    h = jax.device_put(x)
    qk = [jax.device_put(x.reshape(*x.shape[:2], cfg.num_heads, -1)) for _ in range(2)]  # q, k [B, L, N, hd]

    def rotate(qk):
        return [apply_rope(t, sin, cos, cfg.num_prefix_tokens, cfg.rope_layout) for t in qk]

    programs = {
        "rope": (jax.jit(lambda s, h: nnx.merge(graphdef, s)(h, rope=(sin, cos))[0]), (state, h)),
        "plain": (jax.jit(lambda s, h: nnx.merge(graphdef, s)(h)[0]), (state, h)),
        "op": (jax.jit(rotate), (qk,)),
    }
    out = []
    for part, (fn, args) in programs.items():
        compiled = fn.lower(*args).compile()
        out.append(
            Contender(f"vit_jax/{part}", "jax", _repeat(lambda c=compiled, a=args: jax.block_until_ready(c(*a))))
        )
    return out


def _torch_parts(cfg: ViTConfig, x: np.ndarray) -> list[Contender]:
    import torch

    from vit_torch.model import Block
    from vit_torch.rope import RotaryEmbedding, apply_rope

    block = Block(cfg, 0.0).eval()
    rope_tables = RotaryEmbedding(cfg)
    tables = rope_tables(cfg.grid, torch.device("cpu"))
    h = torch.from_numpy(x)
    q, k = (h.reshape(*x.shape[:2], cfg.num_heads, -1).clone() for _ in range(2))
    calls: dict[str, Callable[[], object]] = {
        "rope": lambda: block(h, rope=tables),
        "plain": lambda: block(h),
        "op": lambda: [apply_rope(t, *tables, cfg.num_prefix_tokens, cfg.rope_layout) for t in (q, k)],
        "tables": lambda: rope_tables(cfg.grid, torch.device("cpu")),
    }

    def inference(call: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            with torch.inference_mode():
                call()

        return run

    return [Contender(f"vit_torch/{part}", "torch", _repeat(inference(call))) for part, call in calls.items()]


def _repeat(call: Callable[[], object]) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            call()

    return run


def _medians(contenders: list[Contender], warmup: int, repeats: int, iters: int) -> dict[str, dict]:
    times = harness.interleave(contenders, warmup=warmup, repeats=repeats, iters=iters)
    return {name: harness.summarize(t) for name, t in times.items()}


def measure_rope(variant: str, batch: int, image_size: int, warmup: int, repeats: int, block_repeats: int) -> dict:
    """The record written to ``--out``: context, the config, both groups' timings and the ratios."""
    cfg = variant_config(variant, image_size=image_size)
    record = harness.default_context() | {"variant": variant, "batch": batch, "config": cfg.to_dict()}
    models = [build(name, cfg, "infer", batch, "float32") for name in MODELS]
    record["model"] = _medians(models, warmup, repeats, 1)
    timm = record["model"]["timm"]["median_s"]
    record["speed_vs_timm"] = {n: timm / record["model"][n]["median_s"] for n in MODELS if n != "timm"}
    x = np.random.default_rng(2).standard_normal((batch, cfg.seq_len, cfg.width), np.float32)  # [B, L, D]
    parts = _jax_parts(cfg, x) + _torch_parts(cfg, x)
    record["block"] = blocks = _medians(parts, warmup, block_repeats, 1)
    record["share"] = {}
    for twin in ("vit_jax", "vit_torch"):
        rope, plain, op = (blocks[f"{twin}/{p}"]["median_s"] for p in ("rope", "plain", "op"))
        record["share"][twin] = {"delta_share": (rope - plain) / rope, "op_share": op / rope}
    forward = record["model"]["vit_torch"]["median_s"]
    record["share"]["vit_torch"]["tables_share_of_forward"] = blocks["vit_torch/tables"]["median_s"] / forward
    return record


def rope_summary(record: dict) -> str:
    """Medians (ms) and the ratios, one line each."""
    lines = [f"{record['variant']}, batch {record['batch']}, {record['config']['image_size']}, float32 inference"]
    lines += [
        f"  {name:22s} {r['median_s'] * 1e3:9.2f} ms  spread {r['spread']:.0%}" for name, r in record["model"].items()
    ]
    lines += [f"  speed vs timm's Eva: {name} {v:.2f}x" for name, v in record["speed_vs_timm"].items()]
    lines += [
        f"  {name:22s} {r['median_s'] * 1e3:9.2f} ms  spread {r['spread']:.0%}" for name, r in record["block"].items()
    ]
    for twin, s in record["share"].items():
        lines.append(f"  {twin}: RoPE share of a block {s['delta_share']:.1%} (delta), {s['op_share']:.1%} (op)")
    lines.append(f"  vit_torch tables per forward: {record['share']['vit_torch']['tables_share_of_forward']:.2%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--variant", default=VARIANT, help=f"a vit bench variant with RoPE (default {VARIANT})")
    p.add_argument("--batch", type=int, default=8, help="images per call (default 8)")
    p.add_argument("--image-size", type=int, default=224, help="square image size (default 224)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds of the models (default 5)")
    p.add_argument("--block-repeats", type=int, default=15, help="timed rounds of the block parts (default 15)")
    p.add_argument("--cpus", default=None, help="run on these CPU cores only, e.g. 0 (default: all usable)")
    p.add_argument("--out", default=None, help="write the record as JSON here (default: print only)")
    args = p.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    record = measure_rope(args.variant, args.batch, args.image_size, args.warmup, args.repeats, args.block_repeats)
    print(rope_summary(record))
    if args.out:
        io.write_text(args.out, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
