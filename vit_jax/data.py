"""The JAX twin's input pipeline: grain over ``vit_common.data.datasets``, scaling with worker processes.

A training pipeline is a grain ``MapDataset`` of batches, each a pure function of (seed, batch index)
(``vit_common.data.datasets``: ``TrainPlan`` -> ``LoadExample`` -> batch -> ``FinishTrainBatch``):

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
``hf:PATH`` and ``arrayrecord:PATTERN`` sources are read a row or record at a time in the workers)::

    data = load_dataset("imagefolder:photos", (224, 224), 3)
    it = train_iterator(data, batch_size=256, epochs=10, seed=0, preprocess=PRESETS["imagenet"],
                        augment=Augment(crop_scale=0.08, flip=True), workers=8)
    for batch in it:   # image float32 [B, H, W, C], label int32 [B], target float32 [B, K], mask float32 [B]
        ...
"""

from __future__ import annotations

import concurrent.futures

import grain
import numpy as np

from vit_common.data.datasets import (
    Augment,
    Dataset,
    EvalBatches,
    FinishTrainBatch,
    ImageTransform,
    LoadExample,
    TrainPlan,
    process_rows,
)
from vit_common.data.images import Preprocess


def transform_for(data: Dataset, preprocess: Preprocess, augment: Augment | None = None) -> ImageTransform:
    """The ``ImageTransform`` taking ``data``'s examples to its image size and channels."""
    return ImageTransform(data.image_size, data.channels, preprocess, augment)


def train_batches(
    source,
    num_classes: int,
    *,
    batch_size: int,
    epochs: int,
    seed: int,
    transform: ImageTransform,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.MapDataset:
    """Training batches for ``epochs`` epochs: ``epochs * ceil(N / B)`` batches of this process's B / P
    rows, each a dict

    image float32 [B/P, H, W, C] (``transform``, then normalised with its preprocessing), label int32,
    target float32 [B/P, K] (one-hot, mixed by mixup or cutmix, zero on padding), mask float32 (1 for
    real examples, 0 for the padding of each epoch's last batch). Epoch e is a fresh permutation seeded
    by (``seed``, e); see ``vit_common.data.datasets.TrainPlan`` for how rows are shared among processes.

    A process's rows equal the same rows of a one-process run: augmentation is drawn per example from
    its global position, and mixup / cutmix pair images across the whole global batch, so with them on
    every process reads the whole batch and keeps its rows.

    Raises:
        ValueError: an empty source, or ``process_count`` not dividing ``batch_size``.
    """
    augment = transform.augment or Augment()
    mixing = bool(augment.mixup or augment.cutmix) and process_count > 1
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
    transform: ImageTransform,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.MapDataset:
    """One pass over ``source`` in order, unaugmented, last batch padded (same dict as training); this
    process's rows of every batch (``vit_common.data.datasets.EvalBatches``)."""
    batches = EvalBatches(
        source, num_classes, batch_size, transform, process_index=process_index, process_count=process_count
    )
    return grain.MapDataset.source(batches)


class BatchIterator:
    """Batches of a pipeline from ``start`` on; ``position`` is the index of the next batch (what a resumed
    run passes as ``start``). Batches made by worker processes arrive in shared memory and are copied
    out, so the shared memory is released as soon as the batch is taken. ``close()`` (or leaving a
    ``with`` block) stops the workers.
    """

    def __init__(self, ds: grain.MapDataset, start: int, workers: int, threads: int, prefetch: int):
        it = ds[start:].to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch))
        if workers:
            _absl_flags_parsed()
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2))
        self._it, self._copy, self.position = iter(it), bool(workers), start
        self._first: concurrent.futures.Future | None = None

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> dict:
        if self._first is not None:  # taken by start_prefetch's thread
            first, self._first = self._first, None
            batch = first.result()
        else:
            batch = next(self._it)
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
) -> BatchIterator:
    """Training batches of ``data`` (``train_batches``), run by ``iterate``: the batch iterator of
    ``vit train``, for custom training loops. Resume a loop by passing the number of batches it has
    consumed as ``start``."""
    ds = train_batches(
        data.train,
        data.num_classes,
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
        transform=transform_for(data, preprocess, augment),
        process_index=process_index,
        process_count=process_count,
    )
    return iterate(ds, start=start, workers=workers)
