"""The one image path of every command: decode, orient, convert, resize, crop, normalise (Pillow + numpy).

Training, evaluation, prediction, attention maps and parity runs all turn files into model input here, so
every command feeds a model the same pixels:

1. ``open_image``: decode with Pillow and apply the EXIF orientation (``ImageOps.exif_transpose``; a photo
   stored sideways with orientation 6 comes out upright).
2. ``to_channels``: any Pillow mode to 'L' (C=1) or 'RGB' (C=3). 16-bit greyscale is scaled to 8 bits
   (Pillow's ``convert`` would clip it); transparency (RGBA, LA, a palette with a transparent index) is
   composited onto white, as transformers' ``image_transforms.convert_to_rgb`` does; palette, CMYK,
   YCbCr and bilevel images are converted by Pillow.
3. ``eval_resize_crop`` (evaluation, prediction; training's crops are in ``vit_common.data.augment``):
   Pillow resizes, which low-pass filter when shrinking.
4. ``normalize``: ``(x * rescale_factor - mean) / std`` per channel (rescale_factor 1/255 but where a
   transformers processor says ``do_rescale`` false), float32.

``Preprocess`` holds the choices a checkpoint was trained with (mean, std, resize filter, crop) and
``PRESETS`` the usual ones. Pillow is imported when a function needs it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.system.validate import Range, regular_file

# The one list of file suffixes read as images (lower case), by every command.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
# Pillow modes holding more than 8 bits per pixel: 16-bit greyscale (PNG, TIFF) opens as 'I;16*' or as
# 32-bit 'I' with values in [0, 65535].
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos")
CROP_MODES = ("center", "squash")
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # timm IMAGENET_DEFAULT_MEAN / STD (torchvision's ImageNet statistics)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes a model's input: the model's preprocessing config.

    Fields:
        mean, std: one value for every channel, or one per channel, subtracted from and dividing the pixels
            times ``rescale_factor`` (in [0, 1] for the usual 1/255). mean = std = 0.5 maps pixels to [-1, 1]
            (big_vision ``value_range(-1, 1)``, HF ViT, timm augreg); mean 0 and std 1 keep [0, 1].
        interpolation: Pillow resampling filter of every resize ('nearest', 'bilinear', 'bicubic',
            'lanczos'); Pillow widens the filter when shrinking (antialiasing).
        crop_pct: evaluation resizes to ``size / crop_pct`` (floor) and centre-crops ``size`` (timm
            ``transforms_imagenet_eval``; big_vision ``resize_small`` + ``central_crop``); 1 = no margin.
        crop_mode: 'center' resizes the shorter side keeping the aspect ratio (torchvision ``Resize(int)``)
            before the crop; 'squash' resizes both sides, ignoring the aspect ratio (transformers'
            ViTImageProcessor, the original ViT's evaluation).
        rescale_factor: what the 0..255 pixels are multiplied by before mean and std (transformers'
            ``rescale_factor``; 1/255 everywhere but a processor with ``do_rescale`` false, which is 1).
        resize_size, crop_size: the geometry of a transformers image processor, in pixels, instead of
            timm's ``size / crop_pct``: ``resize_size`` (S,) resizes the shorter side to S and the longer
            one to ``int(S * long / short)`` (crop_mode 'center'; transformers ``shortest_edge``), (H, W)
            both sides (crop_mode 'squash'); then ``crop_size`` (H, W), if given, is cut at offset
            ``floor((in - out) / 2)``, zero-padded where the image is smaller (transformers
            ``image_transforms.center_crop``). The result must be the model's size. None: timm's rule.
        rescale_before_resize: resize the pixels as floats, unrounded, instead of as uint8 (transformers
            ``DINOv3ViTImageProcessor``: rescale, resize, normalise), by ``load_image`` and the
            datasets' ``ImageTransform`` alike (``resized_pixels``).
        max_patches: NaFlex (SigLIP 2) instead of a resize and crop: each image keeps its aspect ratio,
            resized to at most this many of the model's patches (``vit_common.naflex.preprocess``;
            transformers ``Siglip2ImageProcessor``'s ``max_num_patches``). None: a fixed-size image.

    Raises:
        ValueError: an unknown filter or crop mode, a std <= 0, a crop_pct outside (0, 1], mean and std
            of different lengths, a rescale_factor that is not a positive finite number, a
            rescale_before_resize that is not a bool, sizes that are not positive integers, or a
            transformers geometry with crop_pct other than 1, a crop_mode that does not match its
            resize, or a crop without a resize; max_patches not a positive integer, or with a resize, a
            crop or crop_pct other than 1.
    """

    mean: tuple[float, ...] = field(
        default=(0.5,), metadata={"help": "per-channel mean of pixels in [0, 1] (one value, or one per channel)"}
    )
    std: tuple[float, ...] = field(default=(0.5,), metadata={"help": "per-channel std (one value, or one per channel)"})
    interpolation: str = field(
        default="bilinear", metadata={"help": "resize filter (Pillow, antialiased)", "choices": INTERPOLATIONS}
    )
    crop_pct: float = field(
        default=1.0, metadata={"help": "evaluation: resize to size / crop_pct, then centre-crop the size"}
    )
    crop_mode: str = field(
        default="squash",
        metadata={
            "help": "evaluation resize: center (shorter side, aspect kept) or squash (both sides)",
            "choices": CROP_MODES,
        },
    )
    rescale_factor: float = field(
        default=1 / 255, metadata={"help": "pixels (0..255) are multiplied by this before mean/std"}
    )
    resize_size: tuple[int, ...] | None = field(
        default=None,
        metadata={"help": "evaluation resize in pixels as transformers does it: S (shorter side) or H W (both)"},
    )
    crop_size: tuple[int, ...] | None = field(
        default=None, metadata={"help": "with --resize-size: the centre crop H W (transformers' crop_size)"}
    )
    rescale_before_resize: bool = field(
        default=False, metadata={"help": "resize float pixels, not uint8 ones (transformers' DINOv3 processor)"}
    )
    max_patches: int | None = field(
        default=None,
        metadata={
            "help": "NaFlex (SigLIP 2): keep each image's aspect ratio, resized to at most this many patches "
            "(vit_common.naflex.preprocess, transformers' Siglip2ImageProcessor) instead of resized and cropped",
            "range": Range(1, integer=True),
        },
    )

    def __post_init__(self) -> None:
        for name in ("mean", "std"):
            v = getattr(self, name)
            v = (v,) if isinstance(v, (int, float)) else tuple(float(x) for x in v)
            object.__setattr__(self, name, v)
            if not v or not all(math.isfinite(x) for x in v):
                raise ValueError(f"{name}={list(v)}: expected one or more finite numbers")
        if len(self.mean) != len(self.std):
            raise ValueError(f"mean={list(self.mean)} and std={list(self.std)}: expected the same number of values")
        if min(self.std) <= 0:
            raise ValueError(f"std={list(self.std)}: expected positive values")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation={self.interpolation!r}: expected one of {INTERPOLATIONS}")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"crop_mode={self.crop_mode!r}: expected one of {CROP_MODES}")
        if not 0 < self.crop_pct <= 1:
            raise ValueError(f"crop_pct={self.crop_pct!r}: expected a fraction in (0, 1]")
        rescale = self.rescale_factor
        if isinstance(rescale, bool) or not isinstance(rescale, (int, float)) or not 0 < rescale < math.inf:
            raise ValueError(f"rescale_factor={rescale!r}: expected a positive finite number")
        object.__setattr__(self, "rescale_factor", float(rescale))
        if not isinstance(self.rescale_before_resize, bool):
            raise ValueError(f"rescale_before_resize={self.rescale_before_resize!r}: expected true or false")
        for name, lengths in (("resize_size", (1, 2)), ("crop_size", (2,))):
            v = getattr(self, name)
            if v is None:
                continue
            v = (v,) if isinstance(v, int) else tuple(v)
            if len(v) not in lengths or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
                raise ValueError(f"{name}={list(v)}: expected {' or '.join(map(str, lengths))} positive integers")
            object.__setattr__(self, name, v)
        if self.max_patches is not None:
            Range(1, integer=True).check("max_patches", self.max_patches)
            if self.resize_size is not None or self.crop_pct != 1:
                raise ValueError(
                    f"max_patches={self.max_patches} with resize_size={self.resize_size and list(self.resize_size)}, "
                    f"crop_pct={self.crop_pct}: NaFlex resizes each image itself (expected neither)"
                )
        if self.resize_size is None:
            if self.crop_size is not None:
                raise ValueError(f"crop_size={list(self.crop_size)} without resize_size: expected both or neither")
        elif self.crop_pct != 1 or self.crop_mode != ("center" if len(self.resize_size) == 1 else "squash"):
            mode = "center" if len(self.resize_size) == 1 else "squash"
            raise ValueError(
                f"resize_size={list(self.resize_size)} with crop_pct={self.crop_pct} and crop_mode="
                f"{self.crop_mode!r}: a transformers geometry takes crop_pct 1 and crop_mode {mode!r}"
            )

    def replace(self, **changes: Any) -> Preprocess:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        for name in ("resize_size", "crop_size"):
            d[name] = None if d[name] is None else list(d[name])
        return d

    def at_size(self, size: int | Sequence[int]) -> Preprocess:
        """This preprocessing for a model of another ``size`` (H, W): a transformers geometry whose output
        is not (H, W) has its sizes scaled to give (H, W) (rounded; a fine-tuning run at a new resolution);
        timm's rule, relative to the size already, is returned as is."""
        h, w = _size(size)
        if self.resize_size is None:
            return self
        out = self.crop_size or self.resize_size
        if len(out) == 1 or tuple(out) == (h, w):
            return self
        scale = (h / out[0], w / out[1])
        if len(self.resize_size) == 1:
            resize = (round(self.resize_size[0] * min(scale)),)
        else:
            resize = tuple(round(s * f) for s, f in zip(self.resize_size, scale, strict=True))
        return self.replace(resize_size=resize, crop_size=None if self.crop_size is None else (h, w))

    def describe(self, size: int | Sequence[int], budget: str | None = None) -> str:
        """What ``eval_resize_crop`` and ``normalize`` do to an image for a model of ``size`` (H, W), in words
        (one mean or std value as '0.5 (every channel)'); ``budget`` names a NaFlex model's patch budget."""
        h, w = _size(size)
        side = "shorter side" if self.crop_mode == "center" else "both sides"
        rescale = "pixel / 255" if self.rescale_factor * 255 == 1 else f"pixel * {self.rescale_factor:g}"
        each = lambda v: f"{v[0]} (every channel)" if len(v) == 1 else f"[{', '.join(map(str, v))}]"  # noqa: E731
        stats = f"({rescale} - mean {each(self.mean)}) / std {each(self.std)}"
        if self.max_patches is not None or budget is not None:
            budget = budget or f"at most {self.max_patches} patches"
            return f"aspect kept, resized ({self.interpolation}, Pillow) to {budget}, {stats}"
        if self.resize_size is None:
            geometry = f"{side} resized ({self.interpolation}, Pillow) to {h}x{w} / {self.crop_pct}"
        else:
            to = "x".join(map(str, self.resize_size))
            geometry = f"{side} resized ({self.interpolation}, Pillow) to {to} as transformers does"
        if self.rescale_before_resize:
            geometry += " (in float)"
        return f"{geometry} and centre-cropped to {h}x{w}, then {stats}"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocess:
        """Inverse of ``to_dict``. Raises ValueError naming unknown keys or bad values."""
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown preprocessing field(s) {sorted(unknown)}")
        return cls(**d)

    def channel_stats(self, channels: int) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) as float32 [C] for C = ``channels``.

        Raises:
            ValueError: the config has several values and not C of them (e.g. ImageNet's 3 for a grey model).
        """
        if len(self.mean) not in (1, channels):
            raise ValueError(
                f"mean={list(self.mean)} / std={list(self.std)} give {len(self.mean)} channels, the model has "
                f"{channels}: pass one value or {channels} (--mean/--std)"
            )
        mean = np.broadcast_to(np.asarray(self.mean, np.float32), (channels,))
        std = np.broadcast_to(np.asarray(self.std, np.float32), (channels,))
        return mean, std


PRESETS = {
    # timm's ImageNet-1k recipes (DeiT and most timm weights): ImageNet statistics, bicubic, crop 0.9.
    "imagenet": Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", 0.9, "center"),
    # timm augreg / original-ViT ports: [-1, 1], bicubic, crop 0.9.
    "inception": Preprocess((0.5,), (0.5,), "bicubic", 0.9, "center"),
    # transformers ViTImageProcessor defaults: [-1, 1], bilinear, squash to the size.
    "hf_vit": Preprocess((0.5,), (0.5,), "bilinear", 1.0, "squash"),
    # big_vision and the original ViT: value_range(-1, 1) after a bilinear resize to the size.
    "big_vision": Preprocess((0.5,), (0.5,), "bilinear", 1.0, "squash"),
}


# ------------------------------------------------------------------------------------ decoding


def _decode_errors() -> tuple[type[BaseException], ...]:
    """What Pillow raises on a file it cannot decode: unknown, truncated, corrupt, or a decompression
    bomb (more pixels than ``PIL.Image.MAX_IMAGE_PIXELS``)."""
    from PIL import Image

    return (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def open_image(path: str | os.PathLike):
    """Decode an image file into a Pillow image, upright (EXIF orientation applied), fully loaded.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a folder, a FIFO or device, or a file Pillow cannot decode (unknown, truncated,
            corrupt, or more pixels than its decompression-bomb limit, ``PIL.Image.MAX_IMAGE_PIXELS``);
            the message names the path.
    """
    from PIL import Image, ImageOps

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder: expected an image file")
    regular_file(path, "image file")  # a FIFO or device is refused, not waited on
    try:
        with Image.open(path) as im:
            im.load()
            return ImageOps.exif_transpose(im)
    except _decode_errors() as e:
        raise ValueError(f"{path}: unreadable image ({_reason(e, path)})") from e


def decode_image(data: bytes, name: str | None = None):
    """``open_image`` for an encoded file held in memory (a Hugging Face dataset's or an ArrayRecord's
    image bytes); ``name`` says where the bytes came from in the error (None: the caller's message names
    it).

    Raises:
        ValueError: bytes Pillow cannot decode (as ``open_image``), naming ``name``.
    """
    import io

    from PIL import Image, ImageOps

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return ImageOps.exif_transpose(im)
    except _decode_errors() as e:
        raise ValueError(f"{f'{name}: ' if name else ''}unreadable image ({_reason(e)})") from e


def _reason(e: BaseException, path: str | os.PathLike | None = None) -> str:
    """Pillow's message without the repr of the file it was given (``<_io.BytesIO object at ...>``, or
    ``path``, which the message's prefix names already)."""
    text = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(e))
    return text.replace(f" {str(path)!r}", "") if path is not None else text


