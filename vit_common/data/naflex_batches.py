"""NaFlex training and evaluation batches (numpy, no framework): each image keeps its aspect ratio, at
most ``Preprocess.max_patches`` patches, every batch padded to that many so that a jitted step sees one
shape.

The pieces mirror ``vit_common.data.batches``'s, and that module's ``TrainPlan`` says which example fills
which row: ``NaFlexTransform`` turns one image into its patches (``vit_common.naflex.preprocess``, with
training augmentation), ``LoadNaFlexExample`` reads and pads one plan entry, ``FinishNaFlexBatch`` makes
the model's batch of the stacked rows, and ``NaFlexPaddedBatches`` is one ordered pass over a test set. A
batch is a dict:

- ``image`` float32 [B, N, P*P*C]: the patches (``vit_common.naflex``), N = max_patches;
- ``patch_mask`` bool [B, N], ``spatial_shapes`` int32 [B, 2]: each image's patches and grid (h, w);
- ``position_weights`` float32 [B, N, Gh*Gw]: ``vit_common.naflex.position_weights`` of the model's
  table, computed here on the host, so that the model takes no host constant and compiles once;
- ``label`` int32 [B], ``target`` float32 [B, K] (one-hot, zero on padding), ``mask`` float32 [B].

A padding row (an epoch's last batch, ``mask`` 0) is one zero patch of a 1x1 grid: no row is all padding,
so no softmax of the model is over nothing.
"""

from __future__ import annotations

import numpy as np

from vit_common.config import ViTConfig
from vit_common.data.augment import Augment, random_crop_box
from vit_common.data.batches import EvalBatches, example_rng, read_example
from vit_common.data.images import Preprocess, as_image, normalize, to_array, to_channels
from vit_common.naflex import patchify, position_weights, resize


