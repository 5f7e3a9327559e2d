"""What a training run shows while it runs: TensorBoard event files, Weights & Biases, a ``jax.profiler`` trace.

``Summaries`` writes TensorBoard event files with tensorboardX (a well-kept writer that needs neither
TensorFlow nor torch; CLU's and flax's writers need TensorFlow) and, when asked, the same scalars to
Weights & Biases (``wandb``, as MaxText and levanter log), on process 0 only. It writes through
tensorboardX's synchronous ``EventsWriter``, flushed at each metrics line, not its ``SummaryWriter``:
that one writes from a thread which, once a write fails (a full disk), dies with a traceback and leaves
the queue it reads to fill, so the training loop's next ``add_scalar`` blocks for ever (the hang
tensorboard's own writer fixed in tensorflow/tensorboard#6167); here the error reaches the loop, which
names the file. Tags:

    model/parameters, model/gflops_per_image     at step 0 (``ViTConfig.param_count``, ``ViTConfig.flops``)
    train/loss, train/accuracy, train/lr, train/grad_norm
                                                 each metrics.jsonl line (the same averages)
    perf/step_time_s                             seconds per step, averaged over the line's steps
    perf/images_per_s_per_device                 images/s over the line's steps / devices
    perf/mfu                                     model FLOP utilisation against ``peak_flops`` per device:
                                                 images/s x 3 x forward FLOPs / (peak x devices)
                                                 (``vit_common.system.peaks``); left out without a peak
    test/loss, test/accuracy, test/top5_accuracy each evaluation
    test_ema/loss, test_ema/accuracy, test_ema/top5_accuracy
                                                 each evaluation of a run with ``--ema`` (the moving average)

A run resumed from a checkpoint logs again, into a new event file of the same folder, the steps a killed
run had logged after that checkpoint. So each start first writes a restart marker, the ``SessionLog.START``
event that tensorboardX's ``SummaryWriter(purge_step=...)`` writes, at the first step this start logs (0
when fresh, the checkpoint's step + 1 when resumed): tensorboard's ``EventAccumulator`` (its
``_CheckForRestartAndMaybePurge``) drops every point read before the marker at that step or later (its
``plugin_event_accumulator``, TensorBoard's loader without the data server, alike but from a folder's
second marker on: hence one at a fresh start too), and TensorBoard's data server drops a series' points
whenever its step goes back. Each step then shows once, as in metrics.jsonl, which the resume cuts back
to the checkpoint. Only a fresh start writes the step-0 constants.

``ProfileWindow`` traces steps A..B (1-based, inclusive) with ``jax.profiler`` into a folder that
TensorBoard's profile plugin and Perfetto open, as big_vision, scenic and MaxText trace a few early
steps; the loop marks each step with ``jax.profiler.StepTraceAnnotation`` so the trace viewer groups
work by step.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jax

from vit_common.config import ViTConfig
from vit_common.system.extras import install_hint
from vit_common.system.peaks import TRAIN_FLOPS_FACTOR

WANDB_EXTRA = install_hint("wandb")


def tensorboardx() -> tuple:
    """tensorboardX's (``EventsWriter``, ``Event``, ``SessionLog``, ``summary.scalar``). Its package
    imports torch where it can, for the type annotations of a ``SummaryWriter`` this module does not use
    (seconds: a JAX run needs no torch), so torch is hidden while tensorboardX first loads, unless imported."""
    hide = "torch" not in sys.modules and "tensorboardX" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.summary import scalar
    finally:
        if hide and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return EventsWriter, Event, SessionLog, scalar


def require_wandb():
    """The ``wandb`` module.

    Raises:
        ValueError: wandb is not installed (one line naming the extra that installs it).
    """
    try:
        import wandb
    except ImportError:
        raise ValueError(f"--wandb: wandb is not installed ({WANDB_EXTRA})") from None
    return wandb


class Summaries:
    """The scalars of one run: TensorBoard event files in ``logdir`` (made if missing; None for none) and,
    with ``wandb_dir``, a Weights & Biases run whose files go under ``wandb_dir``/wandb (``wandb.init(dir=)``)
    with ``config`` (config.json's content) as its config. wandb's own settings apply: WANDB_MODE
    (offline: nothing leaves the machine; ``wandb sync`` uploads later), WANDB_PROJECT (default
    "vit-twins"), WANDB_ENTITY; its console capture is off, so the run's output stays as it is.

    Args:
        cfg: the model (parameter count, FLOPs).
        devices: devices the batch is split over (for the per-device rate and MFU).
        peak_flops: peak FLOP/s of one device, or None (no MFU).
        start: the step the run starts at (0 fresh, else the checkpoint it resumed from): the event file
            opens with the restart marker at the first step this start writes (0, or ``start`` + 1), and
            only a fresh start writes the step-0 constants to it (a wandb run is new at every start and
            gets them each time).
        patches: a NaFlex run's patch budget: the FLOPs of an image are counted at it (``ViTConfig.flops``),
            whatever the table's grid; None: at the grid.

    Raises:
        ValueError: ``wandb_dir`` given and wandb not installed (``require_wandb``).
        OSError: the event file cannot be written (naming its folder).
    """

    def __init__(
        self,
        logdir: str | os.PathLike | None,
        cfg: ViTConfig,
        devices: int,
        peak_flops: float | None,
        *,
        start: int = 0,
        wandb_dir: str | os.PathLike | None = None,
        config: dict | None = None,
        patches: int | None = None,
    ):
        self.devices, self.peak = devices, peak_flops
        self.flops_per_image = cfg.flops(patches=patches)
        self.events = self.run = None
        self.logdir, self._failed = logdir, False
        if logdir is not None:
            EventsWriter, Event, SessionLog, _ = tensorboardx()
            Path(logdir).mkdir(parents=True, exist_ok=True)
            self.events = EventsWriter(str(Path(logdir) / "events"))
            restart = SessionLog(status=SessionLog.START)  # before any point of this start: see the module's notes
            self._events([Event(wall_time=time.time(), step=start + 1 if start else 0, session_log=restart)])
        if wandb_dir is not None:
            wandb = require_wandb()
            self.run = wandb.init(
                dir=str(Path(wandb_dir)),
                project=os.environ.get("WANDB_PROJECT") or "vit-twins",
                name=Path(wandb_dir).absolute().name,
                config=config,
                settings=wandb.Settings(console="off", silent=True),
            )
        constants = {"model/parameters": cfg.param_count(), "model/gflops_per_image": self.flops_per_image / 1e9}
        self._write(constants, 0, tensorboard=not start)

    def _events(self, events: list) -> None:
        """Append ``events`` (tensorboardX ``Event`` protos) to the event file and flush it.

        Raises:
            OSError: the event file cannot be written (naming its folder).
        """
        try:
            for event in events:
                self.events.write_event(event)
            self.events.flush()
        except OSError as e:
            self._failed = True
            raise OSError(e.errno, e.strerror, str(self.logdir)) from None

    def _write(self, scalars: dict[str, float], step: int, *, tensorboard: bool = True) -> None:
        """``scalars`` at ``step`` to the event file (unless not ``tensorboard``) and to wandb.

        Raises:
            OSError: the event file cannot be written (naming its folder).
        """
        if tensorboard and self.events is not None:
            _, Event, _, scalar = tensorboardx()
            now = time.time()
            self._events([Event(wall_time=now, step=step, summary=scalar(tag, v)) for tag, v in scalars.items()])
        if self.run is not None:
            self.run.log(scalars, step=step)

    def train(self, line: dict, step_time: float) -> None:
        """One metrics.jsonl training line (step, loss, accuracy, lr, grad_norm, images_per_s) and the
        mean seconds per step over it."""
        scalars = {f"train/{k}": line[k] for k in ("loss", "accuracy", "lr", "grad_norm")}
        scalars["perf/step_time_s"] = step_time
        scalars["perf/images_per_s_per_device"] = line["images_per_s"] / self.devices
        if self.peak:
            model_flops = line["images_per_s"] * TRAIN_FLOPS_FACTOR * self.flops_per_image
            scalars["perf/mfu"] = model_flops / (self.peak * self.devices)
        self._write(scalars, line["step"])

    def test(self, line: dict) -> None:
        """One evaluation line (step, test_loss, test_accuracy, test_top5_accuracy, and with an EMA
        test_ema_loss, test_ema_accuracy, test_ema_top5_accuracy)."""
        scalars = {}
        for prefix, group in (("test_", "test"), ("test_ema_", "test_ema")):
            for k in ("loss", "accuracy", "top5_accuracy"):
                if prefix + k in line:
                    scalars[f"{group}/{k}"] = line[prefix + k]
        self._write(scalars, line["step"])

    def close(self) -> None:
        if self.events is not None:
            try:
                self.events.close()
            except OSError:
                if not self._failed:  # else the failed write's error is on its way up: keep that one
                    raise
        if self.run is not None:
            self.run.finish()


class ProfileWindow:
    """A ``jax.profiler`` trace of steps ``first``..``last`` (1-based, inclusive) into ``logdir``."""

    def __init__(self, logdir: str | os.PathLike, first: int, last: int):
        self.logdir, self.first, self.last, self.on = str(logdir), first, last, False

    def before(self, step: int) -> None:
        """Call before step ``step`` (1-based) runs."""
        if step == self.first:
            jax.profiler.start_trace(self.logdir)
            self.on = True

    def after(self, step: int, state) -> None:
        """Call after step ``step``: the trace ends once that step's work is done."""
        if self.on and step == self.last:
            jax.block_until_ready(state)
            self.stop()

    def stop(self) -> None:
        if self.on:
            jax.profiler.stop_trace()
            self.on = False