def check_decodes(image: str | os.PathLike | bytes, name: str | None = None) -> None:
    """Decode ``image`` (a file path, or encoded bytes) all through, as the run will, and discard it: the
    up-front check of a dataset. A JPEG is decoded at 1/8 scale (Pillow's ``draft``: libjpeg's DCT
    scaling), which reads every entropy-coded byte, so a truncated or corrupt file fails here as it
    would in the run, at a fraction of the cost; other formats are decoded at full size.

    Raises:
        FileNotFoundError / OSError / ValueError: as ``open_image`` (a FIFO or device is refused unopened);
            ValueError for an image of zero height or width.
    """
    import io

    from PIL import Image

    label = str(name if name is not None else image)
    if not isinstance(image, bytes):
        regular_file(image, "image file")
    try:
        with Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as im:
            if im.format == "JPEG":
                im.draft(im.mode, (1, 1))  # the smallest DCT scale, still every byte decoded
            im.load()
            width, height = im.size
    except _decode_errors() as e:
        raise ValueError(
            f"{label}: unreadable image ({_reason(e, None if isinstance(image, bytes) else image)})"
        ) from e
    if not width or not height:
        raise ValueError(f"{label}: an image of {width}x{height} pixels; expected at least 1x1")


def to_8bit(image):
    """A Pillow image whose pixels Pillow's ``convert('L'|'RGB')`` keeps: 16-bit greyscale scaled to 8 bits.

    ``convert`` clips a 16-bit image to 255 instead of scaling it (every non-black pixel turns white), so
    such an image is scaled by 255 / 65535 (rounded, values clipped to [0, 65535]) first; images of
    other modes are returned unchanged.
    """
    if image.mode not in SIXTEEN_BIT_MODES:
        return image
    from PIL import Image

    scaled = np.clip(np.asarray(image, np.float64), 0, 65535) * (255.0 / 65535.0)
    return Image.fromarray(np.rint(scaled).astype(np.uint8))


