"""Position embeddings: fixed 2-D sin-cos tables and grid resampling, in numpy, used by both twins.

Resampling is separable, so every method is a pair of matrices ``Wh`` (H_out, H_in) and ``Ww``
(W_out, W_in); the new grid is ``einsum("yh,hwd,xw->yxd", Wh, grid, Ww)``. The twins apply the same
matrices with their own einsum at run time (dynamic image size), so load-time and run-time resampling
are one implementation.

Methods, each named after what it reproduces exactly (align_corners=False unless stated):

=================== ================================================================================
``bicubic_aa``      torch ``F.interpolate(mode="bicubic", antialias=True)`` == ``jax.image.resize(
                    method="cubic")`` (antialias on) == PIL; Keys cubic a=-0.5, kernel widened by
                    the scale when shrinking, weights renormalised at the border. timm's load-time
                    default (``resample_abs_pos_embed``).
``bicubic``         torch ``F.interpolate(mode="bicubic", antialias=False)``: Keys a=-0.75, fixed
                    4-tap kernel, border samples clamped.
``bilinear_aa``     torch bilinear with antialias=True == jax ``linear`` (antialias on).
``bilinear``        torch bilinear, antialias=False == jax ``linear`` with antialias=False. timm's
                    ``.npz`` loader.
``bilinear_corners`` corner-aligned bilinear: torch ``align_corners=True`` == ``scipy.ndimage.zoom(
                    order=1)``, used by big_vision and the original ViT when fine-tuning at a new size.
``bilinear_crop``   torch bilinear (antialias=False) to a square of the larger side of the new grid,
                    then its top-left rows and columns: RADIO's cropped position embedding
                    (transformers ``RadioPatchEmbeddings``); a method of both axes (``resample_matrices``).
``bilinear_crop_corners`` the same with corner-aligned bilinear (``align_corners=True``): timm's C-RADIOv3
                    B and H NaFlexVits (``pos_embed_ar_preserving`` with ``pos_embed_align_corners``).
=================== ================================================================================
"""

from __future__ import annotations

import numpy as np

METHODS = (
    "bicubic_aa",
    "bicubic",
    "bilinear_aa",
    "bilinear",
    "bilinear_corners",
    "bilinear_crop",
    "bilinear_crop_corners",
)
# a method of both axes -> the one-axis method resizing to the square of the larger side before the crop
CROPPED = {"bilinear_crop": "bilinear", "bilinear_crop_corners": "bilinear_corners"}


def _keys_cubic(x: np.ndarray, a: float) -> np.ndarray:
    """Keys (1981) cubic convolution kernel with parameter ``a``, evaluated at |x|."""
    x = np.abs(x)
    return np.where(
        x <= 1.0,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        np.where(x < 2.0, (((x - 5.0) * x + 8.0) * x - 4.0) * a, 0.0),
    )


def _triangle(x: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, 1.0 - np.abs(x))


