"""Orbax checkpoints of the JAX twin's train state, and what a write that failed tells the user.

``Checkpoints`` is one ``orbax.checkpoint.CheckpointManager`` over a run's checkpoints/ folder: at each
saved step the train state (any pytree, its PRNG keys stored as key data: ``vit_jax.keys``) and a JSON
metadata item, which records the state's checksums computed on the devices; every restore checks them
(``vit_jax.state_checksums``). Saves are asynchronous and atomic (a temporary folder renamed into place),
the last ``keep`` kept and optionally the best by an evaluation metric; the free space is checked before a
save starts, and a save that fails is raised once, as one OSError line naming the folder, the step, the
cause as the OS names it (``write_error_reason``) and where ``--resume`` continues (``saved_steps``: a
folder's complete checkpoints). orbax's own threads' reports of that failure are dropped
(``_OrbaxReportsDropped``). With several processes every process calls every method.

Reads of orbax folders, here and of a model folder (``vit_jax.formats``), run inside
``orbax_reports_dropped``: a failed one leaves orbax's threads reporting the error after it was raised,
and those reports are dropped; ``read_error_reason`` names what a failed read found wrong in one line.

What the train state holds is ``vit_jax.trainer``'s; whether and where a run continues is
``vit_jax.resume`` and ``vit_jax.loop.fit``. The torch twin has no counterpart (see ``vit_torch.train``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from vit_common.system import io
from vit_jax.keys import data_to_keys, key_impl_name, keys_to_data
from vit_jax.state_checksums import RECORD_KEY, ChecksumError, check, checksums


class Checkpoints:
    """Orbax CheckpointManager over ``directory``: train state + JSON metadata per step.

    Saves are asynchronous and atomic (written to a temporary folder, then renamed); temporary
    folders left by a killed process are removed when the manager opens. Keeps the last ``keep``.
    With several processes every process calls every method; each writes the array shards it owns
    and process 0 the metadata and the rename. A save waits at most ``barrier_timeout`` seconds for
    all processes to finish writing. ``best`` (a key of ``BEST``): also keep the checkpoint whose
    ``metrics`` (given to ``save``) are best by it (orbax ``BestN`` beside ``LatestN``).
    """

    # metric -> whether larger is better
    BEST = {"test_accuracy": True, "test_top5_accuracy": True, "test_loss": False}
    BEST |= {"test_ema_accuracy": True, "test_ema_top5_accuracy": True, "test_ema_loss": False}

    def __init__(
        self, directory: str | os.PathLike, keep: int = 3, barrier_timeout: int = 1200, best: str | None = None
    ):
        from orbax.checkpoint import checkpoint_managers as policies

        keeping = [policies.LatestN(n=keep)]
        if best is not None:
            larger = self.BEST[best]
            keeping.append(
                policies.BestN(
                    get_metric_fn=lambda m: m[best], reverse=not larger, n=1, keep_checkpoints_without_metrics=False
                )
            )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policies.AnyPreservationPolicy(keeping),
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(timeout_secs=barrier_timeout),
        )
        self.best, self._scores = best, {}
        self.manager = ocp.CheckpointManager(Path(directory).absolute(), options=options, item_names=("state", "meta"))
        self._writing = None  # the step whose save is in flight (orbax writes it from its own threads)
        self._failed = False  # a save failed and was raised (in one line); its threads report on
        self._incomplete = None  # the step of that save, whose temporary folder ``close`` removes
        self._quiet = _OrbaxReportsDropped(str(self.manager.directory))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, meta: dict, metrics: dict | None = None) -> None:
        """Save ``state`` (any pytree; PRNG keys stored as key data) and JSON ``meta`` at ``step``, with
        the evaluation ``metrics`` of that step for ``best``. ``meta`` also records the state's checksums
        (``vit_jax.state_checksums``, computed on the devices before the write starts), which ``restore``
        checks."""
        data = keys_to_data(state)
        meta = {**meta, "key_impl": key_impl_name(state) or key_impl_name(), RECORD_KEY: checksums(data)}
        self.wait()  # the save before this one (orbax waits for it too): its failure is raised as its own
        self._check_space(step, state)
        if metrics is not None and self.best is not None:
            self._scores[step] = metrics[self.best]
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(data), meta=ocp.args.JsonSave(meta)),
            metrics=metrics,
            force=True,
        )
        self._writing = step

    def _check_space(self, step: int, state) -> None:
        """Refuse, before orbax starts writing, a checkpoint that the run folder's file system cannot hold:
        the bytes this process writes (each array shard it holds with replica id 0, as orbax writes them)
        against the space free (``io.check_free_space``), so that a full disk is named before orbax's threads
        start (a disk that fills during the write fails there, and ``wait`` names that).

        Raises:
            OSError: ENOSPC, naming the folder, the step, what is needed and free, and where --resume
                continues.
        """
        need = sum(
            shard.data.nbytes
            for leaf in jax.tree.leaves(state)
            if isinstance(leaf, jax.Array)
            for shard in leaf.addressable_shards
            if shard.replica_id == 0
        )
        try:
            io.check_free_space(self.manager.directory, need)
        except OSError as e:  # (``save`` waited for the checkpoint before this one)
            full = OSError(
                f"{self.manager.directory}: no space for the checkpoint of step {step} ({e.strerror}); "
                f"{_then_resume(os.strerror(errno.ENOSPC), saved_steps(self.manager.directory))}"
            )
            full.errno = e.errno
            raise full from None

    def best_step(self) -> int | None:
        """The step of the kept checkpoint whose ``best`` metric is best, or None (none has metrics):
        of the metrics saved by this process, else those orbax stored with the checkpoint."""
        kept = self.manager.all_steps()
        scored = [(self._scores[k], k) for k in kept if k in self._scores]
        scored += [(m[self.best], k) for k in kept if k not in self._scores and (m := self.manager.metrics(k))]
        if not scored:
            return None
        return (max if self.BEST[self.best] else min)(scored)[1]

    def restore(self, abstract_state, step: int | None = None):
        """(state shaped like ``abstract_state``, with its shardings; meta dict) at ``step`` or the latest.
        The state is checked against the checksums its save recorded (a checkpoint without them, of an
        earlier version, restores unchecked).

        Raises:
            FileNotFoundError: no checkpoint in the directory.
            ChecksumError: a leaf differs from its recorded checksum (a data file changed or damaged): one
                line naming the step's folder and the leaf's path.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.manager.directory}: no checkpoint to resume from")
        target = keys_to_data(abstract_state)
        with orbax_reports_dropped(self.manager.directory):
            out = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
            )
        meta = dict(out["meta"])
        if RECORD_KEY in meta:
            check(meta.pop(RECORD_KEY), out["state"], f"{self.manager.directory}/{step}")
        return data_to_keys(out["state"], abstract_state, meta["key_impl"]), meta

    def restore_complete(self, abstract_state, steps: list[int]):
        """(step, state, meta) of the latest of ``steps`` that restores; a checkpoint that does not (truncated or
        damaged files, e.g. a disk that filled) is reported on stderr, a line each, and the one before it is
        tried. A checkpoint that restores but differs from its checksums is refused, not passed over: the
        files of a complete checkpoint were changed after it was written, and which others were is unknown.

        Raises:
            ChecksumError: the latest that restores differs from its checksums (``restore``).
            ValueError: none restores: one line naming the folder, the earliest step and what is wrong with it
                (``read_error_reason``; the later ones were reported before).
        """
        for step in reversed(steps):
            try:
                return (step, *self.restore(abstract_state, step=step))
            except ChecksumError:
                raise
            except Exception as e:  # orbax and its JSON/tensorstore readers raise many types
                line = f"{self.manager.directory}/{step}: does not restore ({read_error_reason(e)})"
                if step == steps[0]:
                    raise ValueError(f"{self.manager.directory}: no checkpoint restores; {line}") from e
                print(f"vit train: warning: {line}; trying the checkpoint before it", file=sys.stderr)
        raise ValueError(f"{self.manager.directory}: no checkpoint to restore")

    def wait(self) -> None:
        """Wait for the save in flight, if any.

        Raises:
            OSError: it failed (a disk that filled after ``_check_space``, a quota, an I/O error): one
                line naming the folder, the step, the cause (the OS error tensorstore reports) and where
                --resume continues (``close`` removes the incomplete folder). Raised once: later waits on
                the same failure return.
        """
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # orbax re-raises its threads' errors (tensorstore's ValueError, OSError, ...)
            step, self._writing = self._writing, None
            if self._failed:
                return
            self._failed = True
            if step is None:
                raise
            raise self._write_failed(step, e) from None
        self._writing = None

    def settle(self) -> list[int]:
        """Wait for the save in flight, keeping quiet about its failure (another error is being raised),
        and return the steps of the complete checkpoints."""
        try:
            self.wait()
        except OSError:
            pass
        return saved_steps(self.manager.directory)

    def _write_failed(self, step: int, e: Exception) -> OSError:
        self._incomplete = step
        reason = write_error_reason(e)
        full = OSError(
            f"{self.manager.directory}: the checkpoint of step {step} could not be written ({reason}); "
            f"{_then_resume(reason, saved_steps(self.manager.directory))}"
        )
        full.errno = getattr(e, "errno", None)
        return full

    def close(self) -> None:
        """Close the manager; after a failed save also remove its incomplete folder (one process; with
        several, orbax removes it when --resume opens the folder), for good (``_remove_incomplete``)."""
        try:
            self.manager.close()
        finally:
            if self._incomplete is not None and jax.process_count() == 1:
                _remove_incomplete(self.manager.directory, self._incomplete)
            if not self._failed:  # after a failure orbax's threads may report on: stay quiet to the end
                self._quiet.remove()


