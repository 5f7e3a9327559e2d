"""Training augmentation and the per-example image transform (numpy + Pillow, no framework).

``Augment`` holds the augmentation's settings (a random-resized crop, or shifts, rotations and zooms; a
flip; mixup or cutmix per batch); ``ImageTransform`` turns one example's image (a file path, encoded
bytes or an array) into uint8 [H, W, C] at the model's size, through ``vit_common.data.images``. Every
draw comes from a generator the caller seeds by (seed, position) (``vit_common.data.batches``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vit_common.data.datasets import natural_images
from vit_common.data.images import (
    Preprocess,
    decode_image,
    eval_resize_crop,
    from_array,
    open_image,
    random_resized_crop,
    to_array,
    to_channels,
)
from vit_common.system.validate import Range, check_fields


def _affine(x: np.ndarray, angle: float, zoom: float, dy: int, dx: int) -> np.ndarray:
    """Rotate by ``angle`` radians and zoom by ``zoom`` about the centre, then move by (dy, dx) pixels.

    uint8 [H, W, C] -> uint8 [H, W, C]; Pillow maps each output pixel back to the input, so its
    coefficients are the inverse transform.
    """
    from PIL import Image

    h, w, c = x.shape
    cy, cx = (h - 1) / 2, (w - 1) / 2
    cos, sin = np.cos(angle) / zoom, np.sin(angle) / zoom
    # input = R(-angle) / zoom @ (output - centre - shift) + centre
    ox, oy = cx + dx, cy + dy
    coeffs = (cos, sin, cx - cos * ox - sin * oy, -sin, cos, cy + sin * ox - cos * oy)
    out = np.asarray(
        from_array(x).transform((w, h), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR, fillcolor=0)
    )
    return out.reshape(h, w, c)


@dataclass(frozen=True)
class Augment:
    """Training augmentation. Per example: a random-resized crop, or shifts, rotations and zooms; a
    flip. Per batch: mixup or cutmix. Every draw comes from a generator seeded by (seed, position).

    crop_scale: random-resized crop (Inception / ImageNet style) of area fraction in [crop_scale, 1]
        and aspect ratio in [3/4, 4/3], resized to the model's size (``images.random_resized_crop``);
        0 = off (the evaluation resize and crop instead).
    shift: random translation by an integer in [-shift, shift] pixels per axis.
    rotate: random rotation by an angle in [-rotate, rotate] degrees about the image centre.
    scale: random zoom by a factor in [1 - scale, 1 + scale] about the image centre.
    flip: horizontal flip with probability 1/2 (natural images; not digits).
    mixup / cutmix: Beta(alpha, alpha) mixing of image pairs within a batch (0 = off; with both on,
        each batch uses one of them with probability 1/2), each image with the one at the mirrored
        position, the CutMix box as timm's (``cutmix_box``). Targets are mixed in the same proportion.
    Pixels moved in from outside the image are 0. Shifts alone move whole pixels (exact); with a
    rotation or zoom the image is resampled bilinearly (Pillow affine transform).

    Raises:
        ValueError: a value outside its field's range (NaN and infinities included), named.
    """

    crop_scale: float = field(
        default=0.0,
        metadata={
            "help": "augmentation: random-resized crop of area fraction in [this, 1], aspect 3/4..4/3; 0 = off",
            "range": Range(0, 1),
        },
    )
    shift: int = field(
        default=0,
        metadata={"help": "augmentation: random translation up to this many pixels", "range": Range(0, integer=True)},
    )
    rotate: float = field(
        default=0.0, metadata={"help": "augmentation: random rotation up to this many degrees", "range": Range(0, 180)}
    )
    scale: float = field(
        default=0.0,
        metadata={"help": "augmentation: random zoom by 1 +- this fraction", "range": Range(0, 1, hi_open=True)},
    )
    flip: bool = field(default=False, metadata={"help": "augmentation: random horizontal flips"})
    mixup: float = field(
        default=0.0, metadata={"help": "augmentation: mixup Beta(alpha, alpha); 0 = off", "range": Range(0)}
    )
    cutmix: float = field(
        default=0.0, metadata={"help": "augmentation: cutmix Beta(alpha, alpha); 0 = off", "range": Range(0)}
    )

    def __post_init__(self):
        check_fields(self)

    @classmethod
    def default_for(cls, spec: str) -> Augment:
        """The augmentation ``vit train`` uses for a dataset spec unless told otherwise: random-resized
        crops and flips for photos read from files (``natural_images``), shifts of up to 2 pixels
        otherwise (digits)."""
        return cls(crop_scale=0.08, flip=True) if natural_images(spec) else cls(shift=2)

    def image(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Shift, rotate, zoom and flip one uint8 [H, W, C] image (the crop is ``ImageTransform``'s)."""
        h, w = x.shape[:2]
        s = self.shift
        dy, dx = (int(v) for v in rng.integers(-s, s + 1, size=2))
        if self.rotate or self.scale:
            angle = np.deg2rad(rng.uniform(-self.rotate, self.rotate))
            zoom = rng.uniform(1 - self.scale, 1 + self.scale)
            x = _affine(x, angle, zoom, dy, dx)
        elif s:
            x = np.pad(x, ((s, s), (s, s), (0, 0)))[s - dy : s - dy + h, s - dx : s - dx + w]
        if self.flip and rng.random() < 0.5:
            x = x[:, ::-1]
        return np.ascontiguousarray(x)

    def mix(self, image: np.ndarray, target: np.ndarray, n: int, rng: np.random.Generator):
        """Mix the first ``n`` (real) rows of images [B, H, W, C] and targets [B, K] among themselves, as
        timm's ``Mixup`` does in its 'batch' mode: each row with the row at the mirrored position (timm's
        ``x.flip(0)``), one lambda ~ Beta(alpha, alpha) for the batch; CutMix pastes timm's box
        (``cutmix_box``: a uniform centre, clipped at the border, lambda corrected to the pasted area)."""
        use = [(k, a) for k, a in (("mixup", self.mixup), ("cutmix", self.cutmix)) if a > 0]
        if not use or n < 2:
            return image, target
        kind, alpha = use[rng.integers(len(use))]
        lam = float(rng.beta(alpha, alpha))
        partner = np.arange(n)[::-1]
        image, target = image.copy(), target.copy()
        if kind == "mixup":
            image[:n] = lam * image[:n] + (1 - lam) * image[partner]
        else:  # paste the partner's box (Yun et al. 2019, as timm draws it)
            h, w = image.shape[1:3]
            (yl, yh, xl, xh), lam = cutmix_box(h, w, lam, int(rng.integers(0, h)), int(rng.integers(0, w)))
            image[:n, yl:yh, xl:xh] = image[partner, yl:yh, xl:xh]
        target[:n] = lam * target[:n] + (1 - lam) * target[partner]
        return image, target


