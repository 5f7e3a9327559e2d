"""A whole training run of the JAX twin: ``fit`` takes the steps of a ``vit_jax.trainer.Trainer`` from step 0,
or from the run's latest checkpoint, to the last, and writes the run folder (config.json, metrics.jsonl,
checkpoints/).

``fit`` checks the folder and the flags before any work (a fresh run's ``RUN_FILES`` that vit did not
write, ``vit_jax.resume``'s rules on a resume), restores the latest complete checkpoint
(``vit_jax.checkpointing``), compiles the step while the first batches are made, and ``_loop`` runs the
steps: a metrics line every ``log_every`` steps, the test set's metrics (``evaluation``) every
``eval_every`` epochs or steps and at the end, a checkpoint every ``ckpt_every`` steps or minutes and at
the end, TensorBoard / Weights & Biases scalars and a profile window (``vit_jax.observe``). A NaN or Inf
loss or gradient norm stops the run (``NonFiniteError``, naming the last good checkpoint); a signal
(SIGTERM, SIGHUP, Ctrl-C) stops it after the step it arrives in, with a checkpoint of that step
(``vit_jax.preemption``); a run file that cannot be written (a full disk) is one line naming it and where
``--resume`` continues. Multi-process runs start (and stop when a process is lost) through
``vit_jax.distributed``; every process calls ``fit`` alike and process 0 alone writes the run's files.
``vit_jax.launch`` drives ``fit`` for ``vit train``. The torch twin has no counterpart (``vit_torch.train``
mirrors ``vit_jax.optim`` and ``vit_jax.trainer`` only: it takes steps beside this twin's, no runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from vit_common.data.batches import examples_before
from vit_common.system import in_place, io
from vit_common.system.validate import regular_file
from vit_common.training.train_config import RunOptions
from vit_jax.checkpointing import Checkpoints, _then_resume, saved_steps, write_error_reason
from vit_jax.data import DataWorkerError
from vit_jax.observe import ProfileWindow, Summaries, require_wandb
from vit_jax.preemption import Stopped, StopSignals
from vit_jax.resume import check_same_data, config_mismatch, run_config, schedule_change
from vit_jax.trainer import Trainer, _cache_events, sharded_abstract


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
    ``DataWorkerError``, raised after saving the step reached (one process; with several, the others are
    stopped through ``vit_jax.distributed``). The test set is evaluated (loss, top-1 and top-5 accuracy)
    every ``eval_every`` epochs, or every ``eval_every_steps`` steps when that is set, and at the end;
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
        FileNotFoundError: ``resume`` without a run in ``out``. A run stopped before its first complete
            checkpoint starts again from step 0, with or without ``resume`` and with any config; a
            latest checkpoint that does not restore is reported and the one before it used.
        NonFiniteError: NaN or Inf in the loss or gradients; the last good checkpoint stays intact.
        Stopped: ``stop`` asked for it (a signal); its ``step`` is the checkpoint saved.
        DataWorkerError: an input-pipeline worker process died.
        DestinationError: a fresh run's ``out`` holds a file of ``RUN_FILES`` that vit did not write
            (checked first; a resumed run's config.json proves its files are the run's).
    """
    options = options or RunOptions()
    started = time.perf_counter() if started is None else started
    out = Path(out)
    lead = jax.process_index() == 0
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
    config, metrics_path = run_config(trainer) | ({"init": dict(init)} if init else {}), out / "metrics.jsonl"
    if trainer.tcfg.ema is not None:
        config["exports"] = {"weights": "ema" if options.export_ema else "raw"}
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
        sums = meta.get("metrics")  # the partial sums behind the next metrics line
        if state is None:  # a fresh run, or a resumed one that was stopped before its first complete checkpoint
            state = trainer.init_state()
        before = _cache_events()
        trainer.compile()  # while the first batches are made
        hits, misses = (_cache_events()[k] - before[k] for k in ("cache_hits", "cache_misses"))
        if lead:
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / "config.json", config)
            _truncate_metrics(metrics_path, it.position)
        summaries = None
        if (tensorboard is not None or options.wandb) and lead:
            with _written(Path(tensorboard or out), it.position, ckpts):
                wandb_dir = out if options.wandb else None
                summaries = Summaries(
                    tensorboard, trainer.cfg, trainer.mesh.size, peak_flops, wandb_dir=wandb_dir, config=config
                )
        return _loop(
            trainer,
            state,
            it,
            ckpts,
            metrics_path,
            options,
            lead=lead,
            started=started,
            compile_cache="off" if not compile_cache else "warm" if hits and not misses else "cold",
            stop=stop,
            sums=sums,
            summaries=summaries,
            profile=ProfileWindow(out / "profile", *profile_steps) if profile_steps and lead else None,
        )
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


