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

``ProfileWindow`` traces steps A..B (1-based, inclusive) with ``jax.profiler`` into a folder that
TensorBoard's profile plugin and Perfetto open, as big_vision, scenic and MaxText trace a few early
steps; the loop marks each step with ``jax.profiler.StepTraceAnnotation`` so the trace viewer groups
work by step.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import jax

from vit_common.config import ViTConfig
from vit_common.system.extras import install_hint
from vit_common.system.peaks import TRAIN_FLOPS_FACTOR

WANDB_EXTRA = install_hint("wandb")


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

    Raises:
        ValueError: ``wandb_dir`` given and wandb not installed (``require_wandb``).
    """

    def __init__(
        self,
        logdir: str | os.PathLike | None,
        cfg: ViTConfig,
        devices: int,
        peak_flops: float | None,
        *,
        wandb_dir: str | os.PathLike | None = None,
        config: dict | None = None,
    ):
        self.devices, self.peak = devices, peak_flops
        self.flops_per_image = cfg.flops()
        self.events = self.run = None
        self.logdir, self._failed = logdir, False
        if logdir is not None:
            from tensorboardX.event_file_writer import EventsWriter

            Path(logdir).mkdir(parents=True, exist_ok=True)
            self.events = EventsWriter(str(Path(logdir) / "events"))
        if wandb_dir is not None:
            wandb = require_wandb()
            self.run = wandb.init(
                dir=str(Path(wandb_dir)),
                project=os.environ.get("WANDB_PROJECT") or "vit-twins",
                name=Path(wandb_dir).absolute().name,
                config=config,
                settings=wandb.Settings(console="off", silent=True),
            )
        self._write({"model/parameters": cfg.param_count(), "model/gflops_per_image": self.flops_per_image / 1e9}, 0)

    def _write(self, scalars: dict[str, float], step: int) -> None:
        """Raises OSError: the event file cannot be written (naming its folder)."""
        if self.events is not None:
            from tensorboardX.proto.event_pb2 import Event
            from tensorboardX.summary import scalar

            try:
                for tag, value in scalars.items():
                    self.events.write_event(Event(wall_time=time.time(), step=step, summary=scalar(tag, value)))
                self.events.flush()
            except OSError as e:
                self._failed = True
                raise OSError(e.errno, e.strerror, str(self.logdir)) from None
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