def to_channels(image, channels: int):
    """A Pillow image in mode 'L' (``channels`` 1) or 'RGB' (3), see the module docstring.

    Raises:
        ValueError: ``channels`` is not 1 or 3.
    """
    from PIL import Image

    if channels not in (1, 3):
        raise ValueError(f"channels={channels}: expected 1 (greyscale) or 3 (RGB)")
    mode = "L" if channels == 1 else "RGB"
    image = to_8bit(image)
    if image.mode == mode:
        return image
    if "A" in image.getbands() or "a" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return image.convert(mode)


def from_array(x: np.ndarray):
    """uint8 [H, W] or [H, W, 1|3] -> a Pillow 'L' or 'RGB' image.

    Raises:
        ValueError: another dtype or shape.
    """
    from PIL import Image

    if x.dtype != np.uint8 or x.ndim not in (2, 3) or (x.ndim == 3 and x.shape[2] not in (1, 3)):
        raise ValueError(f"image array {x.dtype}{list(x.shape)}: expected uint8 [H, W] or [H, W, 1|3]")
    return Image.fromarray(x if x.ndim == 2 or x.shape[2] == 3 else x[:, :, 0])


def as_image(image: str | os.PathLike | bytes | np.ndarray):
    """A dataset example's image (a file path, encoded bytes or a uint8 array) -> a Pillow image, with the
    errors of ``open_image``, ``decode_image`` and ``from_array``."""
    if isinstance(image, np.ndarray):
        return from_array(image)
    return decode_image(image) if isinstance(image, bytes) else open_image(image)


