"""A whole training run of the JAX twin: ``fit`` takes the steps of a ``vit_jax.trainer.Trainer`` from step 0,
or from the run's latest checkpoint, to the last, and writes the run folder (config.json, metrics.jsonl,
checkpoints/).

``fit`` checks the folder and the flags before any work (a fresh run's ``RUN_FILES`` that vit did not
write, ``vit_jax.resume``'s rules on a resume), restores the latest complete checkpoint
(``vit_jax.checkpointing``), compiles the step while the first batches are made, and ``_steps`` takes
the steps. What happens after a step is a hook (``vit_jax.hooks``; ``run_hooks`` registers them in
order): a metrics line every ``log_every`` steps, the test set's metrics (``evaluation``) every
``eval_every`` epochs or steps and at the end, a checkpoint every ``ckpt_every`` steps or minutes and at
the end, TensorBoard / Weights & Biases scalars and a profile window (``vit_jax.observe``). A NaN or Inf
loss or gradient norm stops the run (``NonFiniteError``, naming the last good checkpoint); a signal
(SIGTERM, SIGHUP, Ctrl-C) stops it after the step it arrives in, with a checkpoint of that step
(``vit_jax.preemption``); a run file that cannot be written (a full disk) is one line naming it and where
``--resume`` continues. Multi-process runs start (and stop when a process is lost) through
``vit_jax.distributed``; every process calls ``fit`` alike and process 0 alone writes the run's files.
The torch twin has no counterpart (``vit_torch.train``
mirrors ``vit_jax.optim`` and ``vit_jax.trainer`` only: it takes steps beside this twin's, no runs).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from vit_common.data.batches import examples_before
from vit_common.data.stored_datasets import DataReadError
from vit_common.system import in_place, io
from vit_common.system.validate import regular_file
from vit_common.training.train_config import RunOptions
from vit_jax.checkpointing import Checkpoints, _then_resume, saved_steps, write_error_reason
from vit_jax.data import DataWorkerError
from vit_jax.hooks import Hooks, RunState
from vit_jax.observe import ProfileWindow, Summaries, require_wandb
from vit_jax.preemption import Stopped, StopSignals, agree_damage, located
from vit_jax.resume import check_checkpoints_left, check_same_data, config_mismatch, run_config, schedule_change
from vit_jax.trainer import Trainer, sharded_abstract


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm became NaN or Inf."""


# ----------------------------------------------------------------------------------- run files


