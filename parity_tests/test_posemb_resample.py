"""Position-embedding resampling against the libraries each method is named after, and run-time
(dynamic image size) resampling against load-time resampling and timm's dynamic_img_size model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer

import vit_jax
import vit_torch
from vit_common.posemb import resample_matrices, resample_pos_embed
from vit_common.tolerance import compare

TORCH = {
    "bicubic_aa": dict(mode="bicubic", antialias=True),
    "bicubic": dict(mode="bicubic", antialias=False),
    "bilinear_aa": dict(mode="bilinear", antialias=True),
    "bilinear": dict(mode="bilinear", antialias=False),
    "bilinear_corners": dict(mode="bilinear", align_corners=True),
}
JAX = {"bicubic_aa": ("cubic", True), "bilinear_aa": ("linear", True), "bilinear": ("linear", False)}
GRIDS = [((14, 14), (24, 24)), ((14, 14), (7, 7)), ((5, 9), (11, 4)), ((2, 8), (4, 4)), ((7, 7), (3, 5))]


def _ours(grid: np.ndarray, dst, method) -> np.ndarray:
    wh, ww = resample_matrices(grid.shape[:2], dst, method)
    return np.einsum("yh,hwd,xw->yxd", wh, grid, ww)


def _torch(grid: np.ndarray, dst, method) -> np.ndarray:
    t = torch.from_numpy(grid).permute(2, 0, 1)[None]
    return F.interpolate(t, size=dst, **TORCH[method])[0].permute(1, 2, 0).numpy()


def _jax(grid: np.ndarray, dst, method) -> np.ndarray:
    name, aa = JAX[method]
    return np.asarray(jax.image.resize(jnp.asarray(grid), (*dst, grid.shape[-1]), name, antialias=aa))


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


# Bounds on max |ours - library| / max |library|. float64: the same arithmetic up to rounding, which proves
# the method is the library's. float32: the library's own float32 rounding; torch computes source
# coordinates in float32 (area_pixel_compute_source_index), about 1e-6 relative when upsampling 14 -> 24.
BOUND = {
    ("float64", "torch"): 1e-12,
    ("float64", "jax"): 1e-12,
    ("float64", "scipy"): 1e-12,
    ("float32", "torch"): 2e-6,
    ("float32", "jax"): 1e-6,
    ("float32", "scipy"): 1e-6,
}


@pytest.mark.slow
@pytest.mark.parametrize("src, dst", GRIDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_each_method_equals_the_library_it_is_named_after(src, dst, dtype, x64):
    grid = np.random.default_rng(0).standard_normal((*src, 64)).astype(dtype)
    for method in TORCH:
        ours = _ours(grid.astype(np.float64), dst, method)
        assert _rel(ours, _torch(grid, dst, method)) <= BOUND[dtype, "torch"], method
        if method in JAX:
            assert _rel(ours, _jax(grid, dst, method)) <= BOUND[dtype, "jax"], method
    zoom = scipy.ndimage.zoom(grid, (dst[0] / src[0], dst[1] / src[1], 1), order=1)  # big_vision / orig ViT
    assert _rel(_ours(grid.astype(np.float64), dst, "bilinear_corners"), zoom) <= BOUND[dtype, "scipy"]


@pytest.mark.parametrize("corners", [False, True])
@pytest.mark.parametrize("src, dst", GRIDS)
def test_bilinear_crop_is_radios_square_resize_then_crop(src, dst, corners):
    """'bilinear_crop' equals transformers RadioPatchEmbeddings: torch bilinear to a square of the larger
    side of the new grid, then its top-left rows and columns; 'bilinear_crop_corners' the same with
    ``align_corners=True`` (timm's C-RADIOv3 B and H)."""
    grid = np.random.default_rng(0).standard_normal((*src, 16))
    side = max(dst)
    t = torch.from_numpy(grid).permute(2, 0, 1)[None]
    square = F.interpolate(t, size=(side, side), mode="bilinear", align_corners=corners)[0]
    want = square[:, : dst[0], : dst[1]].permute(1, 2, 0).numpy()
    method = "bilinear_crop_corners" if corners else "bilinear_crop"
    assert _rel(_ours(grid, dst, method), want) <= BOUND["float64", "torch"]


@pytest.mark.slow
@pytest.mark.parametrize("dst", [(24, 24), (7, 7)])
def test_bicubic_flavours_on_a_b16_pos_embed(dst, x64):
    """(1, 197, 768) resampled 14x14 -> 24x24 and -> 7x7: torch bicubic (a=-0.75, no antialias) and jax
    cubic (a=-0.5, antialias) differ by a lot (~0.4 on unit-variance values); each of our named methods
    equals its library within the float32 bounds above, and the class row is kept bit for bit."""
    pe = np.random.default_rng(3).standard_normal((1, 197, 768)).astype(np.float32)
    grid = pe[0, 1:].reshape(14, 14, 768)
    torch_bicubic, jax_cubic = _torch(grid, dst, "bicubic"), _jax(grid, dst, "bicubic_aa")
    assert np.abs(torch_bicubic - jax_cubic).max() > 0.1  # the fault: two different methods
    for method, ref, lib in (
        ("bicubic", torch_bicubic, "torch"),
        ("bicubic_aa", jax_cubic, "jax"),
        ("bicubic_aa", _torch(grid, dst, "bicubic_aa"), "torch"),
    ):
        out = resample_pos_embed(pe, (14, 14), dst, num_prefix_tokens=1, method=method)
        assert out.shape == (1, 1 + dst[0] * dst[1], 768) and out.dtype == np.float32
        assert out[0, 0].tobytes() == pe[0, 0].tobytes()
        assert _rel(out[0, 1:].reshape(*dst, 768), ref) <= BOUND["float32", lib], method


def test_same_token_count_still_resamples_and_prefix_rows_are_kept():
    pe = np.random.default_rng(1).standard_normal((1, 5 + 16, 12))
    out = resample_pos_embed(pe, (2, 8), (4, 4), num_prefix_tokens=5, method="bilinear")
    assert out.shape == pe.shape and np.array_equal(out[:, :5], pe[:, :5])
    ref = _torch(pe[0, 5:].reshape(2, 8, 12), (4, 4), "bilinear").reshape(16, 12)
    assert np.abs(out[0, 5:] - ref).max() <= 1e-12 and np.abs(out[0, 5:] - pe[0, 5:]).max() > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("hw", [(48, 48), (32, 56)])
def test_run_time_equals_load_time_equals_timm_dynamic(tmp_path, hw, images, perturb, twin_logits):
    """A dynamic_img_size model given another image size resamples at run time with the same matrices
    as load-time resampling, and equals timm's dynamic_img_size model (bicubic, antialias)."""
    tm = perturb(
        VisionTransformer(
            img_size=32,
            patch_size=8,
            embed_dim=64,
            depth=2,
            num_heads=4,
            num_classes=10,
            reg_tokens=1,
            dynamic_img_size=True,
        )
    )
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, tmp_path / "t.safetensors")
    x = images(2, hw)
    with torch.no_grad():
        ref = tm(torch.from_numpy(x)).numpy()
    run_j, run_t = twin_logits(tmp_path / "t.safetensors", x, num_heads=4, dynamic_img_size=True)
    load_j, load_t = twin_logits(tmp_path / "t.safetensors", x, num_heads=4, image_size=hw)
    for name, got in (("run jax", run_j), ("run torch", run_t), ("load jax", load_j), ("load torch", load_t)):
        c = compare(name, got, ref, "tensor", "float32")
        assert c.ok, c
    assert compare("run vs load", run_t, load_t, "tensor", "float32").ok


def test_load_time_resampling_equal_in_both_twins(tmp_path, perturb):
    tm = perturb(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, num_classes=3))
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, tmp_path / "t.safetensors")
    mj = vit_jax.load_model(tmp_path / "t.safetensors", image_size=(16, 64), num_heads=4)
    mt = vit_torch.load_model(tmp_path / "t.safetensors", image_size=(16, 64), num_heads=4)
    assert np.asarray(mj.pos_embed[...]).tobytes() == mt.pos_embed.detach().numpy().tobytes()
    assert mj.cfg.image_size == mt.cfg.image_size == (16, 64)