def to_array(image, channels: int) -> np.ndarray:
    """A Pillow image -> uint8 [H, W, C] with C = ``channels`` (converted by ``to_channels``)."""
    arr = np.asarray(to_channels(image, channels), np.uint8)
    return arr if arr.ndim == 3 else arr[:, :, None]


# -------------------------------------------------------------------------------- resize, crop


def _filter(interpolation: str):
    from PIL import Image

    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation={interpolation!r}: expected one of {INTERPOLATIONS}")
    return getattr(Image.Resampling, interpolation.upper())


def _size(size: int | Sequence[int]) -> tuple[int, int]:
    h, w = (size, size) if isinstance(size, int) else size
    if min(h, w) < 1:
        raise ValueError(f"size {size}: expected positive (H, W)")
    return int(h), int(w)


def eval_resize_crop(image, size: int | Sequence[int], preprocess: Preprocess):
    """Evaluation geometry: resize to ``size / crop_pct`` then centre-crop ``size`` = (H, W).

    'center' resizes the shorter side (for a square target; the side that needs the larger scale
    otherwise) keeping the aspect ratio, the other side truncated as torchvision's ``Resize(int)``;
    'squash' resizes each side to its target. The crop offset is ``round((in - out) / 2)`` (Python's
    rounding, as torchvision's ``CenterCrop``). An image already at (H, W) with crop_pct 1 is returned
    as is. Source: timm ``data/transforms_factory.py`` ``transforms_imagenet_eval``. A transformers
    geometry (``Preprocess.resize_size``) is applied as its image processors apply it instead.

    Raises:
        ValueError: a transformers geometry whose output is not (H, W).
    """
    h, w = _size(size)
    if preprocess.resize_size is not None:
        return _transformers_resize_crop(image, (h, w), preprocess)
    if image.size == (w, h) and preprocess.crop_pct == 1:
        return image
    sh, sw = math.floor(h / preprocess.crop_pct), math.floor(w / preprocess.crop_pct)
    iw, ih = image.size
    if preprocess.crop_mode == "squash":
        rw, rh = sw, sh
    elif sh == sw:  # torchvision Resize(int): the shorter side to the size, the longer one truncated
        rw, rh = (sw, int(sw * ih / iw)) if iw <= ih else (int(sh * iw / ih), sh)
    else:  # timm ResizeKeepRatio: the scale that covers both target sides
        scale = max(sh / ih, sw / iw)
        rw, rh = max(sw, round(iw * scale)), max(sh, round(ih * scale))
    if (rw, rh) != (iw, ih):
        image = image.resize((rw, rh), _filter(preprocess.interpolation))
    top, left = int(round((rh - h) / 2.0)), int(round((rw - w) / 2.0))
    return image.crop((left, top, left + w, top + h)) if (rw, rh) != (w, h) else image


