"""A run of ``vit train`` as a library: train or fine-tune the JAX twin in a run folder, export it, and
check the exports.

``run_training(spec)`` does what ``vit train`` does after reading its flags: it starts the processes of
a multi-process run (``vit_jax.distributed``), takes the run folder's lock, reads the dataset, builds
the model (a fresh one from ``RunSpec.model``, or the checkpoint of ``TrainConfig.init`` through
``vit_jax.finetune``: ``fresh_start``, ``finetune_start`` or ``resumed_finetune_start``, each returning
the ``Start`` record the run consumes), trains it (``vit_jax.loop.fit``), exports it
(``vit_jax.finetune.export``), plots curves.png and checks the exports with the ``parity`` function it is
given. That check runs the exports in PyTorch and in their libraries, so it is passed in
(``vit_compare.exports.export_parity``) and importing this module loads no torch. Progress goes to
stderr, a line each ("vit train: ..."), on process 0 and unless ``RunSpec.quiet``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vit_common.config import ViTConfig
from vit_common.data.datasets import Dataset, natural_images
from vit_common.data.images import Preprocess
from vit_common.system import in_place, io
from vit_common.system.extras import install_hint
from vit_common.system.validate import check_model_size
from vit_common.training.train_config import RunOptions, TrainConfig

if TYPE_CHECKING:
    from vit_common.checkpoints.formats.provenance import Report


@dataclass(frozen=True)
class RunSpec:
    """Everything a run is, as values (``vit train``'s flags, read).

    ``train``: the TrainConfig (``train.init``: the checkpoint to fine-tune, or None); ``options``:
    ``fit``'s RunOptions (``options.resume`` continues the run in ``out``); ``out``: the run folder;
    ``model``: the ViTConfig fields of a fresh model but ``num_classes`` and ``in_chans``, which the
    dataset gives (unused with ``train.init``); ``given``: with ``train.init``, the ViTConfig fields asked
    for (``vit_jax.finetune.load_init``'s); ``checkpoint_options``: ``load_checkpoint`` keywords for the
    init checkpoint; ``preprocess``: Preprocess fields given; ``image_size``: the size S to train at
    (None: the model's); ``classes``: names of the dataset's labels 0..K-1 (None: the dataset's);
    ``data_workers``: input-pipeline processes (-1: one per usable core for image folders, none for
    in-memory datasets); ``compile_cache``: JAX's persistent compilation cache folder, or 'off';
    ``tensorboard``: the folder of the event files (None: none); ``peak_flops``: FLOP/s of one device
    for the MFU (None: the datasheet's); ``profile_steps``: (A, B) 1-based steps to trace;
    ``accept_assumed``: fields the exports may state that the init checkpoint did not; ``quiet``: no
    progress lines; ``agree``: what every process of a multi-process run must agree on (flag: value);
    ``readers`` / ``writers``: the container readers and writers of PyTorch files
    (``vit_torch.formats.READERS`` / ``WRITERS``, as ``vit_common.checkpoints.convert`` takes them), used
    only when the checkpoint fine-tuned is such a file, so they may be tables that import torch when first
    looked into; ``read_optimizer``: ``vit_torch.formats.read_timm_optimizer`` (path, weights entry) ->
    the AdamW state of a timm training checkpoint, for ``TrainConfig.init_optimizer``. vit_jax imports no
    torch: the caller passes these in. ``plan_only``: print the memory plan of the training step
    (``vit_jax.memory_plan``) on stdout and stop, writing nothing (a plan over the device's memory
    refused as a run's is); ``device_memory``: the bytes one device
    has, for the plan's check (None: what the device reports, ``memory_plan.device_memory``).
    """

    train: TrainConfig
    options: RunOptions
    out: Path
    model: Mapping[str, Any] = field(default_factory=dict)
    given: Mapping[str, Any] = field(default_factory=dict)
    checkpoint_options: Mapping[str, Any] = field(default_factory=dict)
    preprocess: Mapping[str, Any] = field(default_factory=dict)
    image_size: int | None = None
    classes: tuple[str, ...] | None = None
    data_workers: int = -1
    compile_cache: str = "off"
    tensorboard: Path | None = None
    peak_flops: float | None = None
    profile_steps: tuple[int, int] | None = None
    accept_assumed: Sequence[str] | str = ()
    quiet: bool = False
    agree: Mapping[str, Any] = field(default_factory=dict)
    readers: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    writers: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    read_optimizer: Callable[[str, str], dict] | None = None
    plan_only: bool = False
    device_memory: int | None = None


# The check of the exports: (our model.safetensors, {format: export path}, the Trainer) -> parity.json's
# dict, with "ok" and "library" {format: {"ok": ...}} (``vit_compare.exports.export_parity``).
Parity = Callable[[Path, dict[str, Path], Any], dict]


def run_training(
    spec: RunSpec, parity: Parity | None = None, *, started: float | None = None
) -> tuple[int, dict | None]:
    """The run of ``spec``, ``started`` at that ``time.perf_counter()`` (default: now; the summary's
    wall_seconds and metrics.jsonl's time_to_first_step_s count from it). The run folder is locked while
    the run lasts (process 0 holds it), so a second run or a resume on it is refused at once, naming the
    holder.

    Returns:
        (exit code: 0 done (or the plan printed, ``plan_only``), 1 the loss turned NaN/Inf or an export
        check failed, 2 an example could not be read during the run
        (``vit_common.data.stored_datasets.DataReadError``: the step reached is checkpointed, --resume
        continues once the data is repaired), 3 a signal stopped the run after checkpointing the step
        reached (``vit_jax.preemption.EXIT_STOPPED``), 75 a process or a data worker was lost
        (``vit_jax.distributed.EXIT_LOST``); the summary (``fit``'s, with the
        model, exports, load calls, parity and wall_seconds) on process 0 of a finished run, else None).

    Raises:
        DestinationError: another run holds the folder, or the folder holds files this run would
            replace that vit did not write (``vit_common.system.io``).
        ValueError: whatever the dataset, the model or the checkpoint refuses; the training step's memory
            plan exceeds the device's memory (``MemoryPlan.check``; before anything is written).
    """
    from vit_common.data.stored_datasets import DataReadError
    from vit_jax import distributed
    from vit_jax.data import DataWorkerError
    from vit_jax.distributed import EXIT_LOST
    from vit_jax.preemption import EXIT_STOPPED, DamageStop, Stopped, StopSignals, WorkerStop

    started = time.perf_counter() if started is None else started
    tcfg, out = spec.train, spec.out
    cluster = distributed.start(  # before any other JAX call; None for one process
        heartbeat_timeout=tcfg.heartbeat_timeout,
        init_timeout=tcfg.init_timeout,
        shutdown_timeout=tcfg.shutdown_timeout,
        describe=functools.partial(stop_line, out, tcfg.heartbeat_timeout),
    )
    lead = cluster is None or cluster.index == 0
    stop = StopSignals(multiprocess=cluster is not None)
    try:
        if cluster:  # before any work: processes started with other flags stop here, all of them
            cluster.agree(dict(spec.agree), tcfg.init_timeout)
        with stop, in_place.folder_lock(out, "vit train") if lead else contextlib.nullcontext():  # one run per folder
            result = train(spec, started, stop, parity)
    except Stopped as e:
        if cluster:  # stopped at the sync point or after the steps, every process alike; else the others stop
            cluster.leave(e if stop.phase == "start-up" else None)
        if lead:
            print(stopped_line(e, stop.phase, out), file=sys.stderr)
        return EXIT_STOPPED, None
    except BaseException as e:
        if cluster and isinstance(e, (DamageStop, WorkerStop)):  # all stopped alike, after the step's checkpoint
            cluster.leave()
        elif cluster:
            cluster.check(e)  # if a process was lost, this process ends here with one line saying so
            cluster.leave(e)
        if isinstance(e, DataReadError):
            print(
                f"vit train: error: {e}; once the data is repaired, the same command with --resume continues "
                f"{resume_from(out)}",
                file=sys.stderr,
            )
            return 2, None
        if isinstance(e, DataWorkerError):
            print(
                f"vit train: error: {e}; pass fewer --data-workers or a smaller --batch-size if memory ran out. "
                f"The same command with --resume continues {resume_from(out)}",
                file=sys.stderr,
            )
            return EXIT_LOST, None
        raise
    if cluster:
        cluster.leave()
    return result


def stopped_line(e, phase: str, out: Path) -> str:
    """The one line of a run stopped by a signal (``vit_jax.preemption.Stopped``) in ``phase``."""
    if e.step is not None:
        return (
            f"vit train: stopped by {e.signal} after step {e.step}, its checkpoint written; the same command "
            f"with --resume continues from it"
        )
    if phase == "finishing":
        return (
            f"vit train: stopped by {e.signal} after the last step, before the exports were all written; the same "
            "command with --resume writes them"
        )
    if (out / "config.json").exists():
        return f"vit train: stopped by {e.signal}; the same command with --resume continues {resume_from(out)}"
    return f"vit train: stopped by {e.signal} before training began; the same command starts it again"


def resume_from(out: Path) -> str:
    """Where --resume continues the run in ``out``: its latest complete checkpoint, or step 0."""
    from vit_jax.checkpointing import saved_steps

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


@dataclass(frozen=True)
class Start:
    """How a run starts, the one record the run consumes (``fresh_start``, ``finetune_start``,
    ``resumed_finetune_start`` make it).

    ``cfg``: the model's ViTConfig; ``data``: the dataset fit to it (image size, channels,
    ``preprocess``); ``preprocess``: the Preprocess the run trains and exports with; ``weights``: the
    canonical float32 state to start from (a fine-tune), None for a fresh model or a resumed fine-tune
    (its checkpoint holds them); ``moments``: the AdamW state of ``TrainConfig.init_optimizer``
    (``vit_jax.optimizer_state.check_moments``'s), or None; ``report``: how the ``--init`` checkpoint
    was read (``vit_jax.finetune.Init.report``), None for a fresh model; ``torch_io``: the ``--init``
    checkpoint or an export of it is a PyTorch file, so ``RunSpec.readers`` / ``writers`` are used.
    """

    cfg: ViTConfig
    data: Dataset
    preprocess: Preprocess
    weights: dict | None = None
    moments: dict | None = None
    report: Report | None = None
    torch_io: bool = False


def fresh_start(spec: RunSpec, raw: Dataset) -> Start:
    """A new model of ``spec.model``'s fields for the dataset ``raw`` (its classes and channels), with
    ``vit train``'s default preprocessing under the given fields.

    Raises:
        ValueError: the model does not fit the host's memory (``check_model_size``) or ViTConfig refuses it.
    """
    tcfg = spec.train
    cfg = ViTConfig(**spec.model, num_classes=raw.num_classes, in_chans=raw.channels)
    check_model_size(cfg, "the model flags", batch=tcfg.batch_size // tcfg.accum_steps, training=True)
    default = (
        Preprocess(interpolation="bicubic", crop_pct=0.875, crop_mode="center")
        if natural_images(tcfg.dataset)
        else Preprocess()
    )
    preprocess = default.replace(**spec.preprocess)
    return Start(cfg, raw.fit(cfg.image_size, cfg.in_chans, preprocess), preprocess)


def finetune_start(spec: RunSpec, raw: Dataset, log: Callable[[str], None]) -> Start:
    """The checkpoint of ``spec.train.init``, read once for the dataset ``raw`` (``vit_jax.finetune.load_init``),
    with its optimizer state under ``TrainConfig.init_optimizer``; what was read goes to ``log``, a line each.

    Raises:
        ValueError: ``init_optimizer`` with a checkpoint that is no PyTorch training file or no reader of
            it; whatever ``load_init`` or ``check_moments`` refuses.
    """
    from vit_common.checkpoints.convert import needs
    from vit_common.checkpoints.formats.source import current_weights_entry, training_weights_entry, weights_entry
    from vit_jax.finetune import load_init
    from vit_jax.optimizer_state import check_moments

    tcfg, moments = spec.train, None
    log(f"vit train: fine-tuning {tcfg.init}")
    torch_io = needs(tcfg.init) == "torch"
    if tcfg.init_optimizer and not torch_io:
        raise ValueError(f"--init-optimizer: {tcfg.init} is no PyTorch training checkpoint (timm's .pth.tar)")
    entry = current_weights_entry()
    entry = training_weights_entry(entry) if tcfg.init_optimizer else entry
    with weights_entry(entry):
        init = load_init(
            tcfg.init,
            raw,
            image_size=_image_size(spec),
            given=spec.given,
            options=spec.checkpoint_options,
            preprocess=dict(spec.preprocess),
            readers=spec.readers if torch_io else None,
            lazy=True,
        )
    if tcfg.init_optimizer:
        if spec.read_optimizer is None:
            raise ValueError(f"--init-optimizer: the run was given no reader of {tcfg.init}'s optimizer state")
        moments = spec.read_optimizer(tcfg.init, entry)
        check_moments(moments, init.weights)
        log(f"  continuing the AdamW state of {tcfg.init} ({entry!r}, {moments['count']} steps taken)")
    info = init.info
    for line in init.report.lines():
        log(f"  {line}")
    log(f"  preprocessing {json.dumps(info.preprocess.to_dict())} ({info.preprocess_source})")
    for w in info.warnings:
        log(f"  WARNING  {w}")
    return Start(init.cfg, init.data, info.preprocess, init.weights, moments, init.report, torch_io)


def resumed_finetune_start(spec: RunSpec, raw: Dataset, saved: Mapping[str, Any], log: Callable[[str], None]) -> Start:
    """The fine-tuning run in ``spec.out`` continued from its config.json (``saved``) without reading its
    ``--init`` checkpoint again (``vit_jax.finetune.resumed_init``); its checkpoints hold the weights."""
    from vit_common.checkpoints.convert import needs
    from vit_jax.finetune import export_targets, resumed_init

    log(f"vit train: resuming the fine-tuning of {spec.train.init} from {spec.out}/config.json (not read again)")
    init = resumed_init(saved, raw, image_size=_image_size(spec), given=spec.given, preprocess=dict(spec.preprocess))
    targets = export_targets(spec.out, init.report)
    torch_io = any(needs(path, fmt, writing=True) == "torch" for fmt, path in targets.items())
    return Start(init.cfg, init.data, init.info.preprocess, report=init.report, torch_io=torch_io)


def _image_size(spec: RunSpec) -> tuple[int, int] | None:
    return None if spec.image_size is None else (spec.image_size, spec.image_size)


def _named(data: Dataset, classes: tuple[str, ...] | None) -> Dataset:
    """``data`` with ``classes`` (``RunSpec.classes``) as its class names.

    Raises:
        ValueError: not one name per class of ``data``.
    """
    if classes is None:
        return data
    if len(classes) != data.num_classes:
        raise ValueError(f"--classes names {len(classes)} classes, dataset {data.name!r} has {data.num_classes}")
    return dataclasses.replace(data, classes=tuple(classes))


def train(spec: RunSpec, started: float, stop=None, parity: Parity | None = None) -> tuple[int, dict | None]:
    """The run inside the lock (``run_training``'s return value)."""
    import jax

    from vit_common.data.batches import check_batch_size
    from vit_common.data.datasets import read_dataset
    from vit_common.system.peaks import datasheet_peak
    from vit_jax import memory_plan
    from vit_jax.checkpointing import saved_steps
    from vit_jax.finetune import adapter_rules, adapter_warning, check_exports, export, export_adapter, init_record
    from vit_jax.loop import NonFiniteError, fit
    from vit_jax.resume import schedule_change
    from vit_jax.trainer import Trainer, enable_compile_cache

    tcfg, out = spec.train, spec.out
    lead = jax.process_index() == 0
    quiet = spec.quiet or not lead
    cache = spec.compile_cache
    if cache != "off":
        try:
            cache = str(enable_compile_cache(cache))
        except OSError as e:  # the cache only saves time: the run goes on without it
            print(
                f"vit train: warning: compilation cache unusable ({e}); compiling without it "
                "(--compile-cache off or another folder avoids this warning)",
                file=sys.stderr,
            )
            cache = "off"
    if cache == "off":
        jax.config.update("jax_enable_compilation_cache", False)

    def log(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr)

    raw = _named(read_dataset(tcfg.dataset, val_fraction=tcfg.val_fraction), spec.classes)  # classes, channels
    check_batch_size(tcfg.batch_size, len(raw.train), tcfg.dataset)  # before any model is built
    resume = spec.options.resume
    saved = io.read_json(out / "config.json") if resume and (out / "config.json").is_file() else {}
    report: list[str] = []  # how --init was read: printed once the flags are known to fit the model
    if tcfg.init and "init" in saved and saved_steps(out / "checkpoints"):  # the checkpoint holds the weights
        start = resumed_finetune_start(spec, raw, saved, report.append)
    elif tcfg.init:
        start = finetune_start(spec, raw, report.append)
    else:
        start = fresh_start(spec, raw)
    cfg, data = start.cfg, start.data
    workers = spec.data_workers
    if workers == -1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = 0 if data.in_memory else cores
    if lead:  # the exports are refused now, not after the training
        check_exports(out, cfg, start.report, spec.accept_assumed)
    spelling = spec.options.export_adapter
    rules = adapter_rules(out, cfg, tcfg, start.report, spelling) if spelling is not None else None
    mismatch = adapter_warning(cfg, start.report, spelling) if rules is not None else None
    trainer = Trainer(
        cfg, tcfg, data, preprocess=start.preprocess, weights=start.weights, moments=start.moments, workers=workers
    )
    for line in report:  # a refusal above (the adapters' rank or targets, an export) is its one line alone
        log(line)
    if mismatch is not None:
        log(f"vit train: warning: {mismatch}")
    if tcfg.lora is not None:
        params = jax.tree.leaves(trainer.abstract_state["params"])
        sizes = [(t, x.size) for t, x in zip(jax.tree.leaves(trainer.trainable), params, strict=True)]
        log(
            f"vit train: LoRA rank {tcfg.lora} on {tcfg.lora_targets}: {sum(n for t, n in sizes if t):,} of "
            f"{sum(n for _, n in sizes):,} parameters trained (the adapters and the head)"
        )
    plan = memory_plan.plan(trainer, spec.device_memory)  # compiles the step the run takes
    if spec.plan_only:
        plan.check()
        if lead:
            print(plan.line())
        return 0, None
    if tcfg.warmup_steps >= trainer.total_steps > 1:
        log(
            f"vit train: warning: --warmup-steps {tcfg.warmup_steps} is not below the run's {trainer.total_steps} "
            f"steps: the learning rate rises for the whole run and never decays (pass --warmup-steps < "
            f"{trainer.total_steps})"
        )
    budget = start.preprocess.max_patches  # a NaFlex run: an image is its patch budget, whatever its grid
    at = "" if budget is None else f" at the patch budget, {budget} patches"
    log(
        f"vit train: {data.name}: {len(data.train)} train / {len(data.test)} test images, "
        f"{data.num_classes} classes; ViT {cfg.width}x{cfg.depth} patch {cfg.patch_size[0]} "
        f"({cfg.param_count():,} parameters, {cfg.flops(patches=budget) / 1e9:.3g} GFLOPs per image{at}); "
        f"{trainer.total_steps} steps on {trainer.mesh.size} "
        f"{jax.devices()[0].platform} device(s) (mesh {','.join(f'{a}={n}' for a, n in trainer.mesh.shape.items())}), "
        f"{workers} data worker(s); compilation cache {cache}; "
        f"run folder {out}; {plan.line()}"
    )
    plan.check()  # before anything is written
    if saved:
        saved_epochs = saved.get("train", {}).get("epochs", tcfg.epochs)
        steps = saved_steps(out / "checkpoints")
        change = schedule_change(trainer, saved_epochs, steps[-1] if steps else 0)
        if change:
            log(f"vit train: {change}")
    try:
        state, summary = fit(
            trainer,
            out,
            spec.options,
            started=started,
            compile_cache=cache != "off",
            stop=stop,
            tensorboard=spec.tensorboard,
            peak_flops=spec.peak_flops if spec.peak_flops else datasheet_peak(jax.devices()[0].device_kind, cfg.dtype),
            profile_steps=spec.profile_steps,
            init=init_record(start.report) if start.report is not None else None,
        )
    except NonFiniteError as e:
        print(f"vit train: {e}", file=sys.stderr)
        return 1, None
    export_ema = spec.options.export_ema  # the moving average instead of the weights (fit checked tcfg.ema)
    weights = trainer.weights(state, ema=export_ema)  # every process takes part in gathering them
    adapters = trainer.weights(state, ema=export_ema, merged=False) if rules is not None else None
    if tcfg.ema is not None:
        summary["exported_weights"] = f"the EMA weights (decay {tcfg.ema})" if export_ema else "the raw weights"
    if stop is not None:
        stop.finishing()  # a signal from here on stops at once; --resume writes the exports
    if not lead:
        return 0, None
    with io.overwriting() if resume else contextlib.nullcontext(), _exports_of(out, trainer.total_steps):
        if (out / "parity.json").exists():  # the check of the exports replaced: nothing stale claims parity
            io.check_destination(out / "parity.json")  # ours: a fresh run refused any other at its start
            (out / "parity.json").unlink()
            if parity is None:
                log(f"vit train: {out / 'parity.json'} of the earlier exports removed (the new ones are not checked)")
        done = export(
            out,
            cfg.replace(dtype="float32"),
            weights,
            preprocess=start.preprocess,
            classes=data.classes,
            source=start.report,
            writers=spec.writers if start.torch_io else None,
            accept_assumed=spec.accept_assumed,
        )
        if adapters is not None:
            summary["adapter"] = str(export_adapter(out, adapters, rules, tcfg))
        plot_curves(out / "metrics.jsonl", out / "curves.png")
    for line in done.lines:
        log(f"  {line}")
    exports, load_calls = done.paths, done.load_calls
    summary["model"] = str(out / "model.safetensors")
    summary["exports"] = {fmt: str(path) for fmt, path in exports.items()}
    summary["load_calls"] = {str(exports[fmt]): call for fmt, call in load_calls.items()}
    ok = True
    if parity is not None and importlib.util.find_spec("torch") is None:
        log(f"vit train: no PyTorch check of the exports: torch is not installed ({install_hint('torch')})")
    elif parity is not None:
        from vit_jax.loop import write_json

        result = parity(out / "model.safetensors", exports, trainer)
        with io.overwriting() if resume else contextlib.nullcontext():
            write_json(out / "parity.json", result)
        summary["parity"] = result
        ok = result["ok"] and all(c.get("ok", True) for c in result["library"].values())
    summary["wall_seconds"] = time.perf_counter() - started
    return (0 if ok else 1), summary


@contextlib.contextmanager
def _exports_of(out: Path, steps: int):
    """An export that cannot be written after the training finished (a full disk) says so in its line: the
    training is kept in its last checkpoint, and --resume writes the exports (nothing trains again)."""
    try:
        yield
    except OSError as e:
        if e.errno is None:
            raise
        failed = OSError(
            f"{e}; the training is complete (the checkpoint of step {steps} in {out / 'checkpoints'}): "
            "the same command with --resume writes the exports"
        )
        failed.errno = e.errno
        raise failed from None


def plot_curves(metrics: Path, png: Path) -> None:
    """Loss and accuracy against step (train lines and test points) as a PNG (matplotlib's ``Figure``
    without pyplot: no backend is chosen for the process)."""
    from matplotlib.figure import Figure

    rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    tr = [r for r in rows if "loss" in r]
    te = [r for r in rows if "test_loss" in r]
    fig = Figure(figsize=(10, 4))
    a, b = fig.subplots(1, 2)
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
