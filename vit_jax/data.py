"""The JAX twin's input pipeline: grain over ``vit_common.data.batches``, scaling with worker processes.

A training pipeline is a grain ``MapDataset`` of batches, each a pure function of (seed, batch index)
(``vit_common.data.batches``: ``TrainPlan`` -> ``LoadExample`` -> batch -> ``FinishTrainBatch``):

    plan     which example fills each row of this process's share of each global batch (``TrainPlan``;
             ``process_index`` / ``process_count`` select the share, so every process decodes only its
             own rows)
    load     decode, crop and augment one example (``ImageTransform``), its randomness seeded by its
             global position
    batch    stack B / P examples
    finish   mixup / cutmix (over the whole global batch), normalisation, one-hot targets, mask

``iterate`` runs it: with ``workers`` > 0 grain's ``mp_prefetch`` hands whole batches to worker
processes round-robin, so decoding and augmenting run on as many cores as there are workers, and the
batches come out in the same order with the same values whatever the worker count. The position of a
run in its data is the index of its next batch (``iterate(ds, start=...)``), which is all a resumed run
needs.

For your own training loop, ``train_iterator`` builds and runs the whole thing (any dataset spec:
``hf:PATH``, ``arrayrecord:PATTERN`` and ``tfds:PATH`` sources are read a row or record at a time in the workers)::

    data = load_dataset("imagefolder:photos", (224, 224), 3)
    it = train_iterator(data, batch_size=256, epochs=10, seed=0, preprocess=PRESETS["imagenet"],
                        augment=Augment(crop_scale=0.08, flip=True), workers=8)
    for batch in it:   # image float32 [B, H, W, C], label int32 [B], target float32 [B, K], mask float32 [B]
        ...
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import multiprocessing.util
import os
import re
import select
import signal
import sys
import threading

import numpy as np

from vit_common.config import ViTConfig
from vit_common.data.augment import Augment, ImageTransform
from vit_common.data.batches import EvalBatches, FinishTrainBatch, LoadExample, TrainPlan, process_rows
from vit_common.data.datasets import Dataset
from vit_common.data.images import Preprocess
from vit_common.data.naflex_batches import FinishNaFlexBatch, LoadNaFlexExample, NaFlexPaddedBatches, NaFlexTransform
from vit_common.system.imports import gc_paused

with gc_paused():  # grain imports its Parquet source with Python's import replaced (that module says why)
    import grain


def transform_for(
    data: Dataset, preprocess: Preprocess, augment: Augment | None = None, cfg: ViTConfig | None = None
) -> ImageTransform | NaFlexTransform:
    """The ``ImageTransform`` taking ``data``'s examples to its image size and channels; for a NaFlex
    ``preprocess`` (``max_patches`` set) the ``NaFlexTransform`` of the model ``cfg`` instead (each image
    at its own aspect ratio, at most ``max_patches`` patches of the model's patch size).

    Raises:
        ValueError: a NaFlex ``preprocess`` without ``cfg``; what ``NaFlexTransform`` refuses.
    """
    if preprocess.max_patches is None:
        return ImageTransform(data.image_size, data.channels, preprocess, augment)
    if cfg is None:
        raise ValueError(
            f"max_patches={preprocess.max_patches} (a NaFlex preprocessing) without the model's ViTConfig: "
            "expected cfg=, whose patch size and position table make the patches"
        )
    return NaFlexTransform(cfg, preprocess, augment)


def train_batches(
    source,
    num_classes: int,
    *,
    batch_size: int,
    epochs: int,
    seed: int,
    transform: ImageTransform | NaFlexTransform,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.MapDataset:
    """Training batches for ``epochs`` epochs: ``epochs * ceil(N / B)`` batches of this process's B / P
    rows, each a dict

    image float32 [B/P, H, W, C] (``transform``, then normalised with its preprocessing), label int32,
    target float32 [B/P, K] (one-hot, mixed by mixup or cutmix, zero on padding), mask float32 (1 for
    real examples, 0 for the padding of each epoch's last batch). Epoch e is a fresh permutation seeded
    by (``seed``, e); see ``vit_common.data.batches.TrainPlan`` for how rows are shared among processes.

    A process's rows equal the same rows of a one-process run: augmentation is drawn per example from
    its global position, and mixup / cutmix pair images across the whole global batch, so with them on
    every process reads the whole batch and keeps its rows.

    A ``NaFlexTransform`` makes NaFlex batches instead (``vit_common.data.naflex_batches``: "image" the
    patches float32 [B/P, N, P*P*C], with "patch_mask", "spatial_shapes" and "position_weights").

    Raises:
        ValueError: an empty source, or ``process_count`` not dividing ``batch_size``.
    """
    if isinstance(transform, NaFlexTransform):
        plan = TrainPlan(
            len(source), batch_size, epochs, seed, process_index=process_index, process_count=process_count
        )
        return (
            grain.MapDataset.source(plan)
            .map(LoadNaFlexExample(source, transform, seed))
            .batch(plan.rows)
            .map(FinishNaFlexBatch(num_classes, transform))
        )
    augment = transform.augment or Augment()
    mixing = augment.mixes and process_count > 1
    plan = TrainPlan(
        len(source),
        batch_size,
        epochs,
        seed,
        process_index=0 if mixing else process_index,
        process_count=1 if mixing else process_count,
    )
    rows = process_rows(batch_size, process_index, process_count)
    keep = (process_index * rows, (process_index + 1) * rows) if mixing else None
    return (
        grain.MapDataset.source(plan)
        .map(LoadExample(source, transform, seed))
        .batch(plan.rows)
        .map(FinishTrainBatch(num_classes, transform.preprocess, augment, plan, keep))
    )


def eval_batches(
    source,
    num_classes: int,
    *,
    batch_size: int,
    transform: ImageTransform | NaFlexTransform,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.MapDataset:
    """One pass over ``source`` in order, unaugmented, last batch padded (same dict as training); this
    process's rows of every batch (``vit_common.data.batches.EvalBatches``, or with a ``NaFlexTransform``
    ``vit_common.data.naflex_batches.NaFlexPaddedBatches``)."""
    kind = NaFlexPaddedBatches if isinstance(transform, NaFlexTransform) else EvalBatches
    batches = kind(source, num_classes, batch_size, transform, process_index=process_index, process_count=process_count)
    return grain.MapDataset.source(batches)


class DataWorkerError(RuntimeError):
    """A worker process of the input pipeline ended while the run needed it (killed by the OOM killer,
    say); the message names its exit code."""


class _WorkerInit:
    """grain's ``worker_init_fn``: ties a worker process to its parent.

    A worker ignores SIGINT, SIGTERM and SIGHUP (a terminal's Ctrl-C and hang-up reach every process
    of its group, and SLURM signals every process of a job step): the parent decides when to stop and
    closes its workers. A daemon thread waits for the parent's end (a Linux pidfd: the kernel reports
    the exit, SIGKILL included) and ends the worker at once, where ``prctl(PR_SET_PDEATHSIG)`` would
    fire when the *thread* that started the worker ends, and grain starts workers from a thread pool.
    """

    def __init__(self, parent: int):
        self.parent = parent

    def __call__(self, index: int, count: int) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        threading.Thread(target=self._watch, name="vit-parent-watch", daemon=True).start()

    def _watch(self) -> None:
        try:
            fd = os.pidfd_open(self.parent)
        except ProcessLookupError:  # the parent is gone already
            os._exit(0)
        if os.getppid() != self.parent:  # it ended (and its pid was reused) before the pidfd was open
            os._exit(0)
        select.select([fd], [], [])  # readable once the parent has ended
        os._exit(0)


_WORKER_DIED = re.compile(r"Worker process was terminated unexpectedly with exit code (-?\d+)")


def _worker_death(e: RuntimeError, workers: set, ended: set) -> DataWorkerError | None:
    """The ``DataWorkerError`` for grain's report of a dead worker (its exit code: -N for signal N), else
    None; it names the pid of each of ``workers`` (``multiprocessing.Process``) that ended with that code,
    or where none did (a worker that died before the first batch) of each pid in ``_ENDED`` but not in
    ``ended`` (those noted before the iterator began) that did."""
    found = _WORKER_DIED.search(str(e))
    if found is None:
        return None
    code = int(found.group(1))
    pids = {p.pid for p in workers if p.exitcode == code} or {p for p, c in _ENDED.items() if c == code} - ended
    who = f" (pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, sorted(pids)))})" if pids else ""
    how = f"{who} was killed by {signal.Signals(-code).name}" if code < 0 else f"{who} exited with code {code}"
    if code == -signal.SIGKILL:
        how += " (what the kernel's OOM killer sends when memory runs out)"
    if code > 0:
        how += ' (its error is printed above; a script needs its code under `if __name__ == "__main__":`)'
    return DataWorkerError(f"a data worker process{how}")


# Exit codes of worker processes that ended, by pid, noted at their end by _drain (grain reaps a dead worker
# before reporting it, and a worker that died before the first batch was not yet known to its iterator).
_ENDED: dict[int, int] = {}


def _read_out_dead_spawns() -> None:
    """Make a worker that dies while it is being started an error instead of a hang.

    multiprocessing's spawn writes a new process's start-up data (grain's pickled pipeline, the
    dataset's arrays with it) into a pipe whose reading end the parent itself keeps open until the
    write is done, so a child killed before reading it all leaves that write blocked for ever, and
    grain's start of the worker with it (CPython gh-118981). This wraps
    ``multiprocessing.util.spawnv_passfds``: a daemon thread per spawned worker waits for its end (a
    pidfd), notes its exit code in ``_ENDED`` and reads what is left of its start-up data, so that the
    write completes; grain then finds the dead worker as it finds any other (its exit code). Installed
    once; other spawns (the resource tracker's) are left alone.
    """
    spawn = multiprocessing.util.spawnv_passfds
    if getattr(spawn, "drains", False):
        return

    def spawnv_passfds(path, args, passfds):
        pid = spawn(path, args, passfds)
        named = re.search(r"pipe_handle=(\d+)", " ".join(map(str, args)))
        if "--multiprocessing-fork" in args and named:
            reader = os.dup(int(named.group(1)))  # the stdlib closes its own after the write
            threading.Thread(target=_drain, args=(pid, reader), name="vit-spawn-drain", daemon=True).start()
        return pid

    spawnv_passfds.drains = True
    multiprocessing.util.spawnv_passfds = spawnv_passfds


def _drain(pid: int, reader: int) -> None:
    """Wait for worker ``pid``'s end, note its exit code, then read its start-up pipe until every writer
    has closed it (the parent's end closes with its ``Popen``)."""
    try:
        ended = os.pidfd_open(pid)
    except ProcessLookupError:  # reaped already
        ended = None
    if ended is not None:
        select.select([ended], [], [])
        try:
            dead = os.waitid(os.P_PIDFD, ended, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped meanwhile
            dead = None
        os.close(ended)
        if dead is not None:
            killed = dead.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            _ENDED[pid] = -dead.si_status if killed else dead.si_status
    with contextlib.suppress(OSError):
        while os.read(reader, 1 << 16):
            pass
    os.close(reader)


# grain starts its worker processes with multiprocessing's "spawn", which imports the main script again in
# each worker (as "__mp_main__"): a script whose batch loop is not under the __main__ guard starts it there,
# while the worker is still bootstrapping (multiprocessing.spawn._check_not_importing_main's test).
UNGUARDED_SCRIPT = (
    "vit_jax.data: a data worker process is importing your script again and reached its batch loop: put the "
    "script's code under `if __name__ == \"__main__\":` (grain starts workers with multiprocessing's spawn, "
    "which imports the main module in each worker), or pass workers=0"
)


class BatchIterator:
    """Batches of a pipeline from ``start`` on; ``position`` is the index of the next batch (what a resumed
    run passes as ``start``). Batches made by worker processes arrive in shared memory and are copied
    out, so the shared memory is released as soon as the batch is taken. ``close()`` (or leaving a
    ``with`` block) stops the workers; they also end with this process, however it ends (``_WorkerInit``).

    Raises (from ``next``):
        DataWorkerError: a worker process died.
    """

    def __init__(self, ds: grain.MapDataset, start: int, workers: int, threads: int, prefetch: int):
        if workers and getattr(multiprocessing.current_process(), "_inheriting", False):  # the stdlib's own test
            raise SystemExit(UNGUARDED_SCRIPT)  # one line from each worker instead of ~120 tracebacks
        it = ds[start:].to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch))
        if workers:
            _absl_flags_parsed()
            _quiet_resource_tracker()
            _read_out_dead_spawns()
            it = it.mp_prefetch(
                grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2),
                worker_init_fn=_WorkerInit(os.getpid()),
            )
        self._it, self._copy, self.position = iter(it), bool(workers), start
        self._count, self._workers = workers, set()  # grain starts them at the first requests
        self._others, self._ended = set(multiprocessing.active_children()), set(_ENDED)
        self._first: concurrent.futures.Future | None = None

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> dict:
        try:
            if self._first is not None:  # taken by start_prefetch's thread
                first, self._first = self._first, None
                batch = first.result()
            else:
                batch = next(self._it)
        except RuntimeError as e:
            died = _worker_death(e, self._workers, self._ended)
            if died is None:
                raise
            raise died from None
        if len(self._workers) < self._count:  # known by pid once started, so that a death names its pid
            self._workers.update(set(multiprocessing.active_children()) - self._others)
        self.position += 1
        return {k: np.array(v) for k, v in batch.items()} if self._copy else batch

    def start_prefetch(self) -> None:
        """Take the next batch now, on a background thread, instead of at the next ``next``: the worker
        processes start (grain starts them at the first request) and the batch is made while the caller
        does something else (builds the model, compiles the step). That ``next`` returns it, or raises
        what taking it raised. Calling it again before that ``next`` does nothing."""
        if self._first is None:
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="vit-first-batch")
            self._first = pool.submit(next, self._it)
            pool.shutdown(wait=False)  # its thread ends when this one task is done

    def close(self) -> None:
        if self._first is not None:  # let the thread finish with the iterator before closing it
            concurrent.futures.wait([self._first])
            self._first = None
        close = getattr(self._it, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> BatchIterator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def iterate(
    ds: grain.MapDataset, *, start: int = 0, workers: int = 0, threads: int = 2, prefetch: int = 4
) -> BatchIterator:
    """A ``BatchIterator`` over ``ds`` from batch ``start`` on.

    ``workers`` > 0: that many worker processes (grain ``mp_prefetch``), each computing whole batches
    with ``threads`` threads; 0: ``threads`` threads in this process. Output is the same either way.

    Raises:
        ValueError: ``start`` outside [0, len(ds)] or a negative worker count.
    """
    if not 0 <= start <= len(ds):
        raise ValueError(f"start={start}: expected a batch index in [0, {len(ds)}]")
    if workers < 0:
        raise ValueError(f"workers={workers}: expected an int >= 0")
    return BatchIterator(ds, start, workers, threads, prefetch)


# Python's resource tracker (multiprocessing.resource_tracker) warns about each shared memory block that
# is still registered when the last process using it ends, and unlinks it.
RESOURCE_TRACKER_WARNING = "ignore::UserWarning:multiprocessing.resource_tracker"


def _quiet_resource_tracker() -> None:
    """Keep the resource tracker from printing "leaked shared_memory objects" for the batches a stopped
    worker had made and not handed over (grain's workers write each batch into shared memory ahead of
    the request; closing them drops those): the tracker still unlinks every such block, which is its
    job, only without the warning. The tracker starts with the first worker and takes its ``-W``
    options from ``sys.warnoptions``, so this must come first."""
    if RESOURCE_TRACKER_WARNING not in sys.warnoptions:
        sys.warnoptions.append(RESOURCE_TRACKER_WARNING)


def _absl_flags_parsed() -> None:
    """grain's ``mp_prefetch`` reads an absl flag, which raises unless absl flags were parsed (programs
    not started by ``absl.app``); mark them parsed, keeping every default (google/grain#1355)."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def train_iterator(
    data: Dataset,
    *,
    batch_size: int,
    epochs: int,
    seed: int,
    preprocess: Preprocess,
    augment: Augment,
    workers: int = 0,
    start: int = 0,
    process_index: int = 0,
    process_count: int = 1,
    cfg: ViTConfig | None = None,
) -> BatchIterator:
    """Training batches of ``data`` (``train_batches``), run by ``iterate``: the batch iterator
    the trainer uses, for custom training loops. Resume a loop by passing the number of batches it has
    consumed as ``start``. A NaFlex ``preprocess`` (``max_patches`` set) needs the model's ``cfg`` and
    makes NaFlex batches (``transform_for``)."""
    ds = train_batches(
        data.train,
        data.num_classes,
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
        transform=transform_for(data, preprocess, augment, cfg),
        process_index=process_index,
        process_count=process_count,
    )
    return iterate(ds, start=start, workers=workers)
