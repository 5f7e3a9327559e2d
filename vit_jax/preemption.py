"""Stopping a run on a signal: SIGTERM, SIGHUP and Ctrl-C (SIGINT) take one path.

SIGTERM is what cloud TPU/GPU schedulers, SLURM, ``docker stop`` and ``timeout`` send before they kill
a job; SIGHUP comes when the terminal goes; Ctrl-C is SIGINT. ``StopSignals`` turns each into a request
to stop, answered where the run is:

    start-up  (reading data, building and compiling)  ``Stopped`` is raised at once: nothing since the
              last checkpoint has been computed yet; inside JAX's tracing or compiling it is raised once
              the compilation returns (``compiled``), as an exception raised inside XLA is printed as a
              traceback or crashes the process
    training  a flag; the loop asks ``reached(step)`` after every step and, when it says so, saves an
              orbax checkpoint of that step, waits for it and raises ``Stopped``
    saving    a second signal prints one line and the save goes on (SIGKILL abandons it; the previous
              checkpoint is then the one a resume takes)
    finishing (the exports after the last step)  ``Stopped`` is raised at once; each export is an
              atomic write, so nothing half-written is left, and ``--resume`` writes them again

Every process of a multi-process run stops at the same step: JAX's preemption service
(``jax.distributed`` starts it; ``jax.experimental.multihost_utils.reached_preemption_sync_point``,
as MaxText uses it) catches SIGTERM in C++, tells every process, and the sync point is the first step
that every process reaches afterwards. SIGHUP and SIGINT are passed on to it as SIGTERM. One process
uses the handler's own flag.

The exit code of a run stopped this way is ``EXIT_STOPPED``; the same command with ``--resume``
continues it.

Damaged data found in the middle of a multi-process run stops it the same way, at one step in every
process: each process reads its own rows of a step's batch, so before every step the processes agree
on a damage flag (``agree_damage``, one all-gather of a flag per step), and when one could not read its
rows every process saves the step reached (a collective orbax save) and stops with the same
``DamageStop``. The sync point of a signal is not enough here: it lies after the step every process
has reached, and the process that cannot read its rows cannot take that step. An evaluation's batches
are split the same way, and each batch's computation is a collective, so the flag is agreed before each
of them too (``agreed_batches``): a process that cannot read its rows of the test set leaves none
waiting in a collective. A data worker process that dies, of the training set's or at an evaluation of
the test set's, takes the same path (the flag says which): every process saves the step reached and
stops with the same ``WorkerStop``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterable, Iterator

from vit_common.data.stored_datasets import DataReadError
from vit_jax.data import DataWorkerError

EXIT_STOPPED = 3  # vit train's own: stopped by a signal after saving; the same command with --resume continues
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


_JAX_MODULES = ("jax", "jaxlib", "flax", "optax", "orbax")


def _in_jax(frame) -> bool:
    """Whether the signal handler interrupted JAX's own code (tracing, compiling, or a callback XLA runs
    such as its garbage-collection hook): an exception raised there is printed as an XLA traceback, or
    leaves XLA's compiler threads to crash the process at exit."""
    while frame is not None:
        if frame.f_globals.get("__name__", "").split(".")[0] in _JAX_MODULES:
            return True
        frame = frame.f_back
    return False


class Stopped(BaseException):  # noqa: N818 (a stop, like KeyboardInterrupt, not an error)
    """The run stopped on a signal. ``step``: the step of the checkpoint it saved (None when it stopped
    before its first step or after its last, with nothing new to save); ``signal``: the signal's name."""

    def __init__(self, signal_name: str, step: int | None = None):
        super().__init__(signal_name if step is None else f"{signal_name} at step {step}")
        self.signal, self.step = signal_name, step