@contextlib.contextmanager
def _written(path: Path, step: int, ckpts: Checkpoints):
    """A run file (metrics.jsonl, TensorBoard's event file) that cannot be written at ``step`` (a full disk)
    raised as one line naming it, the cause and where --resume continues, once the checkpoint in flight
    has settled."""
    try:
        yield
    except OSError as e:
        reason = write_error_reason(e)
        failed = OSError(
            f"{path}: could not be written at step {step} ({reason}); {_then_resume(reason, ckpts.settle())}"
        )
        failed.errno = e.errno
        raise failed from None


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    io.write_json(path, obj)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines written after ``step`` (by a run that was killed later than its checkpoint), and a
    last line a kill cut short (not JSON).

    Raises:
        ValueError: a line before the last is not JSON or has no integer 'step' (naming file:line).
    """
    if not path.exists():
        return
    lines = [(i, ln) for i, ln in enumerate(regular_file(path).read_text().splitlines(), 1) if ln.strip()]
    kept = []
    for n, (i, ln) in enumerate(lines):
        try:
            row = io.parse_json(ln, f"{path}:{i}")
        except ValueError:
            if n == len(lines) - 1:  # the line a kill cut short: dropped
                break
            raise
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path}:{i}: a metrics line without an integer 'step'")
        if row["step"] <= step:
            kept.append(ln)
    io.write_text(path, "".join(ln + "\n" for ln in kept))


# -------------------------------------------------------------------------------------- the run

# What a run writes into its folder by those names (the exports' other names depend on --init's format).
RUN_FILES = ("config.json", "metrics.jsonl", "model.safetensors", "model_timm.safetensors", "parity.json", "curves.png")


def fit(
    trainer: Trainer,
    out: str | os.PathLike,
    options: RunOptions | None = None,
    *,
    started: float | None = None,
    compile_cache: bool = False,
    stop: StopSignals | None = None,
    tensorboard: str | os.PathLike | None = None,
    peak_flops: float | None = None,
    profile_steps: tuple[int, int] | None = None,
    init: Mapping[str, Any] | None = None,
) -> tuple[dict, dict]:
    """Train to the last step, writing into ``out``: config.json, metrics.jsonl, checkpoints/.

    ``options`` (``vit_common.training.train_config.RunOptions``, default ``RunOptions()``): a checkpoint
    (state; the data position is the step, one batch per step) is saved every ``ckpt_every`` steps (0 =
    only at the end), after the first step that ends ``ckpt_every_minutes`` minutes or more after the
    previous save (0 = off; levanter's time-based saves; with several processes process 0's clock decides
    for all), and at the last step, the last ``keep`` kept; ``resume`` continues from the latest one, so
    an interrupted run ends with the same state as an uninterrupted one. Each checkpoint also holds the
    sums behind the next metrics line, so a resumed run writes the same lines as an uninterrupted one.
    ``stop`` (``vit_jax.preemption.StopSignals``): after every step the run asks it whether to stop; if so
    it saves that step, waits for the write and raises ``Stopped``. A data worker that dies is
    ``DataWorkerError``, and an example that cannot be read (damaged after the dataset's up-front
    check: a training batch's, or a test example at an evaluation, which a resumed run takes first)
    ``DataReadError``, each raised after saving the step reached (several processes: damage in all
    alike: ``vit_jax.preemption.DamageStop``, a dead worker ``WorkerStop``), so that
    ``resume`` continues from it once the data is repaired. The test set is evaluated (loss, top-1 and
    top-5 accuracy) every ``eval_every`` epochs, or every ``eval_every_steps`` steps when that is set, and at the end;
    ``progress`` shows a tqdm bar on process 0. metrics.jsonl gets one line when the process's first
    step is done (``time_to_first_step_s``: seconds since ``started``, a ``time.perf_counter`` value,
    default the call of ``fit``; ``compile_cache``: 'off' unless ``compile_cache`` says JAX's
    persistent compilation cache is on, then 'warm' if the training step's program came from it, else
    'cold'), one per ``log_every`` steps (loss, accuracy, lr, grad_norm, images_per_s averaged since the
    previous line) and one per evaluation. ``tensorboard``: a folder for TensorBoard event files of the
    same values and the step time, images/s per device and MFU against ``peak_flops`` per device
    (``vit_jax.observe.Summaries``). ``profile_steps`` (A, B): a ``jax.profiler`` trace of steps A..B
    (1-based) into ``out``/profile. Each step runs inside a ``jax.profiler.StepTraceAnnotation``.
    ``init``: what the run fine-tunes (``vit_jax.finetune.init_record``), stored as config.json's ``init``
    so that a resume takes it from there and does not read that checkpoint again. With ``tcfg.ema`` every
    evaluation also evaluates the moving average (``evaluation``: test_ema_* beside test_*, in
    metrics.jsonl, TensorBoard and the summary) and config.json's ``exports`` says which weights the
    exports hold (``weights``: "ema" with ``options.export_ema``, else "raw"; ``Trainer.weights(state,
    ema=...)`` gives them). ``options.wandb``: the TensorBoard scalars and config.json also go to Weights
    & Biases (``vit_jax.observe.Summaries``; its files under ``out``/wandb).
    With several processes every process calls ``fit`` alike, and process 0 alone writes config.json,
    metrics.jsonl, the event files and the trace.

    Returns:
        (final state, summary dict: steps (the last), start (the step it resumed at, 0 for a fresh run),
        test_loss, test_accuracy, test_count (with an EMA also test_ema_loss, test_ema_accuracy,
        test_ema_top5_accuracy), images_per_s, train_seconds, and with ``keep_best`` (a key of
        ``Checkpoints.BEST``: the checkpoint of the best evaluation by it is kept beside the last
        ``keep``; every evaluation step is checkpointed) best_checkpoint {step, metric}).

    Raises:
        ValueError: ``profile_steps`` outside the run's steps; ``export_ema`` or a ``keep_best`` of the EMA
            without ``tcfg.ema``; ``wandb`` asked for and not installed (naming the extra); ``out`` holds a
            checkpoint and ``resume`` is off, or ``resume`` with a config that differs from the saved one
            (every differing field listed; ``epochs`` may differ, which recomputes the schedule:
            ``schedule_change``), or with an epoch count that ends before the checkpoint; a metrics line
            before the last that is not JSON or has no step (a last line a kill cut is dropped).
        FileNotFoundError: ``resume`` without a run in ``out``, or of a run that trained but has no
            checkpoint left (``vit_jax.resume.check_checkpoints_left``). A run stopped before its first complete
            checkpoint starts again from step 0, with or without ``resume`` and with any config; a
            latest checkpoint that does not restore is reported and the one before it used.
        NonFiniteError: NaN or Inf in the loss or gradients; the last good checkpoint stays intact.
        Stopped: ``stop`` asked for it (a signal); its ``step`` is the checkpoint saved.
        DataWorkerError: an input-pipeline worker process died (at an evaluation: naming the step), after
            the checkpoint of the step reached.
        DataReadError: an example of the training set could not be read (naming the step, the file and
            the record), or one of the test set at the step's evaluation (a resumed run takes it first),
            after the checkpoint of the step reached.
        DestinationError: a fresh run's ``out`` holds a file of ``RUN_FILES`` that vit did not write
            (checked first; a resumed run's config.json proves its files are the run's).
    """
    options = options or RunOptions()
    started = time.perf_counter() if started is None else started
    out = Path(out)
    lead = jax.process_index() == 0
    _check_options(trainer, options, profile_steps)
    config = run_config(trainer) | ({"init": dict(init)} if init else {})
    if trainer.tcfg.ema is not None:
        config["exports"] = {"weights": "ema" if options.export_ema else "raw"}
    saved, restart = _check_folder(trainer, out, options, config, lead)
    resume = options.resume
    made = not (out / "checkpoints").exists()  # by this call: removed again if the run fails while it is empty
    # removes temporary folders a killed run left
    ckpts = Checkpoints(out / "checkpoints", options.keep, trainer.tcfg.barrier_timeout, best=options.keep_best)
    start, state, meta = ckpts.restore_complete(sharded_abstract(trainer), saved) if saved and resume else (0, None, {})
    # The first batches are made while the step compiles (the batch position is the step: a resumed run
    # starts at the checkpoint it restored).
    it = trainer.train_iterator(start=start)
    files, failed = contextlib.ExitStack(), False
    if resume or restart:  # its config.json shows the folder is this run's (copied, perhaps): its files are
        files.enter_context(io.overwriting())  # ours to replace, its metrics.jsonl to append to, marked or not
    try:
        it.start_prefetch()
        if state is None:  # a fresh run, or a resumed one that was stopped before its first complete checkpoint
            state = trainer.init_state()
        trainer.compile()  # while the first batches are made (already compiled if the memory plan was made)
        if stop is not None:
            stop.compiled()  # a signal held back while XLA compiled stops the run now
        hits, misses = (trainer.cache_events[k] for k in ("cache_hits", "cache_misses"))
        if lead:
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / "config.json", config)
            _truncate_metrics(out / "metrics.jsonl", it.position)
        position, total = it.position, trainer.total_steps  # the steps done: one batch per step
        run = RunState(trainer, state, start=position, total=total, began=0.0, lead=lead, step=position)
        run.sums |= meta.get("metrics") or {}  # the sums behind the next metrics line, as the checkpoint held them
        hooks, saver, metrics = run_hooks(
            run,
            options,
            ckpts,
            out,
            started=started,
            compile_cache="off" if not compile_cache else "warm" if hits and not misses else "cold",
            stop=stop,
            summaries=_summaries(run, options, ckpts, out, tensorboard, peak_flops, config),
            profile=ProfileWindow(out / "profile", *profile_steps) if profile_steps and lead else None,
        )
        if meta.get("evaluate"):  # damage stopped this step's evaluation: it is taken first
            with _evaluating(run, None):
                metrics.evaluate(run)
        images_per_s = _steps(run, it, hooks, saver, stop)
    except BaseException:
        failed = True
        raise
    finally:
        it.close()
        trainer.close()
        try:
            ckpts.wait()
        except BaseException:
            failed = True
            raise
        finally:
            ckpts.close()
            files.close()
            if made and lead and failed:
                with contextlib.suppress(OSError):  # only an empty folder: rmdir refuses any other
                    (out / "checkpoints").rmdir()
    if not run.evaluation:  # resumed after the last step: nothing ran
        run.evaluation = evaluation(trainer, run.state)
    summary = {
        "steps": run.total,
        "start": run.start,
        **{k: v for k, v in run.evaluation.items() if k != "test_top5_accuracy"},
        "images_per_s": images_per_s,
        "train_seconds": time.perf_counter() - run.began,
    }
    if ckpts.best is not None:
        ckpts.wait()
        summary["best_checkpoint"] = {"step": ckpts.best_step(), "metric": ckpts.best}
    return run.state, summary


def _summaries(run: RunState, options: RunOptions, ckpts, out: Path, tensorboard, peak_flops, config: dict):
    """The TensorBoard / Weights & Biases writer of ``fit``'s ``tensorboard`` and ``options.wandb``
    (``vit_jax.observe.Summaries``, which marks where ``run.start`` resumes), on process 0; else None."""
    if (tensorboard is None and not options.wandb) or not run.lead:
        return None
    t = run.trainer
    with _written(Path(tensorboard or out), run.start, ckpts):
        wandb_dir = out if options.wandb else None
        kw = dict(start=run.start, wandb_dir=wandb_dir, config=config, patches=t.preprocess.max_patches)
        return Summaries(tensorboard, t.cfg, t.mesh.size, peak_flops, **kw)


def _check_options(trainer: Trainer, options: RunOptions, profile_steps: tuple[int, int] | None) -> None:
    """``fit``'s refusals of its flags (its Raises: the profile window, the EMA, wandb)."""
    if profile_steps and profile_steps[1] > trainer.total_steps:
        a, b = profile_steps
        raise ValueError(f"--profile-steps {a}:{b}: the run has steps 1 to {trainer.total_steps}")
    for asked, flag in (
        (options.export_ema, "--export-ema"),
        ((options.keep_best or "").startswith("test_ema_"), f"--keep-best {options.keep_best}"),
    ):
        if asked and trainer.tcfg.ema is None:
            raise ValueError(f"{flag}: this run keeps no moving average of the weights; pass --ema DECAY too")
    if options.wandb:
        require_wandb()


def _check_folder(trainer: Trainer, out: Path, options: RunOptions, config: dict, lead: bool) -> tuple[list, bool]:
    """``fit``'s refusals of the run folder ``out`` (its Raises: a resume's config and data, a fresh run's
    files), before any work.

    Returns:
        (the complete checkpoints' steps, ascending; whether a run stopped before its first checkpoint is
        started again in ``out``).
    """
    saved = saved_steps(out / "checkpoints")
    resume = options.resume
    if resume:
        if not (out / "config.json").exists():
            raise FileNotFoundError(f"{out}: no run to resume (config.json is missing)")
        saved_config = io.read_json(out / "config.json")  # bounded, named
        saved_config.pop(io.OWNER_KEY, None)  # the mark write_json adds (vit_common.system.io)
        diff = config_mismatch(saved_config, config)
        if diff and saved:  # with no checkpoint there is nothing to continue: the new config starts afresh
            raise ValueError(
                f"{out}: the checkpoint was made with a different config (keep it, or choose another --out):\n  "
                + "\n  ".join(diff)
            )
        if saved:  # (without a checkpoint nothing continues: any data starts afresh)
            check_same_data(out, saved_config, config["dataset"], lead)
        check_checkpoints_left(out, saved)
        saved_epochs = saved_config.get("train", {}).get("epochs", trainer.tcfg.epochs)
        schedule_change(trainer, saved_epochs, saved[-1] if saved else 0)
    elif saved:
        raise ValueError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
    # a run stopped before its first checkpoint: its config.json (ours by its content) shows the folder is
    # a run's, so the same command replaces that run's files (metrics.jsonl proves nothing by itself)
    restart = not resume and io.owned(out / "config.json")
    if lead and not resume and not restart:
        for name in RUN_FILES:  # refused before any work, not at the end: files vit did not write stay
            io.check_destination(out / name)
    if jax.process_count() > 1:  # every process has read the folder before process 0 writes to it
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("vit_train:folder_checked")
    return saved, restart


def evaluation(t: Trainer, state: dict) -> dict:
    """The test set's metrics as metrics.jsonl holds them: test_loss, test_accuracy, test_top5_accuracy,
    test_count, and with an EMA (``tcfg.ema``) test_ema_loss, test_ema_accuracy, test_ema_top5_accuracy of
    the moving average of the weights."""
    out = {}
    for prefix, ema in (("test_", False), ("test_ema_", True)) if "ema" in state else (("test_", False),):
        m = t.evaluate(state, t.data.test, ema=ema)
        out |= {f"{prefix}{k}": m[k] for k in ("loss", "accuracy", "top5_accuracy")}
        out.setdefault("test_count", m["count"])
    return out


# -------------------------------------------------------------------------------------- the steps


def _steps(run: RunState, it, hooks: Hooks, saver: _Saver, stop: StopSignals | None) -> float | None:
    """Take the steps from ``run.start`` to ``run.total``, running ``hooks`` around each; the images/s
    of the steps after the first (which includes compilation), None with fewer than two."""
    clock, many = time.perf_counter, jax.process_count() > 1
    seen = timed = 0.0
    run.began = clock()
    if stop is not None:
        stop.training()
    try:
        for step in range(run.start, run.total):
            hooks.before(run)
            t0 = clock()
            with jax.profiler.StepTraceAnnotation("train", step_num=step + 1):
                batch = _next_batch(it, run, step, saver, many)
                run.state, m = run.trainer.train_step(run.state, batch)
                run.metrics = jax.device_get(m)
            run.step, run.step_seconds = step + 1, clock() - t0
            if step > run.start:  # the first step of a process includes compilation
                seen, timed = seen + float(run.metrics["count"]), timed + run.step_seconds
            with _evaluating(run, saver):
                hooks.after(run)
    finally:
        hooks.close()
    return seen / timed if timed else None


def _next_batch(it, run: RunState, step: int, saver: _Saver, many: bool) -> dict:
    """The batch of step ``step + 1``. An example that cannot be read or a data worker's death stops the run
    after the checkpoint of the step reached; with several processes all learn it before the step
    (``agree_damage``) and save it."""
    damage = None
    try:
        batch = next(it)
    except (DataReadError, DataWorkerError) as e:
        damage = e
    damage = agree_damage(damage) if many else damage
    if damage is None:
        return batch
    if step > run.start:  # the state of the step reached is whole: keep it
        saver.save(run)
    if isinstance(damage, DataWorkerError) and not many:
        raise damage
    raise located(damage, f"step {step + 1}'s batch") from None


@contextlib.contextmanager
def _evaluating(run: RunState, saver: _Saver | None):
    """Damage in the test set found by the evaluation of step ``run.step`` (``DataReadError``, naming the
    step; several processes: ``DamageStop`` in all, ``Trainer.evaluate``) or a test data worker's death
    (``DataWorkerError``; ``WorkerStop`` in all): the step's state is whole, so ``saver`` saves it, marked
    so that a resumed run takes that evaluation first."""
    try:
        yield
    except (DataReadError, DataWorkerError) as e:
        if saver is not None:
            saver.save(run, evaluate=True)
        raise located(e, f"step {run.step}'s evaluation") from None


def run_hooks(
    run: RunState,
    options: RunOptions,
    ckpts: Checkpoints,
    out: Path,
    *,
    started: float,
    compile_cache: str,
    stop: StopSignals | None,
    summaries: Summaries | None,
    profile: ProfileWindow | None,
) -> tuple[Hooks, _Saver, _MetricsFile]:
    """The hooks of a run in the order they run after a step (``vit_jax.hooks``), the checkpoint saver
    (also called by ``_steps`` when data breaks) and the metrics file (its ``evaluate``, for an evaluation
    a resumed run takes first). A new concern is one ``add_hook`` line here."""
    t = run.trainer
    hooks = Hooks()
    metrics = _MetricsFile(out / "metrics.jsonl", ckpts, summaries, run.lead)
    saver = _Saver(ckpts, options)
    if profile:
        hooks.add_hook(lambda r: profile.before(r.step + 1), before=True, close=profile.stop)
    hooks.add_hook(functools.partial(metrics.first_line, started, compile_cache))
    hooks.add_hook(functools.partial(_check_finite, ckpts))
    hooks.add_hook(_add_sums)
    if options.progress and run.lead:
        bar = _ProgressBar(run)
        hooks.add_hook(bar, close=bar.close)
    if profile:
        hooks.add_hook(lambda r: profile.after(r.step, r.state))
    hooks.add_hook(metrics.train_line, every=options.log_every, close=metrics.close)
    hooks.add_hook(metrics.evaluate, every=options.eval_every_steps or t.steps_per_epoch * options.eval_every)
    if stop is not None:
        hooks.add_hook(functools.partial(_stop_check, stop))
    hooks.add_hook(saver)
    if stop is not None:
        hooks.add_hook(functools.partial(_stop, stop, ckpts))
    return hooks, saver, metrics


class _MetricsFile:
    """metrics.jsonl (appended to, process 0) and the same values to ``summaries`` (TensorBoard / wandb)."""

    def __init__(self, path: Path, ckpts: Checkpoints, summaries: Summaries | None, lead: bool):
        self.path, self.ckpts, self.summaries = path, ckpts, summaries
        self.log = in_place.open_log(path) if lead else None

    def write(self, line: dict) -> None:
        if self.log:
            with _written(self.path, line["step"], self.ckpts):
                self.log.write(json.dumps(line) + "\n")
                self.log.flush()

    def first_line(self, started: float, compile_cache: str, run: RunState) -> None:
        """The process's first step: seconds since ``started`` and the compilation cache's part."""
        if run.step == run.start + 1:
            line = {"time_to_first_step_s": time.perf_counter() - started, "compile_cache": compile_cache}
            self.write({"step": run.step, **line})

    def train_line(self, run: RunState) -> None:
        """The averages of ``run.sums`` as a line (and scalars), then the sums start again."""
        s, sums, spe = run.step, run.sums, run.trainer.steps_per_epoch
        line = {
            "step": s,
            "epoch": s / spe,
            "loss": sums["loss"] / sums["steps"],
            "accuracy": sums["correct"] / max(sums["count"], 1),
            "lr": float(run.metrics["lr"]),
            "grad_norm": sums["grad_norm"] / sums["steps"],
            "images_per_s": sums["count"] / max(sums["seconds"], 1e-9),
            "time": time.perf_counter() - run.began,
        }
        self.write(line)
        if self.summaries:
            with _written(self.summaries.logdir or self.path.parent, s, self.ckpts):
                self.summaries.train(line, sums["seconds"] / sums["steps"])
        run.sums = dict.fromkeys(sums, 0.0)

    def evaluate(self, run: RunState) -> None:
        """The test set's metrics (``evaluation``, with an EMA its average's too) as a line and scalars."""
        run.evaluation, run.evaluated_at = evaluation(run.trainer, run.state), run.step
        line = {"step": run.step, "epoch": run.step / run.trainer.steps_per_epoch, **run.evaluation}
        self.write(line)
        if self.summaries:
            with _written(self.summaries.logdir or self.path.parent, run.step, self.ckpts):
                self.summaries.test(line)

    def close(self) -> None:
        if self.log:
            self.log.close()
        if self.summaries:
            self.summaries.close()


def _check_finite(ckpts: Checkpoints, run: RunState) -> None:
    """Raises NonFiniteError: the step's loss or gradient norm is NaN or Inf (naming the last good checkpoint)."""
    m = run.metrics
    if not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])):
        ckpts.wait()
        last = ckpts.latest_step()
        kept = (
            f"the last good checkpoint is step {last} in {ckpts.manager.directory}"
            if last is not None
            else "no checkpoint was written yet"
        )
        raise NonFiniteError(
            f"loss {float(m['loss'])}, gradient norm {float(m['grad_norm'])} at step "
            f"{run.step}: not finite, training stopped; {kept}. Try a lower --lr."
        )