class NaFlexTransform:
    """One example's image (a file path, encoded bytes or a uint8 array) -> (patches [h*w, P*P*C] float32,
    (h, w)) for a model of ``cfg`` (square patches of ``cfg.patch_size[0]``) at most
    ``preprocess.max_patches`` patches. Evaluation (``augment`` None): ``vit_common.naflex.preprocess``
    bit for bit. Training: with ``augment.crop_scale`` a random crop first (``random_crop_box``, area in
    [crop_scale, 1], aspect 3/4..4/3), whose own aspect ratio the resize then keeps; after the resize
    ``Augment.image`` (shift, rotation, zoom, flip) on the uint8 pixels.

    Raises:
        ValueError: a preprocessing without max_patches; mixup or cutmix (a NaFlex batch's images have
            grids of their own: nothing to mix pixel for pixel).
    """

    def __init__(self, cfg: ViTConfig, preprocess: Preprocess, augment: Augment | None = None):
        if preprocess.max_patches is None:
            raise ValueError("a NaFlex transform without max_patches: expected a NaFlex preprocessing")
        if augment is not None and augment.mixes:
            raise ValueError(
                f"mixup={augment.mixup}, cutmix={augment.cutmix}, cutmix_minmax={augment.cutmix_minmax} with a "
                "NaFlex model: its images have grids of their own, nothing to mix; expected none"
            )
        self.patch, self.channels, self.max_patches = cfg.patch_size[0], cfg.in_chans, preprocess.max_patches
        self.grid, self.method = cfg.grid, cfg.posemb_resample
        self.preprocess, self.augment = preprocess, augment

    def __call__(self, image, rng: np.random.Generator | None = None) -> tuple[np.ndarray, tuple[int, int]]:
        image = to_channels(as_image(image), self.channels)
        aug = self.augment
        if aug is not None and aug.crop_scale:
            image = image.crop(random_crop_box(image.size, rng, (aug.crop_scale, 1.0), (3 / 4, 4 / 3)))
        image = resize(image, self.patch, self.max_patches, self.preprocess.interpolation)
        x = to_array(image, self.channels)  # uint8 [H, W, C]
        if aug is not None:
            x = aug.image(x, rng)
        grid = (x.shape[0] // self.patch, x.shape[1] // self.patch)
        return patchify(normalize(x, self.preprocess), (self.patch, self.patch)), grid

    def row(self, patches: np.ndarray | None, grid: tuple[int, int] = (1, 1)) -> dict:
        """One padded row: {"image" [N, P*P*C], "patch_mask" [N], "spatial_shapes" [2]}; ``patches`` None:
        a padding row (one zero patch, grid 1x1)."""
        dim = self.patch * self.patch * self.channels
        patches = np.zeros((1, dim), np.float32) if patches is None else patches
        image = np.zeros((self.max_patches, dim), np.float32)
        image[: len(patches)] = patches
        mask = np.arange(self.max_patches) < len(patches)
        return {"image": image, "patch_mask": mask, "spatial_shapes": np.array(grid, np.int32)}


class LoadNaFlexExample:
    """A ``TrainPlan`` entry -> ``NaFlexTransform.row`` of its example (a padding row for index -1) with
    "label", "mask" and "position"; the augmentation's generator is ``example_rng`` of the position."""

    def __init__(self, source, transform: NaFlexTransform, seed: int):
        self.source, self.transform, self.seed = source, transform, seed

    def __call__(self, entry: dict) -> dict:
        position = np.int64(entry["position"])
        if entry["index"] < 0:
            return {**self.transform.row(None), "label": np.int32(0), "mask": np.float32(0.0), "position": position}
        rng = example_rng(self.seed, int(position))
        (patches, grid), label = read_example(self.source, entry["index"], self.transform, rng)
        row = self.transform.row(patches, grid)
        return {**row, "label": np.int32(label), "mask": np.float32(1.0), "position": position}


class FinishNaFlexBatch:
    """Stacked rows (``LoadNaFlexExample``'s) -> the model's batch (the module docstring's dict)."""

    def __init__(self, num_classes: int, transform: NaFlexTransform):
        self.num_classes, self.transform = num_classes, transform

    def __call__(self, batch: dict) -> dict:
        mask = np.asarray(batch["mask"], np.float32)
        label = np.asarray(batch["label"], np.int32)
        shapes = np.asarray(batch["spatial_shapes"], np.int32)
        t = self.transform
        weights = position_weights(t.grid, shapes, t.max_patches, t.method).astype(np.float32)
        return {
            "image": np.asarray(batch["image"], np.float32),
            "patch_mask": np.asarray(batch["patch_mask"], bool),
            "spatial_shapes": shapes,
            "position_weights": weights,
            "label": label,
            "target": np.eye(self.num_classes, dtype=np.float32)[label] * mask[:, None],
            "mask": mask,
        }


class NaFlexPaddedBatches(EvalBatches):
    """One pass over ``source`` in order, unaugmented, in batches of B, the last one padded (mask 0): a
    sequence of ``FinishNaFlexBatch`` dicts, as ``vit_common.data.batches.EvalBatches`` (process p of P
    gets rows [p * B/P, (p + 1) * B/P) of every batch).

    Raises:
        ValueError: an empty source, a batch size < 1, or P not dividing B.
    """

    def __init__(self, source, num_classes: int, batch_size: int, transform: NaFlexTransform, **processes):
        super().__init__(source, num_classes, batch_size, transform, **processes)
        self.finish = FinishNaFlexBatch(num_classes, transform)

    def __getitem__(self, k: int) -> dict:
        if not 0 <= k < len(self):
            raise IndexError(k)
        lo = k * self.batch_size + self.offset
        rows = []
        for i in range(lo, lo + self.rows):
            if i < len(self.source):
                (patches, grid), label = read_example(self.source, i, self.transform)
                rows.append({**self.transform.row(patches, grid), "label": label, "mask": 1.0})
            else:
                rows.append({**self.transform.row(None), "label": 0, "mask": 0.0})
        return self.finish({key: np.stack([np.asarray(r[key]) for r in rows]) for key in rows[0]})