def _loop(
    t: Trainer,
    state,
    it,
    ckpts,
    metrics_path,
    options: RunOptions,
    *,
    lead: bool,
    started: float,
    compile_cache: str,
    stop,
    sums,
    summaries,
    profile,
) -> tuple[dict, dict]:
    from tqdm import tqdm

    clock = time.perf_counter
    ckpt_every, log_every, eval_every = options.ckpt_every, options.log_every, options.eval_every
    ckpt_seconds, eval_every_steps = 60.0 * options.ckpt_every_minutes, options.eval_every_steps
    tcfg, spe, total, start = t.tcfg, t.steps_per_epoch, t.total_steps, it.position  # one batch per step
    n_train = len(t.data.train)
    pbar = (
        tqdm(
            total=tcfg.epochs * n_train,
            initial=examples_before(start, n_train, tcfg.batch_size),
            unit="img",
            unit_scale=True,
            dynamic_ncols=True,
            desc="train",
        )
        if options.progress and lead
        else None
    )
    log = in_place.open_log(metrics_path) if lead else None

    def write(line: dict) -> None:
        if log:
            with _written(metrics_path, line["step"], ckpts):
                log.write(json.dumps(line) + "\n")
                log.flush()

    acc = {"loss": 0.0, "correct": 0.0, "count": 0.0, "grad_norm": 0.0, "steps": 0, "seconds": 0.0}
    acc |= sums or {}  # the sums since the last metrics line, as the checkpoint resumed from held them
    seen = timed = 0.0
    test = {}
    t_start = last_save = clock()
    many = jax.process_count() > 1

    def save(s: int, metrics: dict | None = None) -> None:
        nonlocal last_save
        if ckpts.latest_step() != s:  # a data worker's death right after a step that was saved
            ckpts.save(s, state, {"step": s, "metrics": dict(acc)}, metrics)
        last_save = clock()

    def time_due() -> bool:
        due = bool(ckpt_seconds) and clock() - last_save >= ckpt_seconds
        if ckpt_seconds and many:  # every process saves at the step process 0's clock says
            from jax.experimental import multihost_utils

            due = bool(multihost_utils.broadcast_one_to_all(np.bool_(due)))
        return due

    if stop is not None:
        stop.training()
    try:
        for step in range(start, total):
            if profile:
                profile.before(step + 1)
            t0 = clock()
            with jax.profiler.StepTraceAnnotation("train", step_num=step + 1):
                try:
                    batch = next(it)
                except DataWorkerError:
                    if not many and step > start:  # the state of the step reached is whole: keep it
                        save(step)
                    raise
                state, m = t.train_step(state, batch)
                m = jax.device_get(m)
            if step == start:
                write({"step": step + 1, "time_to_first_step_s": clock() - started, "compile_cache": compile_cache})
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
                    f"{step + 1}: not finite, training stopped; {kept}. Try a lower --lr."
                )
            dt = clock() - t0
            if step > start:  # the first step of a process includes compilation
                seen, timed = seen + float(m["count"]), timed + dt
            for k in ("loss", "grad_norm"):
                acc[k] += float(m[k])
            acc["correct"] += float(m["correct"])
            acc["count"] += float(m["count"])
            acc["steps"] += 1
            acc["seconds"] += dt
            s = step + 1
            if pbar:
                pbar.update(int(m["count"]))
                pbar.set_postfix(
                    epoch=f"{s / spe:.2f}",
                    loss=f"{float(m['loss']):.3f}",
                    lr=f"{float(m['lr']):.1e}",
                    **({"test_acc": f"{test['test_accuracy']:.4f}"} if test else {}),
                    refresh=False,
                )
            if profile:
                profile.after(s, state)
            if s % log_every == 0 or s == total:
                line = {
                    "step": s,
                    "epoch": s / spe,
                    "loss": acc["loss"] / acc["steps"],
                    "accuracy": acc["correct"] / max(acc["count"], 1),
                    "lr": float(m["lr"]),
                    "grad_norm": acc["grad_norm"] / acc["steps"],
                    "images_per_s": acc["count"] / max(acc["seconds"], 1e-9),
                    "time": clock() - t_start,
                }
                write(line)
                if summaries:
                    with _written(summaries.logdir or metrics_path.parent, s, ckpts):
                        summaries.train(line, acc["seconds"] / acc["steps"])
                acc = dict.fromkeys(acc, 0.0)
            due = s % eval_every_steps == 0 if eval_every_steps else s % spe == 0 and (s // spe) % eval_every == 0
            evaluated = s == total or due
            if evaluated:
                test = evaluation(t, state)
                line = {"step": s, "epoch": s / spe, **test}
                write(line)
                if summaries:
                    with _written(summaries.logdir or metrics_path.parent, s, ckpts):
                        summaries.test(line)
            stopping = stop is not None and stop.reached(s)  # every process, every step
            best = evaluated and ckpts.best is not None  # every evaluation is a candidate for the best
            if s == total or (ckpt_every and s % ckpt_every == 0) or time_due() or stopping or best:
                if stopping and s < total:
                    stop.saving(s)
                save(s, {k: v for k, v in line.items() if k.startswith("test_")} if evaluated else None)
            if stopping and s < total:
                ckpts.wait()
                raise Stopped(stop.received or "a signal", s)
    finally:
        if pbar:
            pbar.close()
        if log:
            log.close()
        if summaries:
            summaries.close()
        if profile:
            profile.stop()
    if not test:  # resumed after the last step: nothing ran
        test = evaluation(t, state)
    summary = {
        "steps": total,
        "start": start,
        **{k: v for k, v in test.items() if k != "test_top5_accuracy"},
        "images_per_s": seen / timed if timed else None,
        "train_seconds": clock() - t_start,
    }
    if ckpts.best is not None:
        ckpts.wait()
        summary["best_checkpoint"] = {"step": ckpts.best_step(), "metric": ckpts.best}
    return state, summary