def _add_sums(run: RunState) -> None:
    for k in ("loss", "grad_norm", "correct", "count"):
        run.sums[k] += float(run.metrics[k])
    run.sums["steps"] += 1
    run.sums["seconds"] += run.step_seconds


class _ProgressBar:
    """A tqdm bar of the images trained on, with the epoch, the step's loss and lr and the last test accuracy."""

    def __init__(self, run: RunState):
        from tqdm import tqdm

        tcfg, n_train = run.trainer.tcfg, len(run.trainer.data.train)
        self.bar = tqdm(
            total=tcfg.epochs * n_train,
            initial=examples_before(run.start, n_train, tcfg.batch_size),
            unit="img",
            unit_scale=True,
            dynamic_ncols=True,
            desc="train",
        )

    def __call__(self, run: RunState) -> None:
        m, test = run.metrics, run.evaluation
        self.bar.update(int(m["count"]))
        self.bar.set_postfix(
            epoch=f"{run.step / run.trainer.steps_per_epoch:.2f}",
            loss=f"{float(m['loss']):.3f}",
            lr=f"{float(m['lr']):.1e}",
            **({"test_acc": f"{test['test_accuracy']:.4f}"} if test else {}),
            refresh=False,
        )

    def close(self) -> None:
        self.bar.close()


