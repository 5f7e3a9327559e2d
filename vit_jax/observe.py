"""What a training run shows while it runs: TensorBoard event files and a ``jax.profiler`` trace.

``Summaries`` writes TensorBoard event files with tensorboardX (a well-kept writer that needs neither
TensorFlow nor torch; CLU's and flax's writers need TensorFlow), on process 0 only. Tags:

    model/parameters, model/gflops_per_image     at step 0 (``ViTConfig.param_count``, ``ViTConfig.flops``)
    train/loss, train/accuracy, train/lr, train/grad_norm
                                                 each metrics.jsonl line (the same averages)
    perf/step_time_s                             seconds per step, averaged over the line's steps
    perf/images_per_s_per_device                 images/s over the line's steps / devices
    perf/mfu                                     model FLOP utilisation against ``peak_flops`` per device:
                                                 images/s x 3 x forward FLOPs / (peak x devices)
                                                 (``vit_common.system.peaks``); left out without a peak
    test/loss, test/accuracy, test/top5_accuracy each evaluation

``ProfileWindow`` traces steps A..B (1-based, inclusive) with ``jax.profiler`` into a folder that
TensorBoard's profile plugin and Perfetto open, as big_vision, scenic and MaxText trace a few early
steps; the loop marks each step with ``jax.profiler.StepTraceAnnotation`` so the trace viewer groups
work by step.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

from vit_common.config import ViTConfig
from vit_common.system.peaks import TRAIN_FLOPS_FACTOR


class Summaries:
    """TensorBoard event files of one run in ``logdir`` (made if missing).

    Args:
        cfg: the model (parameter count, FLOPs).
        devices: devices the batch is split over (for the per-device rate and MFU).
        peak_flops: peak FLOP/s of one device, or None (no MFU).
    """

    def __init__(self, logdir: str | os.PathLike, cfg: ViTConfig, devices: int, peak_flops: float | None):
        from tensorboardX import SummaryWriter

        self.devices, self.peak = devices, peak_flops
        self.flops_per_image = cfg.flops()
        self.writer = SummaryWriter(logdir=str(Path(logdir)), flush_secs=30)
        self.writer.add_scalar("model/parameters", cfg.param_count(), 0)
        self.writer.add_scalar("model/gflops_per_image", self.flops_per_image / 1e9, 0)

    def train(self, line: dict, step_time: float) -> None:
        """One metrics.jsonl training line (step, loss, accuracy, lr, grad_norm, images_per_s) and the
        mean seconds per step over it."""
        s, w = line["step"], self.writer
        for k in ("loss", "accuracy", "lr", "grad_norm"):
            w.add_scalar(f"train/{k}", line[k], s)
        w.add_scalar("perf/step_time_s", step_time, s)
        w.add_scalar("perf/images_per_s_per_device", line["images_per_s"] / self.devices, s)
        if self.peak:
            model_flops = line["images_per_s"] * TRAIN_FLOPS_FACTOR * self.flops_per_image
            w.add_scalar("perf/mfu", model_flops / (self.peak * self.devices), s)

    def test(self, line: dict) -> None:
        """One evaluation line (step, test_loss, test_accuracy, test_top5_accuracy)."""
        self.writer.add_scalar("test/loss", line["test_loss"], line["step"])
        self.writer.add_scalar("test/accuracy", line["test_accuracy"], line["step"])
        self.writer.add_scalar("test/top5_accuracy", line["test_top5_accuracy"], line["step"])

    def close(self) -> None:
        self.writer.close()


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
