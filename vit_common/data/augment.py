"""Training augmentation and the per-example image transform (numpy + Pillow, no framework).

``Augment`` holds the augmentation's settings (a random-resized crop, or shifts, rotations and zooms; a
flip; mixup or cutmix per batch, pair or image, as timm's ``Mixup``); ``ImageTransform`` turns one
example's image (a file path, encoded bytes or an array) into uint8 [H, W, C] at the model's size,
through ``vit_common.data.images``. Every draw comes from a generator the caller seeds by (seed,
position) (``vit_common.data.batches``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from vit_common.data.datasets import natural_images
from vit_common.data.images import (
    Preprocess,
    _filter,
    _size,
    as_image,
    eval_resize_crop,
    from_array,
    resized_pixels,
)
from vit_common.system.validate import Range, check_fields

MIX_MODES = ("batch", "pair", "elem")  # timm's Mixup modes


def random_resized_crop(
    image,
    size: int | Sequence[int],
    rng: np.random.Generator,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    interpolation: str = "bilinear",
):
    """A random crop of area fraction in ``scale`` and aspect ratio in ``ratio`` (log-uniform), resized
    to ``size`` = (H, W): Inception-style training augmentation.

    The crop is drawn as torchvision's ``RandomResizedCrop.get_params`` draws it (``random_crop_box``),
    and cut and resized by one Pillow ``resize``.
    """
    h, w = _size(size)
    return image.resize((w, h), _filter(interpolation), box=random_crop_box(image.size, rng, scale, ratio))


def random_crop_box(
    image_size: tuple[int, int], rng: np.random.Generator, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """The (left, top, right, bottom) box of ``random_resized_crop`` in an image of ``image_size`` (W, H):
    torchvision's ``RandomResizedCrop.get_params`` (up to 10 tries, then the centre crop of the largest
    allowed aspect ratio)."""
    iw, ih = image_size
    area = iw * ih
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    box = None
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= iw and 0 < ch <= ih:
            top, left = int(rng.integers(0, ih - ch + 1)), int(rng.integers(0, iw - cw + 1))
            box = (left, top, left + cw, top + ch)
            break
    if box is None:  # fallback: centre crop, aspect ratio clamped to the allowed range
        in_ratio = iw / ih
        if in_ratio < ratio[0]:
            cw, ch = iw, int(round(iw / ratio[0]))
        elif in_ratio > ratio[1]:
            cw, ch = int(round(ih * ratio[1])), ih
        else:
            cw, ch = iw, ih
        top, left = (ih - ch) // 2, (iw - cw) // 2
        box = (left, top, left + cw, top + ch)
    return box


def _affine(x: np.ndarray, angle: float, zoom: float, dy: int, dx: int) -> np.ndarray:
    """Rotate by ``angle`` radians and zoom by ``zoom`` about the centre, then move by (dy, dx) pixels.

    uint8 [H, W, C] -> uint8 [H, W, C], or float32 -> float32 (each channel as Pillow 'F'); Pillow maps
    each output pixel back to the input, so its coefficients are the inverse transform.
    """
    from PIL import Image

    h, w, c = x.shape
    cy, cx = (h - 1) / 2, (w - 1) / 2
    cos, sin = np.cos(angle) / zoom, np.sin(angle) / zoom
    # input = R(-angle) / zoom @ (output - centre - shift) + centre
    ox, oy = cx + dx, cy + dy
    coeffs = (cos, sin, cx - cos * ox - sin * oy, -sin, cos, cy + sin * ox - cos * oy)

    def move(im):
        return np.asarray(im.transform((w, h), Image.Transform.AFFINE, coeffs, Image.Resampling.BILINEAR, fillcolor=0))

    if x.dtype == np.uint8:
        return move(from_array(x)).reshape(h, w, c)
    return np.stack([move(Image.fromarray(np.ascontiguousarray(x[:, :, k], np.float32))) for k in range(c)], axis=-1)


@dataclass(frozen=True)
class Augment:
    """Training augmentation. Per example: a random-resized crop, or shifts, rotations and zooms; a
    flip. Per batch: mixup or cutmix. Every draw comes from a generator seeded by (seed, position).

    crop_scale: random-resized crop (Inception / ImageNet style) of area fraction in [crop_scale, 1]
        and aspect ratio in [3/4, 4/3], resized to the model's size (``random_resized_crop``);
        0 = off (the evaluation resize and crop instead).
    shift: random translation by an integer in [-shift, shift] pixels per axis.
    rotate: random rotation by an angle in [-rotate, rotate] degrees about the image centre.
    scale: random zoom by a factor in [1 - scale, 1 + scale] about the image centre.
    flip: horizontal flip with probability 1/2 (natural images; not digits).
    mixup / cutmix: Beta(alpha, alpha) mixing of image pairs within a batch (0 = off), each image with
        the one at the mirrored position, the CutMix box as timm's (``cutmix_box``). Targets are mixed
        in the same proportion. The other mixing fields are timm's ``Mixup`` arguments (``mix``):
    mixup_prob: probability of mixing a batch (mode 'batch') or an image ('pair', 'elem').
    mixup_switch_prob: with mixup and cutmix both on, the probability of cutmix.
    mixup_mode: 'batch' (one lambda a batch), 'pair' (one a mirrored pair) or 'elem' (one an image).
    cutmix_minmax: (min, max): cutmix box sides drawn uniformly in [min, max) of the image's sides
        instead of from lambda; turns cutmix on at alpha 1 (timm forces it).
    correct_lam: lambda of a cutmix box clipped at the border = 1 - the pasted area.
    Pixels moved in from outside the image are 0. Shifts alone move whole pixels (exact); with a
    rotation or zoom the image is resampled bilinearly (Pillow affine transform).

    Raises:
        ValueError: a value outside its field's range (NaN and infinities included), named; a
            ``cutmix_minmax`` that is not two fractions 0 <= min < max <= 1.
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
    mixup_prob: float = field(
        default=1.0,
        metadata={
            "help": "augmentation: probability of mixing a batch (--mixup-mode batch) or an image (pair, elem); "
            "timm's --mixup-prob",
            "range": Range(0, 1),
        },
    )
    mixup_switch_prob: float = field(
        default=0.5,
        metadata={
            "help": "augmentation: with --mixup and --cutmix both on, the probability of cutmix; timm's "
            "--mixup-switch-prob",
            "range": Range(0, 1),
        },
    )
    mixup_mode: str = field(
        default="batch",
        metadata={
            "help": "augmentation: one mixing lambda per batch, per mirrored pair of images or per image; "
            "timm's --mixup-mode",
            "choices": MIX_MODES,
        },
    )
    cutmix_minmax: tuple[float, ...] | None = field(
        default=None,
        metadata={
            "help": "augmentation: cutmix box sides drawn uniformly in [MIN, MAX) of the image's instead of from "
            "lambda; turns cutmix on at alpha 1; timm's --cutmix-minmax MIN MAX",
        },
    )
    correct_lam: bool = field(
        default=True,
        metadata={
            "help": "augmentation: a cutmix box clipped at the border mixes the targets by the area pasted "
            "(timm's Mixup correct_lam)"
        },
    )

    def __post_init__(self):
        check_fields(self)
        if self.mixup_mode not in MIX_MODES:
            raise ValueError(f"mixup_mode={self.mixup_mode!r}: expected one of {', '.join(MIX_MODES)}")
        m = self.cutmix_minmax
        if m is not None and not (len(m) == 2 and all(np.isfinite(m)) and 0 <= m[0] < m[1] <= 1):
            raise ValueError(f"cutmix_minmax={m!r}: expected two fractions MIN MAX with 0 <= MIN < MAX <= 1")

    @property
    def mixes(self) -> bool:
        """Whether ``mix`` changes batches: mixup or cutmix on and a probability above 0."""
        return bool(self.mixup or self.cutmix or self.cutmix_minmax) and self.mixup_prob > 0

    @classmethod
    def default_for(cls, spec: str) -> Augment:
        """The augmentation ``vit train`` uses for a dataset spec unless told otherwise: random-resized
        crops and flips for photos read from files (``natural_images``), shifts of up to 2 pixels
        otherwise (digits)."""
        return cls(crop_scale=0.08, flip=True) if natural_images(spec) else cls(shift=2)

    def image(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Shift, rotate, zoom and flip one uint8 (or float32) [H, W, C] image (the crop is
        ``ImageTransform``'s)."""
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
        """Mix the first ``n`` (real) rows of images float32 [B, H, W, C] and targets float32 [B, K] among
        themselves as timm 1.0.31's ``Mixup`` (``timm/data/mixup.py``) does, draw for draw: ``rng.random``,
        ``rng.beta`` and ``rng.integers`` in the order timm calls ``np.random.rand``, ``beta`` and
        ``randint``, so a generator that replays numpy's global draws gives timm's batch. Row i mixes with
        row n - 1 - i (timm's ``flip(0)``); ``mixup_mode`` 'batch': one lambda for the batch, 'pair': one
        per mirrored pair (both rows mixed, an odd middle row left as it is), 'elem': one per row, each
        from the unmixed batch. Returns new arrays (the inputs when nothing mixes: no mixing
        on, or n < 2); padding rows are left as they are."""
        cutmix = 1.0 if self.cutmix_minmax else self.cutmix
        if not self.mixes or n < 2:
            return image, target
        src, ysrc = image[:n][::-1], target[:n][::-1]
        out, y = image.copy(), target.copy()
        h, w = image.shape[1:3]
        if self.mixup_mode == "batch":
            if rng.random() >= self.mixup_prob:
                return out, y
            use_cutmix = bool(cutmix) and (not self.mixup or rng.random() < self.mixup_switch_prob)
            alpha = cutmix if use_cutmix else self.mixup
            lam = float(rng.beta(alpha, alpha))
            if lam == 1.0:
                return out, y
            if use_cutmix:
                (yl, yh, xl, xh), lam = self._box(h, w, lam, rng)
                out[:n, yl:yh, xl:xh] = src[:, yl:yh, xl:xh]
            else:
                out[:n] = image[:n] * lam + src * (1.0 - lam)
            y[:n] = target[:n] * lam + ysrc * (1.0 - lam)
            return out, y
        pair = self.mixup_mode == "pair"
        m = n // 2 if pair else n
        if self.mixup and cutmix:
            use = rng.random(m) < self.mixup_switch_prob
            lam_mix = np.where(use, rng.beta(cutmix, cutmix, size=m), rng.beta(self.mixup, self.mixup, size=m))
        else:
            use = np.full(m, bool(cutmix))
            alpha = cutmix or self.mixup
            lam_mix = rng.beta(alpha, alpha, size=m)
        lam = np.where(rng.random(m) < self.mixup_prob, lam_mix.astype(np.float32), np.ones(m, np.float32))
        for i in range(m):
            j = n - 1 - i
            if lam[i] == 1.0:
                continue
            if use[i]:
                (yl, yh, xl, xh), lam[i] = self._box(h, w, float(lam[i]), rng)
                out[i, yl:yh, xl:xh] = image[j, yl:yh, xl:xh]
                if pair:
                    out[j, yl:yh, xl:xh] = image[i, yl:yh, xl:xh]
            else:
                out[i] = image[i] * lam[i] + image[j] * (1 - lam[i])
                if pair:
                    out[j] = image[j] * lam[i] + image[i] * (1 - lam[i])
        if pair:
            lam = np.concatenate([lam, np.ones(n % 2, np.float32), lam[::-1]])
        y[:n] = target[:n] * lam[:, None] + ysrc * (1 - lam[:, None])
        return out, y

    def _box(self, h: int, w: int, lam: float, rng: np.random.Generator) -> tuple[tuple[int, int, int, int], float]:
        """(box, lambda) of one cutmix paste, drawn as timm's ``cutmix_bbox_and_lam``: with
        ``cutmix_minmax`` its ``rand_bbox_minmax`` (sides in [min, max) of the image's, lambda always the
        pasted area; a side whose range holds no integer is int(side x min), where timm's draw fails),
        else ``cutmix_box`` with lambda corrected when ``correct_lam``."""
        if self.cutmix_minmax:
            lo, hi = self.cutmix_minmax
            ch = int(rng.integers(int(h * lo), max(int(h * hi), int(h * lo) + 1)))
            cw = int(rng.integers(int(w * lo), max(int(w * hi), int(w * lo) + 1)))
            yl, xl = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            return (yl, yl + ch, xl, xl + cw), 1.0 - ch * cw / float(h * w)
        box, corrected = cutmix_box(h, w, lam, int(rng.integers(0, h)), int(rng.integers(0, w)))
        return box, corrected if self.correct_lam else lam


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
    """One example's image -> uint8 [H, W, C] at the model's size and channels, or float32 [H, W, C] in
    [0, 255] (``dtype``) where ``preprocess.rescale_before_resize``: resized in float as
    ``images.load_image`` does (``images.resized_pixels``).

    The image is a file path (decoded by ``images.open_image``), encoded file bytes (a stored
    dataset's record, ``images.decode_image``) or a uint8 array. Evaluation
    (``augment`` None): ``images.eval_resize_crop`` with ``preprocess``. Training: the random-resized
    crop if ``augment.crop_scale`` (else the evaluation geometry), then ``Augment.image``.
    """

    def __init__(self, size: tuple[int, int], channels: int, preprocess: Preprocess, augment: Augment | None = None):
        self.size, self.channels, self.preprocess, self.augment = tuple(size), channels, preprocess, augment
        self.dtype = np.dtype(np.float32 if preprocess.rescale_before_resize else np.uint8)

    def __call__(self, image: str | bytes | np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        if isinstance(image, np.ndarray) and image.shape == (*self.size, self.channels):
            if self.augment is None or not self.augment.crop_scale:
                image = image.astype(self.dtype, copy=False)
                return image if self.augment is None else self.augment.image(image, rng)
        im = as_image(image)
        if self.augment is not None and self.augment.crop_scale:
            h, w = self.size
            box = random_crop_box(im.size, rng, (self.augment.crop_scale, 1.0), (3 / 4, 4 / 3))
            interpolation = _filter(self.preprocess.interpolation)

            def resize(im):
                return im.resize((w, h), interpolation, box=box)
        else:

            def resize(im):
                return eval_resize_crop(im, self.size, self.preprocess)

        x = resized_pixels(im, self.channels, self.preprocess, resize)
        return x if self.augment is None else self.augment.image(x, rng)
