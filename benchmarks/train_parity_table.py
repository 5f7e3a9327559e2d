"""The README table "Does my JAX run reproduce my PyTorch run?": K optimizer steps of both twins
(``vit_cli.train_parity.compare_training``) per recipe pair and dtype, on the same weights and batches.

    python -m benchmarks.train_parity_table --steps 100 --model demo > table.md
    python -m benchmarks.train_parity_table --steps 100 --model ti16 --batch-size 2 --runs timm/timm

Each row is one run: the JAX twin under one recipe, the torch twin under another (the same, or a
recipe with the same numbers, or with big_vision's weight decay translated by
``vit_common.recipes.translate``); the cells are the largest relative difference of the parameters
(max |JAX - torch| / max |torch| of a tensor, the largest over tensors) after steps 1, 10 and K (those
up to K). The data are 64 random images of 3 classes at the model's size: 8x8 single-channel (tiny),
28x28 single-channel (demo: ``vit_cli.train.DEMO_MODEL``), 224x224 RGB (ti16: ``Ti/16``, timm's
``vit_tiny_patch16_224``); mixup, label smoothing, accumulation over 2 micro-batches, a triggered clip
(0.5) and drop path 0.1 are on. ``--runs`` picks rows by ``JAX/torch`` recipe (``big_vision/timm+`` is
the translated row), ``--dtypes`` by dtype.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from vit_cli.train import DEMO_MODEL
from vit_common.config import VARIANTS, ViTConfig
from vit_common.data.datasets import ArraySource, Augment, Dataset
from vit_common.data.train_config import TrainConfig
from vit_common.recipes import translate

MODELS = {
    "tiny": dict(image_size=8, patch_size=4, width=16, depth=2, num_heads=2, mlp_dim=32, in_chans=1),
    "demo": dict(DEMO_MODEL, class_token=False, in_chans=1),
    "ti16": dict(VARIANTS["Ti"], image_size=224, patch_size=16, in_chans=3),
}
# (dtype, JAX recipe, torch recipe, translate big_vision's weight decay from timm's)
RUNS = [("float64", r, r, False) for r in ("twins", "timm", "torch", "optax", "big_vision")] + [
    ("float64", "big_vision", "timm", False),
    ("float64", "big_vision", "timm", True),
] + [("float32", r, r, False) for r in ("twins", "timm", "torch", "optax")]  # fmt: skip


def run_name(jr: str, tr: str, translated: bool) -> str:
    """``--runs``' name of a row: ``JAX/torch``, ``+`` for the translated one."""
    return f"{jr}/{tr}{'+' if translated else ''}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", choices=tuple(MODELS), default="tiny")
    p.add_argument("--batch-size", type=int, default=8, help="images a step (2 micro-batches)")
    p.add_argument("--runs", nargs="+", default=None, help="rows by JAX/torch recipe (default all)")
    p.add_argument("--dtypes", nargs="+", choices=("float64", "float32"), default=("float64", "float32"))
    args = p.parse_args(argv)
    names = {run_name(*r[1:]) for r in RUNS}
    if args.runs and not set(args.runs) <= names:
        p.error(f"--runs {sorted(set(args.runs) - names)}: expected some of {sorted(names)}")
    import jax

    from vit_cli.train_parity import compare_training

    model = dict(MODELS[args.model])
    size, chans = model["image_size"], model.pop("in_chans")
    rng = np.random.default_rng(0)
    src = lambda n: ArraySource(rng.integers(0, 256, (n, size, size, chans), dtype=np.uint8), np.arange(n) % 3)  # noqa: E731
    data = Dataset("random", src(64), src(8), ("a", "b", "c"), (size, size), chans)
    base = TrainConfig(
        batch_size=args.batch_size, epochs=-(-args.steps * args.batch_size // 64), warmup_steps=0, lr=1e-3,
        weight_decay=0.05, grad_clip=0.5, accum_steps=2, label_smoothing=0.1, augment=Augment(mixup=0.8),
    )  # fmt: skip
    at = [k for k in (1, 10, args.steps) if k <= args.steps]
    at = sorted(set(at))
    print(
        f"| model | dtype | JAX recipe | torch recipe | {' | '.join(f'params, step {k}' for k in at)} | verdict | s |"
    )
    print(f"| --- | --- | --- | --- | {' | '.join('---:' for _ in at)} | --- | ---: |")
    for dtype, jr, tr, translated in RUNS:
        if dtype not in args.dtypes or (args.runs and run_name(jr, tr, translated) not in args.runs):
            continue
        jax.config.update("jax_enable_x64", dtype == "float64")
        cfg = ViTConfig(**model, num_classes=3, in_chans=chans, dtype=dtype, param_dtype=dtype, drop_path=0.1)
        tt = dataclasses.replace(base, recipe=tr, grad_clip=0.0 if jr != tr else base.grad_clip)
        wd = translate(base.weight_decay, base.lr, tr, jr).weight_decay if translated else base.weight_decay
        jt = dataclasses.replace(tt, recipe=jr, weight_decay=wd)
        t0 = time.perf_counter()
        r = compare_training(cfg, jt, data, args.steps, torch_tcfg=tt)
        name = f"{jr} (wd {wd:g}{', translated' if translated else ''})"
        verdict = "equal" if r.ok else f"part at step {r.first_bad_step}"
        cells = " | ".join(f"{r.rows[k - 1].params:.1e}" for k in at)
        print(
            f"| {args.model} | {r.dtype} | {name} | {tr} (wd {tt.weight_decay:g}) | {cells} | "
            f"{verdict} (bound {r.bound[1]:.0e}) | {time.perf_counter() - t0:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
