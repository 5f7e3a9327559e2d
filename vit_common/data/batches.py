"""Training and evaluation batches as pure functions of (seed, position) (numpy, no framework).

``TrainPlan`` says which example fills which row of which batch (for one process of several);
``LoadExample`` reads and transforms one example (``vit_common.data.augment.ImageTransform``) with the
generator of its position; ``finish_batch`` / ``FinishTrainBatch`` normalise a batch and mix it
(``Augment.mix``) with the generator of its batch index; ``EvalBatches`` is one ordered pass over a test
set. So a batch is the same whichever process, worker or thread computes it, and a run resumes by batch
index. The JAX twin's grain pipeline (``vit_jax.data``) and the torch-only commands use these same pieces.
"""

from __future__ import annotations

import numpy as np

from vit_common.data.augment import Augment, ImageTransform
from vit_common.data.images import Preprocess, normalize
from vit_common.data.stored_datasets import DataReadError, read_error

_EXAMPLE, _BATCH = 0, 1  # first words of the seeds of per-example and per-batch generators


def batches_per_epoch(n: int, batch_size: int) -> int:
    return -(-n // batch_size)


def check_batch_size(batch_size: int, n: int, dataset: str) -> None:
    """Refuse a batch larger than the ``n`` training images of ``dataset``: every batch would be mostly
    padding (``TrainPlan`` pads each epoch's last batch), which the step computes on for nothing.

    Raises:
        ValueError: ``batch_size`` > ``n``, one line naming both.
    """
    if batch_size > n:
        raise ValueError(
            f"batch_size={batch_size}: expected at most the {n} training images of {dataset} (a larger batch is "
            "padding, computed on for nothing)"
        )


def examples_before(step: int, n: int, batch_size: int) -> int:
    """Real examples (padding excluded) in the first ``step`` batches of epochs of ``n`` examples: each
    epoch's last batch holds only its remainder."""
    spe = batches_per_epoch(n, batch_size)
    return (step // spe) * n + min((step % spe) * batch_size, n)


def example_rng(seed: int, position: int) -> np.random.Generator:
    """The generator of the example at global stream ``position`` (epoch-major, padding included)."""
    return np.random.default_rng((seed, _EXAMPLE, position))


def batch_rng(seed: int, batch: int) -> np.random.Generator:
    """The generator of global batch ``batch``'s mixup / cutmix."""
    return np.random.default_rng((seed, _BATCH, batch))


def process_rows(batch_size: int, process_index: int, process_count: int) -> int:
    """Rows of every global batch one process owns, B / P.

    Raises:
        ValueError: an index outside [0, P), or P not dividing B.
    """
    if process_count < 1 or not 0 <= process_index < process_count or batch_size % process_count:
        raise ValueError(
            f"process {process_index} of {process_count}: expected 0 <= index < count and a count "
            f"dividing batch_size={batch_size}"
        )
    return batch_size // process_count


class TrainPlan:
    """Which example fills each row of each training batch, for one process of ``process_count``.

    The global stream has ``epochs * ceil(N / B)`` batches of B rows. Epoch e visits the N examples in
    a fresh permutation (seeded by (seed, e)); its last batch is padded (example -1, mask 0), so no
    batch crosses an epoch. Process p of P owns rows [p * B/P, (p + 1) * B/P) of every batch: its
    position j (0, 1, ...) is global batch j // (B/P), row p * B/P + j % (B/P). ``plan[j]`` gives
    ``{"index": example or -1, "position": global position b * B + row}``; the position seeds the
    example's augmentation, so it does not depend on P.

    Raises:
        ValueError: B not divisible by P, a process index outside [0, P), an empty set.
    """

    def __init__(
        self, n: int, batch_size: int, epochs: int, seed: int, *, process_index: int = 0, process_count: int = 1
    ):
        if n < 1:
            raise ValueError("the training set is empty")
        self.rows = process_rows(batch_size, process_index, process_count)
        self.n, self.batch_size, self.epochs, self.seed = n, batch_size, epochs, seed
        self.process_index, self.process_count = process_index, process_count
        self.per_epoch = batches_per_epoch(n, batch_size)
        self._epoch, self._perm = -1, np.zeros(0, np.int64)

    @property
    def num_batches(self) -> int:
        return self.epochs * self.per_epoch

    def __len__(self) -> int:
        return self.num_batches * self.rows

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:  # one permutation per epoch, kept while the epoch lasts
            self._epoch, self._perm = epoch, np.random.default_rng((self.seed, epoch)).permutation(self.n)
        return self._perm

    def __getitem__(self, j: int) -> dict:
        batch, r = divmod(int(j), self.rows)
        row = self.process_index * self.rows + r
        epoch, k = divmod(batch, self.per_epoch)
        q = k * self.batch_size + row
        index = int(self.permutation(epoch)[q]) if q < self.n else -1
        return {"index": index, "position": batch * self.batch_size + row}


def read_example(source, i: int, transform: ImageTransform, rng: np.random.Generator | None = None):
    """(image [H, W, C] through ``transform``, uint8 or float32: ``transform.dtype``, label) of example ``i``
    of ``source``.

    Raises:
        DataReadError: the example cannot be read or decoded (a file damaged since the up-front check),
            one line naming where it is stored (the source's ``name(i)``: file, record or row).
    """
    try:
        e = source[i]
        return transform(e["image"], rng), e["label"]
    except DataReadError:
        raise
    except (OSError, RuntimeError, ValueError) as err:
        name = source.name(i) if hasattr(source, "name") else f"example {i}"
        raise read_error(name, err) from None


class LoadExample:
    """A ``TrainPlan`` entry -> {"image" [H, W, C] of ``transform.dtype``, "label", "mask", "position"}
    (padding: zeros)."""

    def __init__(self, source, transform: ImageTransform, seed: int):
        self.source, self.transform, self.seed = source, transform, seed

    def __call__(self, entry: dict) -> dict:
        h, w = self.transform.size
        if entry["index"] < 0:
            return {
                "image": np.zeros((h, w, self.transform.channels), self.transform.dtype),
                "label": np.int32(0),
                "mask": np.float32(0.0),
                "position": np.int64(entry["position"]),
            }
        rng = example_rng(self.seed, entry["position"])
        image, label = read_example(self.source, entry["index"], self.transform, rng)
        return {"image": image, "label": np.int32(label), "mask": np.float32(1.0), "position": entry["position"]}


def finish_batch(
    batch: dict,
    num_classes: int,
    preprocess: Preprocess,
    augment: Augment | None = None,
    rng: np.random.Generator | None = None,
) -> dict:
    """Stacked examples -> the model's batch: image float32 [B, H, W, C] normalised, label int32 [B],
    target float32 [B, K] (one-hot; mixed by mixup/cutmix when ``augment`` asks; zero on padding), mask
    float32 [B]. Mixing pairs the real rows (mask 1) among themselves."""
    mask = np.asarray(batch["mask"], np.float32)
    label = np.asarray(batch["label"], np.int32)
    target = np.eye(num_classes, dtype=np.float32)[label] * mask[:, None]
    image = normalize(batch["image"], preprocess)
    if augment is not None:
        image, target = augment.mix(image, target, int(mask.sum()), rng)
    return {"image": image, "label": label, "target": target, "mask": mask}


class FinishTrainBatch:
    """``finish_batch`` for the rows of a training batch that ``plan`` gives (the mixing generator from
    the batch index); ``keep`` = (lo, hi) then keeps rows [lo, hi) of them."""

    def __init__(
        self,
        num_classes: int,
        preprocess: Preprocess,
        augment: Augment,
        plan: TrainPlan,
        keep: tuple[int, int] | None = None,
    ):
        self.num_classes, self.preprocess, self.augment, self.plan = num_classes, preprocess, augment, plan
        self.keep = keep

    def __call__(self, batch: dict) -> dict:
        b = int(batch["position"][0]) // self.plan.batch_size
        out = finish_batch(batch, self.num_classes, self.preprocess, self.augment, batch_rng(self.plan.seed, b))
        return out if self.keep is None else {k: v[self.keep[0] : self.keep[1]] for k, v in out.items()}


class EvalBatches:
    """One pass over ``source`` in order, unaugmented, in batches of B; the last one padded (mask 0).

    A sequence: ``len()`` batches, ``batches[k]`` is batch k as ``finish_batch`` returns it. Used as it
    is by the torch-only commands and as a grain source by the JAX twin. Process p of P gets rows
    [p * B/P, (p + 1) * B/P) of every batch, as in training.

    Raises:
        ValueError: an empty source, a batch size < 1, or P not dividing B.
    """

    def __init__(
        self,
        source,
        num_classes: int,
        batch_size: int,
        transform: ImageTransform,
        *,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if len(source) == 0:
            raise ValueError("the evaluation set is empty")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: expected an int >= 1")
        self.rows = process_rows(batch_size, process_index, process_count)
        self.source, self.num_classes, self.batch_size, self.transform = source, num_classes, batch_size, transform
        self.offset = process_index * self.rows

    def __len__(self) -> int:
        return batches_per_epoch(len(self.source), self.batch_size)

    def __getitem__(self, k: int) -> dict:
        if not 0 <= k < len(self):
            raise IndexError(k)
        lo = k * self.batch_size + self.offset
        idx = range(lo, min(lo + self.rows, len(self.source)))
        h, w = self.transform.size
        images = np.zeros((self.rows, h, w, self.transform.channels), self.transform.dtype)
        labels = np.zeros(self.rows, np.int32)
        mask = np.zeros(self.rows, np.float32)
        for row, i in enumerate(idx):
            images[row], labels[row] = read_example(self.source, i, self.transform)
            mask[row] = 1.0
        return finish_batch(
            {"image": images, "label": labels, "mask": mask}, self.num_classes, self.transform.preprocess
        )

    def __iter__(self):
        return (self[k] for k in range(len(self)))
