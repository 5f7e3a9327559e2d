"""The table of docs/twin_training.md ("Does my JAX run reproduce my PyTorch run?"): K optimizer steps of both twins
(``vit_compare.training.compare_training``) per recipe pair and dtype, on the same weights and batches.

    python -m benchmarks.train_parity_table --steps 100 --model demo > table.md
    python -m benchmarks.train_parity_table --steps 100 --model ti16 --batch-size 2 --runs timm/timm

Each row is one run: the JAX twin under one recipe, the torch twin under another (the same, or a
recipe with the same numbers, or with big_vision's weight decay translated by
``vit_common.training.recipes.translate``); the cells are the largest relative difference of the parameters
(max |JAX - torch| / max |torch| of a tensor, the largest over tensors) after steps 1, 10 and K (those
up to K). The data are 64 random images of 3 classes at the model's size: 8x8 single-channel (tiny),
28x28 single-channel (demo: ``vit_common.config.DEMO_MODEL``), 224x224 RGB (ti16: ``Ti/16``, timm's
``vit_tiny_patch16_224``); mixup, label smoothing, accumulation over 2 micro-batches, a triggered clip
(0.5) and drop path 0.1 are on. ``--runs`` picks rows by ``JAX/torch`` recipe (``big_vision/timm+`` is
the translated row), ``--dtypes`` by dtype.

``--control EPS`` adds, per dtype, a row that is not the twins: the torch twin against itself, the second
run from the same weights times (1 + EPS u), u uniform in [-1, 1] per element (seed 1; EPS at least the
dtype's machine epsilon, below which float32 rounds the perturbation away), on the same
batches and masks (``control``). A run whose dynamics amplify rounding differences parts there too, so
a parting of the twins at about the same step is the run's, not a difference between them:

    python -m benchmarks.train_parity_table --steps 100 --model ti16 --batch-size 2 --runs twins/twins \
        --dtypes float64 --control 1e-12
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from vit_common.config import DEMO_MODEL, VARIANTS, ViTConfig
from vit_common.data.augment import Augment
from vit_common.data.datasets import ArraySource, Dataset
from vit_common.tolerance import tolerance
from vit_common.training.recipes import OPTAX_SCHEDULE, translate
from vit_common.training.train_config import TrainConfig

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


def control(cfg: ViTConfig, tcfg: TrainConfig, data: Dataset, steps: int, eps: float) -> list[tuple[float, float]]:
    """(largest relative difference of the parameters, of Adam's first moments) after each of ``steps``
    steps of the torch twin against itself from weights perturbed by ``eps`` (relative, per element), on
    the batches and drop-path / dropout masks ``compare_training`` gives both twins."""
    import vit_jax.trainer as jt
    import vit_torch.train as tt
    from vit_compare.training import drop_path_masks, dropout_masks, largest_difference

    a = tt.Trainer(cfg, tcfg, data)
    w = a.weights()
    u = np.random.default_rng(1)
    b = tt.Trainer(cfg, tcfg, data, weights={k: v * (1 + eps * u.uniform(-1, 1, v.shape)) for k, v in w.items()})
    it = jt.Trainer(cfg, tcfg, data, weights=w).train_iterator()  # the one pipeline's batches
    rows = []
    try:
        for k in range(steps):
            batch = next(it)
            masks = drop_path_masks(cfg, tcfg.seed, k, tcfg.batch_size) if cfg.drop_path else None
            drops = dropout_masks(cfg, tcfg.seed, k, tcfg.batch_size) or None
            a.train_step(batch, masks, drops)
            b.train_step(batch, masks, drops)
            mu_a, mu_b = a.adam_state()["mu"], b.adam_state()["mu"]
            rows.append(
                (
                    largest_difference(b.weights(), a.weights(), "parameters", cfg.param_dtype)[0],
                    largest_difference(mu_b, mu_a, "mu", cfg.param_dtype)[0],
                )
            )
    finally:
        it.close()
    return rows


def run_name(jr: str, tr: str, translated: bool) -> str:
    """``--runs``' name of a row: ``JAX/torch``, ``+`` for the translated one."""
    return f"{jr}/{tr}{'+' if translated else ''}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="K: optimizer steps in each twin (cells after 1, 10, K)")
    p.add_argument("--model", choices=tuple(MODELS), default="tiny", help="tiny (8x8, depth 2), demo or ti16")
    p.add_argument("--batch-size", type=int, default=8, help="images a step (2 micro-batches)")
    p.add_argument("--runs", nargs="*", default=None, help="rows by JAX/torch recipe (default all; none: --runs alone)")
    p.add_argument(
        "--dtypes",
        nargs="+",
        choices=("float64", "float32"),
        default=("float64", "float32"),
        help="compute and parameter dtypes of the rows (big_vision's rows compute in float64, mu in bfloat16)",
    )
    p.add_argument(
        "--control",
        type=float,
        default=None,
        metavar="EPS",
        help="add the control row per dtype (EPS raised to the dtype's machine epsilon where smaller)",
    )
    args = p.parse_args(argv)
    names = {run_name(*r[1:]) for r in RUNS}
    if args.runs and not set(args.runs) <= names:
        p.error(f"--runs {sorted(set(args.runs) - names)}: expected some of {sorted(names)}")
    import jax

    from vit_compare.training import compare_training

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
        if dtype not in args.dtypes or (args.runs is not None and run_name(jr, tr, translated) not in args.runs):
            continue
        jax.config.update("jax_enable_x64", dtype == "float64")
        cfg = ViTConfig(**model, num_classes=3, in_chans=chans, dtype=dtype, param_dtype=dtype, drop_path=0.1)
        # two recipes: one schedule (optax's) for both, so that the rows show the optimizers' conventions
        pinned = OPTAX_SCHEDULE if jr != tr else {}
        tt = dataclasses.replace(base, recipe=tr, grad_clip=0.0 if jr != tr else base.grad_clip, **pinned)
        wd = translate(base.weight_decay, base.lr, tr, jr).weight_decay if translated else base.weight_decay
        jt = dataclasses.replace(tt, recipe=jr, weight_decay=wd)
        t0 = time.perf_counter()
        r = compare_training(cfg, jt, data, args.steps, torch_tcfg=tt)
        name = f"{jr} (wd {wd:g}{', translated' if translated else ''})"
        verdict = "equal" if r.ok else f"part at step {r.first_bad_step}"
        cells = " | ".join(f"{r.rows[k - 1].params:.1e}" for k in at)
        label = r.label.replace("first moment", "mu")
        print(
            f"| {args.model} | {label} | {name} | {tr} (wd {tt.weight_decay:g}) | {cells} | "
            f"{verdict} (bound {r.bound[1]:.0e}) | {time.perf_counter() - t0:.0f} |",
            flush=True,
        )
    for dtype in args.dtypes if args.control is not None else ():
        jax.config.update("jax_enable_x64", dtype == "float64")
        cfg = ViTConfig(**model, num_classes=3, in_chans=chans, dtype=dtype, param_dtype=dtype, drop_path=0.1)
        t0 = time.perf_counter()
        eps = max(args.control, float(np.finfo(dtype).eps))  # below its epsilon float32 rounds it away
        rows = control(cfg, base, data, args.steps, eps)
        bound = tolerance("train", dtype)[1]
        bad = next((k + 1 for k, (params, mu) in enumerate(rows) if max(params, mu) > bound), None)
        verdict = "equal" if bad is None else f"part at step {bad}"
        cells = " | ".join(f"{rows[k - 1][0]:.1e}" for k in at)
        print(
            f"| {args.model} | {dtype} | control: torch vs torch, weights x (1 + {eps:.2g} u) | twins "
            f"(wd {base.weight_decay:g}) | {cells} | {verdict} (bound {bound:.0e}) | {time.perf_counter() - t0:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