def cutmix_box(h: int, w: int, lam: float, cy: int, cx: int) -> tuple[tuple[int, int, int, int], float]:
    """((y_low, y_high, x_low, x_high), corrected lambda) of a CutMix box for an H x W image: sides
    ``int(H * sqrt(1 - lam))`` and ``int(W * sqrt(1 - lam))`` about the centre (``cy``, ``cx``) (drawn
    uniformly over the image), clipped at the border, lambda = 1 - the pasted area / (H * W). timm 1.0.31
    ``data/mixup.py`` ``rand_bbox`` + ``cutmix_bbox_and_lam(correct_lam=True)`` (the CutMix authors'
    box too): at alpha 1 it pastes about 0.31 of the image on average, where a box kept inside the image
    pastes 0.5."""
    r = np.sqrt(1.0 - lam)
    ch, cw = int(h * r), int(w * r)
    yl, yh = int(np.clip(cy - ch // 2, 0, h)), int(np.clip(cy + (ch + 1) // 2, 0, h))
    xl, xh = int(np.clip(cx - cw // 2, 0, w)), int(np.clip(cx + (cw + 1) // 2, 0, w))
    return (yl, yh, xl, xh), 1.0 - (yh - yl) * (xh - xl) / float(h * w)


class ImageTransform:
    """One example's image -> uint8 [H, W, C] at the model's size and channels.

    The image is a file path (decoded by ``images.open_image``), encoded file bytes (a stored
    dataset's record, ``images.decode_image``) or a uint8 array. Evaluation
    (``augment`` None): ``images.eval_resize_crop`` with ``preprocess``. Training: the random-resized
    crop if ``augment.crop_scale`` (else the evaluation geometry), then ``Augment.image``.
    """

    def __init__(self, size: tuple[int, int], channels: int, preprocess: Preprocess, augment: Augment | None = None):
        self.size, self.channels, self.preprocess, self.augment = tuple(size), channels, preprocess, augment

    def __call__(self, image: str | bytes | np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        if isinstance(image, np.ndarray):
            fits = image.shape == (*self.size, self.channels)
            if fits and (self.augment is None or not self.augment.crop_scale):
                return image if self.augment is None else self.augment.image(image, rng)
            im = to_channels(from_array(image), self.channels)
        elif isinstance(image, bytes):
            im = to_channels(decode_image(image), self.channels)
        else:
            im = to_channels(open_image(image), self.channels)
        if self.augment is not None and self.augment.crop_scale:
            im = random_resized_crop(
                im, self.size, rng, scale=(self.augment.crop_scale, 1.0), interpolation=self.preprocess.interpolation
            )
        else:
            im = eval_resize_crop(im, self.size, self.preprocess)
        x = to_array(im, self.channels)
        return x if self.augment is None else self.augment.image(x, rng)