class _Saver:
    """The checkpoint hook: saves every ``ckpt_every`` steps, after ``ckpt_every_minutes``, at the last
    step, at a stop (``run.stopping``) and, with ``keep_best``, at every evaluation."""

    def __init__(self, ckpts: Checkpoints, options: RunOptions):
        self.ckpts, self.every, self.seconds = ckpts, options.ckpt_every, 60.0 * options.ckpt_every_minutes
        self.last = time.perf_counter()

    def save(self, run: RunState, metrics: dict | None = None, *, evaluate: bool = False) -> None:
        """Step ``run.step``'s state and ``run.sums`` (``metrics``: its evaluation, for ``keep_best``;
        ``evaluate``: the evaluation of the step is still to be taken, a resumed run takes it first)."""
        s = run.step
        if self.ckpts.latest_step() != s:  # a data worker's death right after a step that was saved
            meta = {"step": s, "metrics": dict(run.sums)} | ({"evaluate": True} if evaluate else {})
            self.ckpts.save(s, run.state, meta, metrics)
        self.last = time.perf_counter()

    def time_due(self) -> bool:
        due = bool(self.seconds) and time.perf_counter() - self.last >= self.seconds
        if self.seconds and jax.process_count() > 1:  # every process saves at the step process 0's clock says
            from jax.experimental import multihost_utils

            due = bool(multihost_utils.broadcast_one_to_all(np.bool_(due)))
        return due

    def __call__(self, run: RunState) -> None:
        s, evaluated = run.step, run.evaluated_at == run.step
        best = evaluated and self.ckpts.best is not None  # every evaluation is a candidate for the best
        if s == run.total or (self.every and s % self.every == 0) or self.time_due() or run.stopping or best:
            self.save(run, dict(run.evaluation) if evaluated else None)


def _stop_check(stop: StopSignals, run: RunState) -> None:
    """Whether a signal stops the run after this step (every process, every step)."""
    run.stopping = stop.reached(run.step)
    if run.stopping and run.step < run.total:
        stop.saving(run.step)


def _stop(stop: StopSignals, ckpts: Checkpoints, run: RunState) -> None:
    """Raises Stopped: a signal asked for it (after the checkpoint of this step, which it waits for)."""
    if run.stopping and run.step < run.total:
        ckpts.wait()
        raise Stopped(stop.received or "a signal", run.step)