def resample_matrix(n_in: int, n_out: int, method: str) -> np.ndarray:
    """The (n_out, n_in) float64 matrix that resamples one axis from n_in to n_out samples (not the
    cropped methods, ``CROPPED``, which need both axes: ``resample_matrices``).

    Raises:
        ValueError: unknown method or a non-positive size.
    """
    if method not in METHODS or method in CROPPED:
        raise ValueError(f"resample method {method!r}: expected one of {METHODS}")
    if n_in < 1 or n_out < 1:
        raise ValueError(f"resample sizes must be >= 1, got n_in={n_in}, n_out={n_out}")
    out = np.arange(n_out, dtype=np.float64)
    src = np.arange(n_in, dtype=np.float64)
    w = np.zeros((n_out, n_in), np.float64)
    if method == "bilinear_corners":
        pos = out * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(1)
        i0 = np.clip(np.floor(pos).astype(int), 0, n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        frac = pos - i0
        np.add.at(w, (np.arange(n_out), i0), 1.0 - frac)
        np.add.at(w, (np.arange(n_out), i1), frac)
        return w
    scale = n_in / n_out
    center = (out + 0.5) * scale - 0.5  # half-pixel source coordinate of each output sample
    if method.endswith("_aa"):
        # PIL / torch antialias / jax.image.scale_and_translate: kernel stretched by the scale when
        # shrinking, taps outside the input dropped, weights renormalised to sum to one.
        stretch = max(scale, 1.0)
        x = (src[None, :] - center[:, None]) / stretch
        w = _keys_cubic(x, -0.5) if method == "bicubic_aa" else _triangle(x)
        return w / w.sum(axis=1, keepdims=True)
    if method == "bilinear":  # torch upsample_bilinear2d: source index clamped at 0, neighbour clamped
        pos = np.maximum(center, 0.0)
        i0 = np.minimum(np.floor(pos).astype(int), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        frac = pos - i0
        np.add.at(w, (np.arange(n_out), i0), 1.0 - frac)
        np.add.at(w, (np.arange(n_out), i1), frac)
        return w
    # bicubic: torch upsample_bicubic2d, a=-0.75, four taps around floor(center), indices clamped.
    base = np.floor(center).astype(int)
    t = center - base
    for k in range(-1, 3):
        idx = np.clip(base + k, 0, n_in - 1)
        np.add.at(w, (np.arange(n_out), idx), _keys_cubic(t - k, -0.75))
    return w


def resample_matrices(
    src_grid: tuple[int, int], dst_grid: tuple[int, int], method: str
) -> tuple[np.ndarray, np.ndarray]:
    """(Wh (H_out, H_in), Ww (W_out, W_in)) float64 for a grid change; identities if equal (for
    the cropped methods, ``CROPPED``, where the grid is square).

    Raises:
        ValueError: unknown method or a non-positive size.
    """
    if method in CROPPED:  # to a square of the larger side, then the top-left crop
        side = max(dst_grid)
        wh, ww = (resample_matrix(n, side, CROPPED[method]) for n in src_grid)
        return wh[: dst_grid[0]], ww[: dst_grid[1]]
    return (
        resample_matrix(src_grid[0], dst_grid[0], method),
        resample_matrix(src_grid[1], dst_grid[1], method),
    )


def resample_pos_embed(
    pos_embed: np.ndarray,
    src_grid: tuple[int, int],
    dst_grid: tuple[int, int],
    num_prefix_tokens: int = 0,
    method: str = "bicubic_aa",
) -> np.ndarray:
    """Resample a position embedding from one patch grid to another.

    Args:
        pos_embed: (1, L, D) or (L, D), any float dtype; the first ``num_prefix_tokens`` rows belong to
            class/register tokens and are kept unchanged, the other H_in*W_in rows are row-major patches.
        src_grid: (H_in, W_in) patch grid of ``pos_embed``; always given, never guessed from L.
        dst_grid: (H_out, W_out).
        num_prefix_tokens: rows to split off and keep.
        method: one of ``METHODS``.

    Returns:
        An array of the input's rank and dtype with ``num_prefix_tokens + H_out*W_out`` rows. Arithmetic
        is float64.

    Raises:
        ValueError: if L does not equal num_prefix_tokens + H_in*W_in, or for an unknown method.
    """
    arr = np.asarray(pos_embed)
    squeeze = arr.ndim == 2
    if squeeze:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[0] != 1:
        raise ValueError(f"pos_embed shape {np.shape(pos_embed)}: expected (1, L, D) or (L, D)")
    (hi, wi), (ho, wo) = tuple(src_grid), tuple(dst_grid)
    length = arr.shape[1]
    if length != num_prefix_tokens + hi * wi:
        raise ValueError(
            f"pos_embed has {length} rows but num_prefix_tokens={num_prefix_tokens} + grid {hi}x{wi} "
            f"= {num_prefix_tokens + hi * wi}"
        )
    prefix, grid = arr[:, :num_prefix_tokens], arr[0, num_prefix_tokens:]
    wh, ww = resample_matrices((hi, wi), (ho, wo), method)
    grid = grid.astype(np.float64).reshape(hi, wi, -1)  # [H_in, W_in, D]
    new = np.einsum("yh,hwd,xw->yxd", wh, grid, ww).reshape(1, ho * wo, -1)  # [1, H_out*W_out, D]
    out = np.concatenate([prefix.astype(np.float64), new], axis=1).astype(arr.dtype)
    return out[0] if squeeze else out


def sincos2d(
    grid: tuple[int, int], width: int, temperature: float = 10_000.0, convention: str = "big_vision"
) -> np.ndarray:
    """Fixed 2-D sin-cos position embedding, (H*W, D) float64, rows in row-major patch order.

    Columns are [sin(x w), cos(x w), sin(y w), cos(y w)] (x the column index, y the row index) with, by
    ``convention``:

    - ``"big_vision"``: w_i = temperature^(-i/(D/4-1)), big_vision ``models/vit.py`` ``posemb_sincos_2d``
      (``posemb='sincos2d'``);
    - ``"mae"``: w_i = temperature^(-i/(D/4)), MAE's ``get_2d_sincos_pos_embed`` and transformers'
      ``build_2d_sinusoidal_position_embedding`` as HF AIMv2 (``is_native``) uses it, x columns first
      (``posemb='sincos2d_mae'``).

    Raises:
        ValueError: if width is not a multiple of 4 or is 4, or for an unknown convention.
    """
    if width % 4 or width < 8:
        raise ValueError(f"sincos2d needs width divisible by 4 and >= 8, got {width}")
    if convention not in ("big_vision", "mae"):
        raise ValueError(f"sincos2d convention={convention!r}: expected 'big_vision' or 'mae'")
    h, w = grid
    y, x = np.mgrid[:h, :w]
    quarter = width // 4
    omega = 1.0 / temperature ** (np.arange(quarter) / (quarter - 1 if convention == "big_vision" else quarter))
    ox = np.einsum("m,d->md", x.reshape(-1).astype(np.float64), omega)
    oy = np.einsum("m,d->md", y.reshape(-1).astype(np.float64), omega)
    return np.concatenate([np.sin(ox), np.cos(ox), np.sin(oy), np.cos(oy)], axis=1)


# posemb field value -> sincos2d convention
SINCOS_CONVENTIONS = {"sincos2d": "big_vision", "sincos2d_mae": "mae"}
