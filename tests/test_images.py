"""The one image path (vit_common.data.images): EXIF orientation, every Pillow mode, resize and crop as timm and
transformers do them, normalisation, folders."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vit_common.data.augment import Augment, ImageTransform, random_resized_crop
from vit_common.data.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    PRESETS,
    Preprocess,
    eval_resize_crop,
    list_images,
    load_image,
    normalize,
    open_image,
    to_array,
    to_channels,
)


def photo(h: int = 45, w: int = 70, seed: int = 0) -> np.ndarray:
    """A smooth, asymmetric RGB picture (gradients plus a bright block in the top-left corner)."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([255 * x / w, 255 * y / h, 128 + 60 * np.sin(x / 5.0)], -1)
    img[: h // 3, : w // 4] = [250, 240, 10]
    return np.clip(img + np.random.default_rng(seed).normal(0, 3, img.shape), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_exif_orientation_6_is_read_upright(tmp_path, suffix):
    """A camera stores a portrait sideways with orientation 6 ('rotate 90 degrees clockwise to view'):
    every command must see the upright picture."""
    upright = Image.fromarray(photo())
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # what the sensor wrote: turned counter-clockwise
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / f"sideways{suffix}"
    stored.save(path, exif=exif, **({"quality": 95} if suffix == ".jpg" else {}))
    got = np.asarray(open_image(path), np.float64)
    assert got.shape == (45, 70, 3)
    diff = np.abs(got - np.asarray(upright, np.float64)).mean()
    assert diff < (8.0 if suffix == ".jpg" else 1e-12), diff  # JPEG loses a little; sideways would not fit
    x = load_image(path, (45, 70), 3, Preprocess())  # the path of train, evaluate, predict, attention, parity
    assert np.abs(x.astype(np.float64) - np.asarray(upright)).mean() < 8.0


def test_modes_convert_to_grey_or_rgb(tmp_path):
    rgb = photo(8, 10)
    # palette with a transparent index: composited onto white, as transformers' convert_to_rgb does
    pal = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    pal.info["transparency"] = int(np.asarray(pal)[0, 0])
    out = to_array(to_channels(pal, 3), 3)
    assert out.shape == (8, 10, 3) and (out[0, 0] == 255).all()
    # RGBA: alpha 0 -> white, alpha 255 -> the colour, alpha 128 -> halfway
    rgba = np.dstack([np.full((2, 3, 3), 100, np.uint8), np.array([[0, 255, 128]] * 2, np.uint8)])
    out = to_array(to_channels(Image.fromarray(rgba, "RGBA"), 3), 3)
    np.testing.assert_array_equal(out[0, 0], [255] * 3)
    np.testing.assert_array_equal(out[0, 1], [100] * 3)
    assert abs(int(out[0, 2, 0]) - round(100 * 128 / 255 + 255 * 127 / 255)) <= 1
    assert to_array(to_channels(Image.fromarray(rgba, "RGBA"), 1), 1).shape == (2, 3, 1)
    # LA (grey + alpha), bilevel, CMYK (a JPEG written in CMYK reads back close to the RGB picture)
    la = Image.fromarray(np.dstack([np.full((2, 2), 50, np.uint8), np.array([[0, 255]] * 2, np.uint8)]), "LA")
    np.testing.assert_array_equal(to_array(to_channels(la, 1), 1)[..., 0], [[255, 50]] * 2)
    assert to_array(to_channels(Image.fromarray(rgb).convert("1"), 3), 3).shape == (8, 10, 3)
    Image.fromarray(rgb).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=98)
    back = open_image(tmp_path / "cmyk.jpg")
    assert back.mode == "CMYK"
    assert np.abs(to_array(to_channels(back, 3), 3).astype(int) - rgb).mean() < 4
    with pytest.raises(ValueError, match="channels=2"):
        to_channels(back, 2)


def test_sixteen_bit_greyscale_is_scaled_not_clipped(tmp_path):
    eight = np.arange(0, 256, 4, dtype=np.uint8).reshape(8, 8)
    Image.fromarray(eight.astype(np.uint16) * 257).save(tmp_path / "d16.png")  # 16-bit PNG, same picture
    with Image.open(tmp_path / "d16.png") as im:
        assert im.mode.startswith("I")
    np.testing.assert_array_equal(load_image(tmp_path / "d16.png", (8, 8), 1, Preprocess())[..., 0], eight)
    np.testing.assert_array_equal(load_image(tmp_path / "d16.png", (8, 8), 3, Preprocess())[..., 2], eight)


@pytest.mark.parametrize(
    "size, preprocess",
    [
        (224, PRESETS["imagenet"]),  # DeiT / timm: bicubic, crop 0.9, shorter side
        (64, Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bilinear", 0.875, "center")),
        (48, Preprocess((0.5,), (0.5,), "bicubic", 0.95, "squash")),
    ],
)
@pytest.mark.parametrize("hw", [(300, 250), (250, 300), (200, 200)])
def test_evaluation_pixels_equal_timm_s_eval_transform(tmp_path, size, preprocess, hw):
    """timm's own evaluation transform (torchvision Resize + CenterCrop + ToTensor + Normalize on Pillow
    images) gives the same tensor, to the last bit."""
    from timm.data import create_transform

    path = tmp_path / "p.png"
    Image.fromarray(photo(*hw)).save(path)
    mean, std = preprocess.channel_stats(3)
    tf = create_transform(
        size,
        interpolation=preprocess.interpolation,
        crop_pct=preprocess.crop_pct,
        crop_mode=preprocess.crop_mode,
        mean=tuple(mean.tolist()),
        std=tuple(std.tolist()),
    )
    with Image.open(path) as im:
        ref = tf(im.convert("RGB")).numpy().transpose(1, 2, 0)
    ours = normalize(load_image(path, (size, size), 3, preprocess), preprocess)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("hw", [(300, 250), (224, 224)])
def test_evaluation_pixels_equal_transformers_vit_processor(tmp_path, hw):
    """transformers' ViTImageProcessor (Pillow backend) defaults: bilinear resize to 224x224, rescale by
    1/255, normalise 0.5/0.5. It multiplies by 1/255 where we divide: within one float32 rounding step."""
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    path = tmp_path / "p.png"
    Image.fromarray(photo(*hw)).save(path)
    with Image.open(path) as im:
        ref = ViTImageProcessorPil()(im.convert("RGB"), return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
    pp = PRESETS["hf_vit"]
    ours = normalize(load_image(path, (224, 224), 3, pp), pp)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-6)


def torchvision_box(monkeypatch, im, area_u: float, ratio_u: float, top: int, left: int) -> tuple:
    """torchvision's RandomResizedCrop.get_params with torch's random draws replaced by the given ones."""
    from torchvision.transforms import RandomResizedCrop

    uniforms, ints = iter([torch.tensor([area_u]), torch.tensor([ratio_u])]), iter([top, left])

    class Draw:
        def uniform_(self, a, b):
            return next(uniforms)

    with monkeypatch.context() as m:
        m.setattr(torch, "empty", lambda *a, **k: Draw())
        m.setattr(torch, "randint", lambda *a, **k: torch.tensor([next(ints)]))
        return RandomResizedCrop.get_params(im, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))


def test_random_resized_crop_draws_as_torchvision(monkeypatch):
    """The same uniform draws as torchvision's RandomResizedCrop.get_params give the same box: checked by
    replaying our generator's draws through torchvision."""
    im = Image.fromarray(photo(120, 90))
    checked = 0
    for seed in range(20):
        out = random_resized_crop(im, (32, 32), np.random.default_rng(seed), interpolation="bilinear")
        assert out.size == (32, 32)
        draws = np.random.default_rng(seed)  # the same stream, replayed: area, log-ratio, then top, left
        area_u, ratio_u = draws.uniform(0.08, 1.0), draws.uniform(np.log(3 / 4), np.log(4 / 3))
        target, aspect = 120 * 90 * area_u, np.exp(ratio_u)
        w, h = int(round(np.sqrt(target * aspect))), int(round(np.sqrt(target / aspect)))
        if not (0 < w <= 90 and 0 < h <= 120):
            continue  # needed a second try
        top, left = int(draws.integers(0, 120 - h + 1)), int(draws.integers(0, 90 - w + 1))
        assert torchvision_box(monkeypatch, im, area_u, ratio_u, top, left) == (top, left, h, w)
        ref = im.resize((32, 32), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
        checked += 1
    assert checked >= 10
    thin = Image.fromarray(photo(4, 200))  # no crop of ratio 3/4..4/3 fits 10 times: centre crop fallback
    out = random_resized_crop(thin, (8, 8), np.random.default_rng(0), scale=(0.9, 1.0))
    assert out.size == (8, 8)


def test_training_crops_resize_floats_where_the_preprocessing_says():
    """With ``rescale_before_resize`` a training example (random-resized crop, flip) is float32 from the
    same draws as the uint8 one, within 1.5 levels of it once clipped to [0, 255] (the uint8 resize
    clips bicubic's overshoot and rounds after each of its two passes); a float rotation is the uint8
    one unrounded (Pillow's uint8 affine truncates)."""
    pp = PRESETS["imagenet"].replace(rescale_before_resize=True)
    augment = Augment(crop_scale=0.3, flip=True)
    x = photo(60, 80)
    for seed in range(3):
        floats = ImageTransform((24, 32), 3, pp, augment)(x, np.random.default_rng(seed))
        uint8 = ImageTransform((24, 32), 3, pp.replace(rescale_before_resize=False), augment)(
            x, np.random.default_rng(seed)
        )
        assert floats.dtype == np.float32 and uint8.dtype == np.uint8 and floats.shape == (24, 32, 3)
        diff = np.abs(np.clip(floats, 0, 255) - uint8)
        assert diff.max() <= 1.5 and 0 < diff.mean() < 0.5, (diff.max(), diff.mean())  # measured 1.09, 0.28
    rotate = Augment(rotate=10, scale=0.1, shift=2)
    floats, uint8 = (rotate.image(im, np.random.default_rng(0)) for im in (x.astype(np.float32), x))
    assert floats.dtype == np.float32 and 0 <= (floats - uint8).min() and (floats - uint8).max() <= 1.0


def test_normalize_and_preprocess_checks():
    x = np.random.default_rng(0).integers(0, 256, (2, 5, 7, 3), dtype=np.uint8)
    p = PRESETS["imagenet"]
    ref = (x.astype(np.float32) / np.float32(255) - np.float32(p.mean)) / np.float32(p.std)
    np.testing.assert_array_equal(normalize(x, p), ref)
    np.testing.assert_array_equal(normalize(np.array([[0], [255]], np.uint8)), [[-1.0], [1.0]])
    with pytest.raises(ValueError, match="give 3 channels, the model has 1"):
        normalize(x[..., :1], p)
    for bad, match in [
        (dict(std=(0.0,), mean=(0.5,)), "std=\\[0.0\\]"),
        (dict(interpolation="cubic"), "interpolation='cubic'"),
        (dict(crop_pct=1.2), "crop_pct=1.2"),
        (dict(crop_mode="border"), "crop_mode='border'"),
        (dict(mean=(0.5, 0.5)), "the same number"),
    ]:
        with pytest.raises(ValueError, match=match):
            Preprocess(**bad)
    assert Preprocess.from_dict(p.to_dict()) == p


def test_eval_geometry_keeps_an_image_at_the_size_and_crops_the_centre():
    im = Image.fromarray(photo(10, 12))
    assert eval_resize_crop(im, (10, 12), Preprocess()) is im
    out = eval_resize_crop(Image.fromarray(photo(20, 40)), (16, 16), Preprocess(crop_mode="center"))
    assert out.size == (16, 16)


def test_list_images_walks_folders_like_training(tmp_path):
    for rel in ("train/cat/1.png", "train/dog/2.JPG", "val/cat/3.png", ".hidden/4.png", "train/.x.png"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo(4, 4)).save(tmp_path / rel, format="PNG")
    (tmp_path / "notes.txt").write_text("not an image")
    found = [p.relative_to(tmp_path).as_posix() for p in list_images(tmp_path)]
    assert found == ["train/cat/1.png", "train/dog/2.JPG", "val/cat/3.png"]
    assert list_images([tmp_path / "val/cat/3.png", tmp_path / "train"])[0].name == "3.png"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        list_images(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no image files"):
        list_images(tmp_path / "empty")
    with pytest.raises(ValueError, match="unreadable image"):
        open_image(tmp_path / "notes.txt")