def _transformers_resize_crop(image, size: tuple[int, int], preprocess: Preprocess):
    """``eval_resize_crop`` for a transformers geometry (``Preprocess.resize_size``), as the PIL backend of
    its image processors computes it (transformers ``image_processing_backends.PilBackend.resize`` and
    ``image_transforms.get_resize_output_image_size`` / ``center_crop``).

    Raises:
        ValueError: the processor's output is not ``size`` (H, W), the model's.
    """
    iw, ih = image.size
    if len(preprocess.resize_size) == 1:
        short, long = (iw, ih) if iw <= ih else (ih, iw)
        s = preprocess.resize_size[0]
        new_short, new_long = s, int(s * long / short)
        rw, rh = (new_short, new_long) if iw <= ih else (new_long, new_short)
    else:
        rh, rw = preprocess.resize_size
    out = preprocess.crop_size or (rh, rw)
    if tuple(out) != size:
        raise ValueError(
            f"the preprocessing (resize_size={list(preprocess.resize_size)}, crop_size="
            f"{preprocess.crop_size and list(preprocess.crop_size)}) gives {out[0]}x{out[1]} images; "
            f"the model takes {size[0]}x{size[1]}"
        )
    if (rw, rh) != (iw, ih):
        image = image.resize((rw, rh), _filter(preprocess.interpolation))
    if preprocess.crop_size is None or (rh, rw) == size:
        return image
    h, w = size
    top, left = (rh - h) // 2, (rw - w) // 2  # floor: negative where the crop is larger (Pillow pads with 0)
    return image.crop((left, top, left + w, top + h))


# ------------------------------------------------------------------------------------ normalise


@functools.lru_cache(maxsize=8)
def _uint8_divisor(rescale_factor: float) -> np.float32 | None:
    """A float32 d with float32 ``x / d`` equal to the float64 ``x * rescale_factor`` rounded to float32 on
    every uint8 x (255 for 1/255, 1 for 1: a division in place is 3x faster than a table look-up), or None."""
    x = np.arange(256, dtype=np.float64)
    d = np.float32(1 / rescale_factor)
    return d if np.array_equal(x.astype(np.float32) / d, (x * rescale_factor).astype(np.float32)) else None


def normalize(images: np.ndarray, preprocess: Preprocess | None = None) -> np.ndarray:
    """uint8 (or float 0..255) [..., H, W, C] -> float32 ``(x * rescale_factor - mean) / std`` per channel.

    The product is the float64 one rounded to float32, then mean and std are applied in float32:
    transformers ``image_transforms.rescale`` and ``normalize`` (its PIL backend), bit for bit.
    ``preprocess`` None means ``Preprocess()``: mean = std = 0.5 (values in [-1, 1]).

    Raises:
        ValueError: mean/std do not fit C (see ``Preprocess.channel_stats``).
    """
    preprocess = preprocess or Preprocess()
    mean, std = preprocess.channel_stats(images.shape[-1])
    divisor = _uint8_divisor(preprocess.rescale_factor) if images.dtype == np.uint8 else None
    if divisor is not None:  # in place from here: the same operations, no temporaries
        out = np.array(images, np.float32)
        out /= divisor
    elif images.dtype == np.uint8:
        out = (np.arange(256, dtype=np.float64) * preprocess.rescale_factor).astype(np.float32)[images]
    else:
        out = (np.asarray(images, np.float64) * preprocess.rescale_factor).astype(np.float32)
    if out.ndim >= 2:  # rows of W * C values: numpy's inner loop over 3 channels alone is slow
        w, c = out.shape[-2:]
        rows = out.reshape(*out.shape[:-2], w * c)
        rows -= np.tile(mean, w)
        rows /= np.tile(std, w)
    else:
        out -= mean
        out /= std
    return out


# ------------------------------------------------------------------------------------ files


def load_image(path: str | os.PathLike, size: int | Sequence[int], channels: int, preprocess: Preprocess):
    """Decode one file for evaluation: uint8 [H, W, C] (``open_image``, ``to_channels``, ``eval_resize_crop``),
    or float32 [H, W, C] in [0, 255] where ``preprocess.rescale_before_resize``: each channel resized as
    Pillow 'F' (float32, weights and sums in float64), what transformers' DINOv3ViTImageProcessor computes
    with torchvision's antialiased kernels in float32 (``tolerance("pixels_float_resize", "uint8")``).

    Raises:
        FileNotFoundError / ValueError: as ``open_image``; ValueError for ``channels`` not 1 or 3.
    """
    return resized_pixels(open_image(path), channels, preprocess, lambda im: eval_resize_crop(im, size, preprocess))


def resized_pixels(image, channels: int, preprocess: Preprocess, resize: Callable) -> np.ndarray:
    """A Pillow image (``to_channels``) through ``resize`` (a Pillow image -> a Pillow image, the same
    geometry for every mode) as an array: uint8 [H, W, C], or float32 [H, W, C] in [0, 255] where
    ``preprocess.rescale_before_resize``: ``resize`` then runs on each channel as Pillow 'F' (float32,
    weights and sums in float64; ``load_image``), only then.

    Raises:
        ValueError: ``channels`` not 1 or 3.
    """
    image = to_channels(image, channels)
    if not preprocess.rescale_before_resize:
        return to_array(resize(image), channels)
    bands = (resize(band.convert("F")) for band in image.split())
    return np.stack([np.asarray(band, np.float32) for band in bands], axis=-1)


def is_image_file(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def list_images(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Image files named by ``paths``: each a file (kept whatever its suffix), or a folder, searched
    recursively for ``IMAGE_SUFFIXES`` in sorted order (so a folder of class folders, or one with
    train/ and val/, gives all its images), hidden files and folders skipped.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: a folder without image files (the suffixes are listed).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and is_image_file(f) and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            if not found:
                raise ValueError(f"{p}: no image files ({', '.join(IMAGE_SUFFIXES)})")
            out += found
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such image file or folder")
    return out