class _OrbaxReportsDropped(logging.Filter):
    """While installed, log records of ERROR and above that mention ``folder`` (orbax's background threads
    report a failed write or read of it through absl, asyncio and concurrent.futures, with tracebacks,
    while vit raises the same failure in one line) are dropped, and so are the
    ``RuntimeError('Event loop is closed')`` that tensorstore's done-callbacks report after orbax closed its
    loop (``closed_loop_dropped``), asyncio's "exception was never retrieved" reports of an
    OSError (a failed write of a future orbax left unawaited: its message names no folder) and absl's
    reports of an OSError that a write thread raised ("_SignalingThread.run() raised an exception: [Errno
    28] No space left on device", naming no folder either); other records and unraisable errors pass."""

    LOGGERS = ("absl", "asyncio", "concurrent.futures")

    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)
        self._hook, sys.unraisablehook = sys.unraisablehook, closed_loop_dropped(sys.unraisablehook)
        self._ours = sys.unraisablehook

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        error = record.exc_info[1] if record.exc_info else None
        text = record.getMessage() + (repr(error) if error else "")
        unawaited = record.name == "asyncio" and "exception was never retrieved" in text and isinstance(error, OSError)
        thread = record.name == "absl" and isinstance(error, OSError)  # a write thread's own report, naming no file
        return self.folder not in text and not unawaited and not thread

    def remove(self) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)
        if sys.unraisablehook is self._ours:
            sys.unraisablehook = self._hook


