"""The README table "Does my JAX run reproduce my PyTorch run?": K optimizer steps of both twins
(``vit_cli.train_parity.compare_training``) per recipe pair and dtype, on the same weights and batches.

    python -m benchmarks.train_parity_table --steps 10 [--model tiny|demo] > table.md

Each row is one run: the JAX twin under one recipe, the torch twin under another (the same, or a
recipe with the same numbers, or with big_vision's weight decay translated by
``vit_common.recipes.translate``); the cells are the largest relative difference of the parameters
(max |JAX - torch| / max |torch| of a tensor, the largest over tensors) after step 1 and step K.
The data are 64 random 8x8 (tiny) or 28x28 (demo) single-channel images of 3 classes; mixup, label
smoothing, accumulation over 2 micro-batches, a triggered clip (0.5) and drop path 0.1 are on.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from vit_common.config import ViTConfig
from vit_common.data.datasets import ArraySource, Augment, Dataset
from vit_common.data.train_config import TrainConfig
from vit_common.recipes import translate

MODELS = {
    "tiny": dict(image_size=8, patch_size=4, width=16, depth=2, num_heads=2, mlp_dim=32),
    "demo": dict(
        image_size=28, patch_size=7, width=128, depth=4, num_heads=4, mlp_dim=256, pool="gap", class_token=False
    ),
}
# (dtype, JAX recipe, torch recipe, translate big_vision's weight decay from timm's)
RUNS = [("float64", r, r, False) for r in ("twins", "timm", "torch", "optax", "big_vision")] + [
    ("float64", "big_vision", "timm", False),
    ("float64", "big_vision", "timm", True),
    ("float32", "twins", "twins", False),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", choices=tuple(MODELS), default="tiny")
    args = p.parse_args(argv)
    import jax

    from vit_cli.train_parity import compare_training

    size = MODELS[args.model]["image_size"]
    rng = np.random.default_rng(0)
    src = lambda n: ArraySource(rng.integers(0, 256, (n, size, size, 1), dtype=np.uint8), np.arange(n) % 3)  # noqa: E731
    data = Dataset("random", src(64), src(8), ("a", "b", "c"), (size, size), 1)
    base = TrainConfig(
        batch_size=8, epochs=-(-args.steps // 8), warmup_steps=0, lr=1e-3, weight_decay=0.05, grad_clip=0.5,
        accum_steps=2, label_smoothing=0.1, augment=Augment(mixup=0.8),
    )  # fmt: skip
    print(f"| model | dtype | JAX recipe | torch recipe | params, step 1 | params, step {args.steps} | verdict | s |")
    print("| --- | --- | --- | --- | ---: | ---: | --- | ---: |")
    for dtype, jr, tr, translated in RUNS:
        jax.config.update("jax_enable_x64", dtype == "float64")
        cfg = ViTConfig(**MODELS[args.model], num_classes=3, in_chans=1, dtype=dtype, param_dtype=dtype, drop_path=0.1)
        tt = dataclasses.replace(base, recipe=tr, grad_clip=0.0 if jr != tr else base.grad_clip)
        wd = translate(base.weight_decay, base.lr, tr, jr).weight_decay if translated else base.weight_decay
        jt = dataclasses.replace(tt, recipe=jr, weight_decay=wd)
        t0 = time.perf_counter()
        r = compare_training(cfg, jt, data, args.steps, torch_tcfg=tt)
        name = f"{jr} (wd {wd:g}{', translated' if translated else ''})"
        verdict = "equal" if r.ok else f"part at step {r.first_bad_step}"
        print(
            f"| {args.model} | {r.dtype} | {name} | {tr} (wd {tt.weight_decay:g}) | {r.rows[0].params:.1e} | "
            f"{r.rows[-1].params:.1e} | {verdict} (bound {r.bound[1]:.0e}) | {time.perf_counter() - t0:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