class StopSignals:
    """SIGTERM, SIGHUP and SIGINT handlers for one run (a context manager: the previous handlers come
    back at its end). Must be entered on the main thread.

    Args:
        multiprocess: the run has several processes (``jax.distributed`` is initialised): the stop step
            comes from JAX's preemption sync point, and SIGHUP / SIGINT are forwarded to it as SIGTERM.
        say: where the one line about a second signal goes (default stderr).
    """

    def __init__(self, multiprocess: bool = False, say: Callable[[str], None] | None = None):
        self.multiprocess = multiprocess
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.received: str | None = None  # the first signal's name
        self.phase = "start-up"
        self.saving_step: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        for sig in SIGNALS:  # with several processes JAX's preemption notifier holds SIGTERM
            if not (self.multiprocess and sig == signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig in list(self._previous):
            self._restore(sig)

    def _restore(self, sig: int) -> None:
        previous = self._previous.pop(sig)  # None: a handler installed from C (JAX's notifier)
        signal.signal(sig, signal.SIG_DFL if previous is None else previous)

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.phase == "saving":
            self.say(
                f"vit train: {name} again: still writing the checkpoint of step {self.saving_step}; it is kept "
                "when done (SIGKILL abandons it, and --resume then continues from the one before)"
            )
            return
        self.received = self.received or name
        if self.phase == "start-up" and _in_jax(frame):
            return  # raised inside XLA's compilation (or a callback it runs) it prints a traceback or crashes
        if self.phase in ("start-up", "finishing"):
            raise Stopped(name)
        if self.multiprocess:  # to JAX's preemption notifier, which tells every process
            signal.raise_signal(signal.SIGTERM)

    def compiled(self) -> None:
        """The start-up's compilation is done: a signal that arrived while JAX traced or compiled (held
        back: ``_in_jax``) stops the run now, before anything is written."""
        if self.received is not None and self.phase == "start-up":
            raise Stopped(self.received)

    def training(self) -> None:
        """The steps begin: a signal from now on stops the run after the step it arrives in."""
        if self.received is not None:
            raise Stopped(self.received)
        self.phase = "training"

    def reached(self, step: int) -> bool:
        """Whether the run stops after ``step`` (every process calls this after every step; with several
        processes they all get True at the same step)."""
        if self.multiprocess:
            from jax.experimental import multihost_utils

            if multihost_utils.reached_preemption_sync_point(step):
                self.received = self.received or "SIGTERM"
                return True
            return False
        return self.received is not None

    def saving(self, step: int) -> None:
        """The stop's checkpoint of ``step`` is being written: a further signal only prints a line."""
        self.phase, self.saving_step = "saving", step

    def finishing(self) -> None:
        """The steps are done (the exports follow): a signal stops the run at once. With several
        processes SIGTERM comes back from JAX's notifier to this handler."""
        if self.multiprocess and signal.SIGTERM not in self._previous:
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
        self.phase = "finishing"
        if self.received is not None:
            raise Stopped(self.received)


class DamageStop(DataReadError):
    """An example of a step's batch that one process of a multi-process run could not read, agreed by every
    process before the step (``agree_damage``): each saved the step reached and stops with this error."""


class WorkerStop(DataWorkerError):
    """A data worker process of one process of a multi-process run died, agreed by every process before the
    step (``agree_damage``): each saved the step reached and stops with this error."""


_DAMAGE_BYTES = 4096  # the most of an error's text shared (read_error keeps 300 characters after a path)


def agree_damage(error: DataReadError | DataWorkerError | None) -> DamageStop | WorkerStop | None:
    """The damage flag of a multi-process run: every process calls this before every step with the error
    reading its rows of the step's batch (None: they were read; ``DataWorkerError``: a worker that made
    them died), and gets the same answer.

    Returns:
        None when every process read its rows; else the first such process's error (id and count, and
        its error's text) as ``DamageStop``, or ``WorkerStop`` when its data worker died.
    """
    import numpy as np
    from jax.experimental import multihost_utils

    kind = 0 if error is None else 2 if isinstance(error, DataWorkerError) else 1
    flags = multihost_utils.process_allgather(np.int32(kind))
    if not flags.any():
        return None
    text = np.zeros(_DAMAGE_BYTES, np.uint8)
    if error is not None:
        data = str(error).encode()[:_DAMAGE_BYTES]
        text[: len(data)] = np.frombuffer(data, np.uint8)
    first = int(np.argmax(flags > 0))
    said = bytes(multihost_utils.process_allgather(text)[first]).rstrip(b"\0").decode(errors="replace")
    return (WorkerStop if flags[first] == 2 else DamageStop)(f"(process {first} of {len(flags)}): {said}")


def agreed_batches(batches: Iterable[dict]) -> Iterator[dict]:
    """``batches`` (this process's rows of each batch of a multi-process pass, as many batches in every
    process), each yielded once every process has read its rows of it (``agree_damage`` per batch).

    Raises:
        DamageStop: a process could not read its rows of a batch (``DataReadError``), in every process
            before that batch's computation.
        WorkerStop: a data worker process that made a process's rows died (``DataWorkerError``), the same.
    """
    it = iter(batches)
    while True:
        damage = None
        try:
            batch = next(it)
        except StopIteration:
            return
        except (DataReadError, DataWorkerError) as e:
            damage = e
        damage = agree_damage(damage)
        if damage is not None:
            raise damage
        yield batch


def located(error: DataReadError | DataWorkerError, where: str) -> DataReadError | DataWorkerError:
    """``error`` of the same type, its text after ``where`` (a step's batch or evaluation): "where (process
    i of n): ..." when the processes agreed on it (``DamageStop``, ``WorkerStop``), else "where: ..."."""
    agreed = isinstance(error, (DamageStop, WorkerStop))
    return type(error)(f"{where}{'' if agreed else ':'} {error}")