def _remove_incomplete(directory: Path, step: int, quiet: float = 1.0, limit: float = 30.0) -> None:
    """Remove the temporary folders of ``step``'s failed save, and again while one reappears within
    ``quiet`` seconds (at most ``limit`` seconds in all). The save's first error ends orbax's write and
    closes its asyncio loop while tensorstore's threads go on with the writes already under way (no handle
    on them reaches Python); one that ran after the removal made the folder again (1 of 6 runs on a full
    disk under load)."""
    pattern, deadline = f"{step}.orbax-checkpoint-tmp*", time.monotonic() + limit
    while True:
        for tmp in directory.glob(pattern):
            shutil.rmtree(tmp, ignore_errors=True)
        time.sleep(quiet)
        if not any(directory.glob(pattern)) or time.monotonic() > deadline:
            return


def closed_loop_dropped(hook):
    """``hook`` (a ``sys.unraisablehook``) except for ``RuntimeError('Event loop is closed')``."""

    def drop(unraisable) -> None:
        e = unraisable.exc_value
        if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
            hook(unraisable)

    return drop


@contextlib.contextmanager
def orbax_reports_dropped(folder: str | os.PathLike) -> Iterator[None]:
    """Orbax's reports of a failed read or write of ``folder`` (an absolute path) dropped while the block
    runs, and for the rest of the process once the block raised (``_OrbaxReportsDropped``). An orbax
    operation that fails closes orbax's asyncio loop at its first error while tensorstore's threads go on
    with the reads and writes under way: their done-callbacks then call the closed loop ("Event loop is
    closed", a traceback each through ``sys.unraisablehook``: 0 to 31 a failed read of a damaged folder, as
    measured), and asyncio logs the tasks whose errors nobody awaited ("Task exception was never
    retrieved", naming the folder), some after the error has reached the caller, who names it in one line."""
    quiet = _OrbaxReportsDropped(str(folder))
    yield  # the block's error propagates from here, and the filter and the hook stay
    quiet.remove()


def read_error_reason(e: BaseException) -> str:
    """What a failed orbax read found wrong, in one line: the error's first line without the specs that
    tensorstore's errors end with (``[tensorstore_spec='{...}']``, a JSON context of 1,000 characters or
    more each); a JSON error (a garbled ``_METADATA``, whose message names no file) says so. A reason that
    starts with one of ``DAMAGED_DATA`` is damaged data files'."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, json.JSONDecodeError):
        return f"a metadata file of orbax's is not JSON: {text}"
    return re.sub(r" ?\[tensorstore_spec(\[\d+\])?='[^']*'\]", "", text)


# tensorstore's codes for data files whose bytes are not what their b-tree says (cut short, overwritten)
DAMAGED_DATA = ("OUT_OF_RANGE: ", "DATA_LOSS: ")


def write_error_reason(e: BaseException) -> str:
    """The cause of a failed write as the OS names it (``os.strerror``): an OSError's, or the
    ``os_error_code`` in tensorstore's message (orbax raises tensorstore's errors as ValueError); else the
    error's first line (at most 300 characters)."""
    if isinstance(e, OSError) and e.errno:
        return e.strerror or os.strerror(e.errno)
    text = str(e)
    if m := re.search(r"os_error_code='?(\d+)", text):
        return os.strerror(int(m.group(1)))
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


def _then_resume(reason: str, steps: list[int]) -> str:
    """What the user does after a failed write: free space (a full disk or quota), then --resume."""
    fix = "free some space" if reason in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT)) else "fix that"
    where = f"from the checkpoint of step {steps[-1]}" if steps else "from step 0"
    return f"{fix}, then the same command with --resume continues {where}"


def saved_steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints in ``directory`` (orbax names them by step; a checkpoint still
    being written sits in a temporary folder with another name)."""
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []
