"""NaFlex inputs (NaViT, Dehghani et al. 2023, with FlexiViT's resizable position table; SigLIP 2's
variable-resolution models), in numpy, used by both twins.

A NaFlex batch is three arrays:

- ``patches`` [B, N, P*P*C]: image i's h_i x w_i patches first, row-major, each flattened in (P, P, C)
  order (transformers ``Siglip2ImageProcessor``, big_vision ``ops_naflex``), then N - h_i w_i padding
  patches;
- ``patch_mask`` [B, N] bool (or 0/1): True for an image's patches, False for padding (transformers
  ``pixel_attention_mask``, big_vision ``ptype == 1``);
- ``spatial_shapes`` [B, 2] int: each image's patch grid (h_i, w_i) (transformers ``spatial_shapes``).

The model's learned position table (its ``cfg.grid``) is resampled to each image's grid with
``cfg.posemb_resample`` (``position_weights``): ``bilinear_aa`` is transformers'
``Siglip2VisionEmbeddings.resize_positional_embeddings`` and big_vision naflex_vit's ``_pos_emb_resize``
(``jax.image.scale_and_translate(method="bilinear", antialias=True)``). Padding patches take part in no
attention (as keys) and in no pooling. ``preprocess`` turns a PIL image into one image's patches as
transformers' ``Siglip2ImageProcessorPil`` does (aspect kept, at most ``max_patches`` patches);
``check_model`` refuses, before any image is read, a model or a patch budget that cannot run.
"""

from __future__ import annotations

import math

import numpy as np

from vit_common.config import ViTConfig
from vit_common.data.batches import read_example
from vit_common.data.images import Preprocess, as_image, normalize, to_array, to_channels
from vit_common.posemb import resample_matrices
from vit_common.system.validate import memory_limit, model_bytes


def check_batch(cfg: ViTConfig, shape: tuple[int, ...], patch_mask, spatial_shapes) -> tuple[np.ndarray, np.ndarray]:
    """Validate a NaFlex batch of patches of ``shape`` for a model of ``cfg``: (patch_mask [B, N] bool,
    spatial_shapes [B, 2] int64) as host numpy arrays.

    Raises:
        ValueError (one line, naming the value and what was expected): patches not [B, N, P*P*C]; a model
            whose position embedding or RoPE has no per-image resize (posemb other than 'learn' or 'none',
            rope); spatial_shapes not [B, 2] positive ints; an image needing more patches than N (the
            maximum); a patch_mask not [B, N], or not marking exactly each image's first h_i w_i patches.
    """
    (ph, pw), c = cfg.patch_size, cfg.in_chans
    if len(shape) != 3 or shape[2] != ph * pw * c:
        raise ValueError(f"NaFlex patches of shape {tuple(shape)}: expected [B, N, P*P*C = {ph * pw * c}]")
    _check_table(cfg)
    b, n = shape[:2]
    shapes = np.asarray(spatial_shapes)
    if shapes.shape != (b, 2) or not np.issubdtype(shapes.dtype, np.integer) or (shapes < 1).any():
        raise ValueError(f"spatial_shapes of shape {shapes.shape}: expected [B={b}, 2] positive ints (h, w)")
    shapes = shapes.astype(np.int64)
    counts = shapes.prod(axis=1)
    if (counts > n).any():
        i = int(np.argmax(counts > n))
        h, w = shapes[i]
        raise ValueError(f"image {i} needs {h}x{w} = {h * w} patches, more than the maximum N={n} of its batch")
    mask = np.asarray(patch_mask)
    if mask.shape != (b, n):
        raise ValueError(f"patch_mask of shape {mask.shape}: expected [B={b}, N={n}]")
    want = np.arange(n)[None, :] < counts[:, None]
    if not np.array_equal(mask.astype(bool), want) or not np.isin(mask, (0, 1)).all():
        i = int(np.argmax((mask != want).any(axis=1)))
        raise ValueError(
            f"patch_mask row {i} marks {int(np.count_nonzero(mask[i]))} patches; its spatial shape "
            f"{shapes[i, 0]}x{shapes[i, 1]} needs its first {counts[i]} marked and the rest not"
        )
    return want, shapes


def check_weights(cfg: ViTConfig, shape: tuple[int, ...], patch_mask, spatial_shapes, weights) -> None:
    """Validate a NaFlex batch of patches of ``shape`` given as (patch_mask [B, N], ``weights`` [B, N,
    Gh*Gw], ``position_weights``'s, made on the host) by their shapes alone: they may be traced arrays.

    Raises:
        ValueError (one line): patches not [B, N, P*P*C]; a model without a resizable table (as
            ``check_batch``); spatial_shapes given too; a patch_mask or weights of another shape.
    """
    (ph, pw), c, (gh, gw) = cfg.patch_size, cfg.in_chans, cfg.grid
    if len(shape) != 3 or shape[2] != ph * pw * c:
        raise ValueError(f"NaFlex patches of shape {tuple(shape)}: expected [B, N, P*P*C = {ph * pw * c}]")
    _check_table(cfg)
    b, n = shape[:2]
    if spatial_shapes is not None:
        raise ValueError(
            "spatial_shapes and position_weights both given: expected one: position_weights are the position "
            "table resized to spatial_shapes' grids; pass patch_mask and position_weights"
        )
    if patch_mask is None or tuple(patch_mask.shape) != (b, n):
        got = None if patch_mask is None else tuple(patch_mask.shape)
        raise ValueError(f"patch_mask of shape {got}: expected [B={b}, N={n}] with position_weights")
    if tuple(weights.shape) != (b, n, gh * gw):
        raise ValueError(f"position_weights of shape {tuple(weights.shape)}: expected [B={b}, N={n}, Gh*Gw={gh * gw}]")


def naflex_inputs(cfg: ViTConfig, shape: tuple[int, ...], patch_mask, spatial_shapes, weights=None):
    """A NaFlex batch of patches of ``shape`` as the twins' forward takes it, from host arrays: (token_mask
    [B, L] bool, the prefix tokens first, then ``patch_mask``; position weights [B, N, Gh*Gw]: ``weights``
    when given (checked by ``check_weights``), else ``position_weights`` of ``spatial_shapes`` (checked by
    ``check_batch``)).

    Raises:
        ValueError: as ``check_batch`` or ``check_weights``.
    """
    if weights is not None:
        check_weights(cfg, shape, patch_mask, spatial_shapes, weights)
        mask = np.asarray(patch_mask).astype(bool)
    else:
        mask, shapes = check_batch(cfg, shape, patch_mask, spatial_shapes)
        weights = position_weights(cfg.grid, shapes, shape[1], cfg.posemb_resample)
    prefix = np.ones((shape[0], cfg.num_prefix_tokens), bool)
    return np.concatenate([prefix, mask], axis=1), weights


def _check_table(cfg: ViTConfig) -> None:
    if cfg.posemb not in ("learn", "none") or cfg.rope != "none":
        raise ValueError(
            f"NaFlex input with posemb={cfg.posemb!r}, rope={cfg.rope!r}: only a learned position table "
            "(posemb='learn', rope='none') or none is resized per image"
        )


def check_model(cfg: ViTConfig, max_patches: int, batch: int, where: str) -> None:
    """Refuse NaFlex batches of ``batch`` images of at most ``max_patches`` patches for a model of ``cfg``
    before any image is read: a position embedding without a per-image resize (as ``check_batch``), or
    more memory than ``vit_common.system.validate.memory_limit()`` by estimate (``model_bytes`` at
    ``max_patches`` + prefix tokens, plus the batch's patches float32 and ``position_weights`` float64;
    the attention logits grow with ``max_patches`` squared).

    Raises:
        ValueError: one line naming ``where``, the value and what was expected.
    """
    try:
        _check_table(cfg)
    except ValueError as e:
        raise ValueError(f"{where}: {e}; max_patches={max_patches} is for a model that has one") from e
    (ph, pw), (gh, gw) = cfg.patch_size, cfg.grid
    seq = cfg.num_prefix_tokens + max_patches
    need = model_bytes(cfg, batch, seq) + batch * max_patches * (ph * pw * cfg.in_chans * 4 + gh * gw * 8)
    limit = memory_limit()
    if need > limit:
        raise ValueError(
            f"{where}: max_patches={max_patches} at a batch of {batch} images needs about {need / 1e9:.3g} GB "
            f"(attention over {seq} tokens), beyond the limit of {limit / 1e9:.3g} GB: expected fewer patches "
            "or a smaller batch (VIT_MAX_BYTES raises the limit)"
        )


def position_weights(grid: tuple[int, int], spatial_shapes: np.ndarray, length: int, method: str) -> np.ndarray:
    """[B, N=length, Gh*Gw] float64: row n of image i is the weight of each position-table cell (a
    ``grid`` (Gh, Gw) table, row-major) in patch n's position embedding, the table resampled to the
    image's grid (h_i, w_i) with ``method`` (``vit_common.posemb.METHODS``); padding rows are zero.
    The twins multiply it with their table: ``einsum("bng,gd->bnd", weights, table)``.

    Raises:
        ValueError: an unknown method.
    """
    gh, gw = grid
    out = np.zeros((len(spatial_shapes), length, gh * gw), np.float64)
    for i, (h, w) in enumerate(np.asarray(spatial_shapes).tolist()):
        wh, ww = resample_matrices((gh, gw), (h, w), method)  # [h, Gh], [w, Gw]
        out[i, : h * w] = np.einsum("ya,xb->yxab", wh, ww).reshape(h * w, gh * gw)
    return out


def patchify(image: np.ndarray, patch_size: tuple[int, int]) -> np.ndarray:
    """One image [H, W, C] (H, W multiples of the patch) -> its patches [h*w, P*P*C], row-major, each
    flattened (P, P, C) (transformers ``convert_image_to_patches``).

    Raises:
        ValueError: a size that is not a multiple of the patch.
    """
    (hh, ww, c), (ph, pw) = image.shape, patch_size
    if hh % ph or ww % pw:
        raise ValueError(f"image size ({hh}, {ww}) is not a multiple of patch_size {tuple(patch_size)}")
    grid = image.reshape(hh // ph, ph, ww // pw, pw, c).transpose(0, 2, 1, 3, 4)  # [h, w, P, P, C]
    return grid.reshape((hh // ph) * (ww // pw), ph * pw * c)


def pad_batch(images: list[np.ndarray], patch_size: tuple[int, int], max_patches: int):
    """Images [H_i, W_i, C] (each a multiple of the patch) -> a NaFlex batch (patches [B, N, P*P*C] float32
    zero padded, patch_mask [B, N] bool, spatial_shapes [B, 2] int64) with N = ``max_patches``.

    Raises:
        ValueError: an image needing more than ``max_patches`` patches (named), or not a patch multiple.
    """
    (ph, pw) = patch_size
    return stack_patches(
        [(patchify(im, patch_size), (im.shape[0] // ph, im.shape[1] // pw)) for im in images], max_patches
    )


def size_for_max_patches(height: int, width: int, patch: int, max_patches: int, eps: float = 1e-5) -> tuple[int, int]:
    """The (H, W) an image of ``height`` x ``width`` is resized to: the largest scale (a bisection down to
    ``eps``) whose sides, each rounded up to a multiple of ``patch`` (at least one patch), give at most
    ``max_patches`` patches; transformers ``get_image_size_for_max_num_patches`` (SigLIP 2)."""

    def scaled(scale: float, size: int) -> int:
        return int(max(patch, math.ceil(size * scale / patch) * patch))

    lo, hi = eps / 10, 100.0
    while hi - lo >= eps:
        mid = (lo + hi) / 2
        if (scaled(mid, height) / patch) * (scaled(mid, width) / patch) <= max_patches:
            lo = mid
        else:
            hi = mid
    return scaled(lo, height), scaled(lo, width)


def resize(image, patch: int, max_patches: int, interpolation: str = "bilinear"):
    """One PIL image resized keeping its aspect ratio to ``size_for_max_patches`` with Pillow's
    ``interpolation`` (unchanged when it has that size already).

    Raises:
        ValueError: an image so long and thin that one patch across still needs more than ``max_patches``
            along it (transformers' processor fails on it).
    """
    h, w = size_for_max_patches(image.size[1], image.size[0], patch, max_patches)
    if (h // patch) * (w // patch) > max_patches:
        raise ValueError(
            f"an image of {image.size[0]}x{image.size[1]} pixels needs {h // patch}x{w // patch} patches at "
            f"the least, more than max_patches={max_patches}"
        )
    if (w, h) != image.size:
        from PIL import Image

        image = image.resize((w, h), getattr(Image.Resampling, interpolation.upper()))
    return image


def preprocess(image, patch: int, max_patches: int, channels: int = 3, preprocessing: Preprocess | None = None):
    """One PIL image -> (patches [h*w, P*P*C] float32, (h, w)): ``resize`` (``preprocessing.interpolation``,
    SigLIP 2's bilinear by default), rescaled and normalised (``vit_common.data.images.normalize``; default
    mean = std = 0.5), patchified; transformers ``Siglip2ImageProcessorPil`` bit for bit. ``stack_patches``
    makes a batch of them.

    Raises:
        ValueError: as ``resize``.
    """
    preprocessing = preprocessing or Preprocess(interpolation="bilinear")
    image = resize(to_channels(image, channels), patch, max_patches, preprocessing.interpolation)
    pixels = normalize(to_array(image, channels), preprocessing)  # [H, W, C] float32
    return patchify(pixels, (patch, patch)), (image.size[1] // patch, image.size[0] // patch)


def stack_patches(items: list[tuple[np.ndarray, tuple[int, int]]], max_patches: int):
    """(patches [n_i, P*P*C], (h_i, w_i)) per image -> a NaFlex batch of N = ``max_patches`` (patches zero
    padded, patch_mask, spatial_shapes), as ``pad_batch``.

    Raises:
        ValueError: an image with more than ``max_patches`` patches (named).
    """
    dim = items[0][0].shape[1]
    patches = np.zeros((len(items), max_patches, dim), np.float32)
    mask = np.zeros((len(items), max_patches), bool)
    for i, (p, _) in enumerate(items):
        if len(p) > max_patches:
            raise ValueError(f"image {i} has {len(p)} patches, more than {max_patches}")
        patches[i, : len(p)], mask[i, : len(p)] = p, True
    return patches, mask, np.array([hw for _, hw in items], np.int64).reshape(len(items), 2)


class NaFlexEvalBatches:
    """One pass over ``source`` (a dataset split: examples {"image": a file path, encoded bytes or a uint8
    array, "label"}) in order, in batches of at most ``batch_size`` (the last one shorter), each image
    through ``preprocess`` (square patches of ``patch`` pixels, at most ``preprocessing.max_patches``). A
    sequence, as ``vit_common.data.batches.EvalBatches``: ``batches[k]`` is {"image": (patches
    [b, N, P*P*C] float32, patch_mask [b, N] bool, spatial_shapes [b, 2] int64) with N the budget,
    "label" int32 [b], "mask" float32 [b] (ones)}.

    Raises:
        ValueError: an empty source, a batch size < 1, a preprocessing without max_patches; on reading,
            ``vit_common.data.stored_datasets.DataReadError`` naming an example that cannot be read, or
            does not fit the budget.
    """

    def __init__(self, source, batch_size: int, patch: int, channels: int, preprocessing: Preprocess):
        if len(source) == 0:
            raise ValueError("the evaluation set is empty")
        if batch_size < 1 or preprocessing.max_patches is None:
            raise ValueError(f"batch_size={batch_size}, max_patches={preprocessing.max_patches}: expected both >= 1")
        self.source, self.batch_size, self.patch, self.channels = source, batch_size, patch, channels
        self.preprocessing = preprocessing

    def __len__(self) -> int:
        return -(-len(self.source) // self.batch_size)

    def _example(self, image, rng=None) -> tuple[np.ndarray, tuple[int, int]]:
        return preprocess(
            as_image(image), self.patch, self.preprocessing.max_patches, self.channels, self.preprocessing
        )

    def __getitem__(self, k: int) -> dict:
        if not 0 <= k < len(self):
            raise IndexError(k)
        lo = k * self.batch_size
        rows = [
            read_example(self.source, i, self._example) for i in range(lo, min(lo + self.batch_size, len(self.source)))
        ]
        image = stack_patches([r[0] for r in rows], self.preprocessing.max_patches)
        return {
            "image": image,
            "label": np.array([r[1] for r in rows], np.int32),
            "mask": np.ones(len(rows), np.float32),
        }

    def __iter__(self):
        return (self[k] for k in range(len(self)))
