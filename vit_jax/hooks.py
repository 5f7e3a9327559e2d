"""The training loop's per-step hooks and the run state they read (levanter's ``Trainer.add_hook`` is the model).

``vit_jax.loop.fit`` takes the steps; everything else a run does at a step (its metrics line, the test
set's evaluation, TensorBoard / Weights & Biases scalars, the profile window, the checkpoint, the stop
check, the progress bar) is a hook: a function of the ``RunState``, registered in ``vit_jax.loop.run_hooks``
in the order it runs. Adding one is one line there::

    hooks.add_hook(fn, every=N)              # after step s when s % N == 0, and after the last step
    hooks.add_hook(fn, before=True)          # before each step; run.step + 1 is the step about to run
    hooks.add_hook(fn, every=N, close=done)  # done() once the steps end, in registration order, even on error

A hook runs on every process (``run.lead`` says whether this one writes the run's files); one that
takes part in a collective (a broadcast, a checkpoint) must run at the same steps on all of them. It may
raise to stop the run (``NonFiniteError``, ``Stopped``): hooks after it in the order do not run for that
step, and the close functions still do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_NO_SUMS = {"loss": 0.0, "correct": 0.0, "count": 0.0, "grad_norm": 0.0, "steps": 0, "seconds": 0.0}


@dataclass
class RunState:
    """What the hooks of one run read and share, on each process.

    Set by the loop:
        trainer: the ``vit_jax.trainer.Trainer`` (its config ``tcfg``, ``steps_per_epoch``, data).
        state: the training state after ``step`` (the pytree ``Trainer.train_step`` returns: params,
            optimizer state, with an EMA "ema"; arrays on the run's devices).
        start: the step the run started at (0 fresh, else the checkpoint resumed from).
        total: the last step (``Trainer.total_steps``).
        step: the steps done (1-based number of the step just taken; ``start`` before the first).
        metrics: that step's numbers as numpy scalars on the host: loss (mean cross-entropy, nats),
            grad_norm (global L2 norm), correct and count (images right and images in the batch), lr (the
            step's learning rate).
        step_seconds: wall seconds of that step (the batch, the step, the transfer of ``metrics``).
        began: ``time.perf_counter()`` when the steps began.
        lead: this is process 0, which alone writes the run's files.
    Kept by hooks:
        sums: since the last metrics line: loss, grad_norm (sums of the per-step values), correct,
            count (images), steps, seconds (wall); the checkpoint stores them, so a resumed run writes
            the same lines.
        evaluation: the latest evaluation (``vit_jax.loop.evaluation``'s dict; {} before the first).
        evaluated_at: the step of that evaluation (None before the first).
        stopping: a stop was asked for after this step (``vit_jax.preemption.StopSignals.reached``).
    """

    trainer: Any
    state: Any
    start: int
    total: int
    began: float
    lead: bool
    step: int
    metrics: dict = field(default_factory=dict)
    step_seconds: float = 0.0
    sums: dict = field(default_factory=lambda: dict(_NO_SUMS))
    evaluation: dict = field(default_factory=dict)
    evaluated_at: int | None = None
    stopping: bool = False


@dataclass(frozen=True)
class _Hook:
    fn: Callable[[RunState], Any]
    every: int
    before: bool


class Hooks:
    """Hooks in the order they were added (``add_hook``); ``after`` / ``before`` run those due."""

    def __init__(self):
        self._hooks: list[_Hook] = []
        self._closing: list[Callable[[], Any]] = []

    def add_hook(
        self,
        fn: Callable[[RunState], Any],
        *,
        every: int = 1,
        before: bool = False,
        close: Callable[[], Any] | None = None,
    ) -> None:
        """Run ``fn(run)`` after each step ``s`` with ``s % every == 0`` and after the run's last step
        (``before``: before each step ``s`` with ``s % every == 0``); ``close()`` once the steps end.

        Raises:
            ValueError: ``every`` below 1.
        """
        if every < 1:
            raise ValueError(f"every={every}: a hook runs every N >= 1 steps")
        self._hooks.append(_Hook(fn, every, before))
        if close is not None:
            self._closing.append(close)

    def after(self, run: RunState) -> None:
        """The hooks due after step ``run.step``, in order."""
        for h in self._hooks:
            if not h.before and (run.step % h.every == 0 or run.step == run.total):
                h.fn(run)

    def before(self, run: RunState) -> None:
        """The hooks due before step ``run.step + 1``, in order."""
        for h in self._hooks:
            if h.before and (run.step + 1) % h.every == 0:
                h.fn(run)

    def close(self) -> None:
        """The close functions, in the order they were added (the first that raises ends it)."""
        for fn in self._closing:
            fn()
