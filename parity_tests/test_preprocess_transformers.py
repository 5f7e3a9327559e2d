"""Evaluation preprocessing against transformers' image processors, the reference: a
preprocessor_config.json read by ``hf_preprocess`` and applied by the one image path
(``load_image`` + ``normalize``) gives the pixels ``AutoImageProcessor`` gives from the same folder, on
skimage's photos (and a grey one, and an odd-aspect crop), per processor type and for non-default
configs; a written config builds a processor giving the same pixels; do_rescale false gives transformers'
pipeline probabilities."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import skimage
from PIL import Image
from transformers import AutoImageProcessor

from vit_common.checkpoints.metadata import hf_preprocess_file, hf_preprocessor_config
from vit_common.data.images import IMAGENET_MEAN, IMAGENET_STD, Preprocess, load_image, normalize
from vit_common.tolerance import tolerance

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "camera.png")  # camera: grey
CONFIGS = {
    "vit": {"image_processor_type": "ViTImageProcessor"},
    "deit": {"image_processor_type": "DeiTImageProcessor"},
    "siglip": {"image_processor_type": "SiglipImageProcessor"},
    "clip": {"image_processor_type": "CLIPImageProcessor"},
    "bit": {"image_processor_type": "BitImageProcessor"},  # DINOv2's
    "no_rescale": {"image_processor_type": "ViTImageProcessor", "do_rescale": False},
    "factor": {"image_processor_type": "ViTImageProcessorFast", "rescale_factor": 1 / 127.5, "image_mean": [1] * 3},
    "shortest_edge_bilinear": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 256},
                               "resample": 2},
    # transformers v4's file: int sizes (DeiT squares them), a crop_pct these classes do not read, bilinear
    "deit_v4": {"feature_extractor_type": "DeiTFeatureExtractor", "size": 256, "crop_size": 224, "crop_pct": 0.9,
                "resample": 2},
    "lanczos_no_normalize": {"image_processor_type": "SiglipImageProcessorPil", "resample": 1, "do_normalize": False},
    "nearest": {"image_processor_type": "ViTImageProcessor", "resample": 0},
    "crop_over_resize": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 199}},
}  # fmt: skip
TORCHVISION_DEPARTS = ("nearest", "crop_over_resize")  # see vit_common/tolerance.py


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Path]:
    data = Path(skimage.data_dir)
    odd = tmp_path_factory.mktemp("photos") / "astronaut_173x301.png"
    Image.open(data / "astronaut.png").crop((37, 11, 37 + 173, 11 + 301)).save(odd)
    return [data / name for name in PHOTOS] + [odd]


def _levels(ours: np.ndarray, theirs: np.ndarray, pp: Preprocess) -> float:
    """max |ours - theirs| in uint8 levels (mean and std, then the rescale, undone)."""
    std = np.broadcast_to(np.asarray(pp.std, np.float64), (3,))
    return float((np.abs(ours.astype(np.float64) - theirs) * std / pp.rescale_factor).max())


def _compare(folder: Path, pp: Preprocess, photos: list[Path], backend: str) -> float:
    proc = AutoImageProcessor.from_pretrained(folder, backend=backend)
    worst = 0.0
    for path in photos:
        theirs = proc(images=Image.open(path).convert("RGB"), return_tensors="np")["pixel_values"][0]
        ours = normalize(load_image(path, (224, 224), 3, pp)[None], pp)[0]
        assert ours.shape == theirs.shape[1:] + (3,), (path, ours.shape, theirs.shape)
        worst = max(worst, _levels(ours, theirs.transpose(1, 2, 0), pp))
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_pixels_equal_the_transformers_processor(tmp_path, photos, name):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(CONFIGS[name]))
    pp = hf_preprocess_file(tmp_path)
    assert _compare(tmp_path, pp, photos, "pil") == tolerance("pixels_pil", "uint8")[1]
    if name not in TORCHVISION_DEPARTS:
        fast = _compare(tmp_path, pp, photos[::2], "torchvision")
        assert fast <= tolerance("pixels_torchvision", "uint8")[1], fast


@pytest.mark.parametrize(
    "pp",
    [
        Preprocess((0.5,), (0.5,), "bilinear", 1.0, "squash"),  # timm's rule, written as ViTImageProcessor
        Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", 0.875, "squash"),  # 256 -> 224, offset 16 in both
        Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", 1.0, "center", resize_size=(250,), crop_size=(224, 224)),
        Preprocess((0.5,), (0.5,), "bicubic", rescale_factor=1.0, resize_size=(224, 224)),
    ],
    ids=["timm_squash", "timm_squash_crop", "shortest_edge", "no_rescale"],
)
def test_a_written_config_builds_the_processor_that_gives_the_same_pixels(tmp_path, photos, pp):
    config, notes = hf_preprocessor_config(pp, (224, 224), 3)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    back = hf_preprocess_file(tmp_path)
    assert back == pp if pp.resize_size else not notes
    assert _compare(tmp_path, pp, photos, "pil") == 0.0


@pytest.mark.slow
def test_do_rescale_false_gives_the_pipeline_s_probabilities(tmp_path, photos, capsys):
    """A folder whose processor feeds 0..255 (normalised): `vit predict` gives the probabilities of
    transformers' pipeline; dividing by 255 anyway (what was read before) is far off."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor, pipeline

    from vit_cli.main import main

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=5, initializer_range=0.3,
    )  # fmt: skip
    ViTForImageClassification(cfg).eval().save_pretrained(tmp_path / "m")
    ViTImageProcessor(size={"height": 32, "width": 32}, do_rescale=False).save_pretrained(tmp_path / "m")
    proc = AutoImageProcessor.from_pretrained(tmp_path / "m", backend="pil")
    classify = pipeline("image-classification", model=str(tmp_path / "m"), image_processor=proc, device="cpu")
    theirs = np.array([[r["score"] for r in sorted(rows, key=lambda r: r["label"])] for rows in
                       classify([str(p) for p in photos], top_k=5)])  # fmt: skip

    def predict(*flags: str) -> np.ndarray:
        assert main(["predict", str(tmp_path / "m"), *map(str, photos), "--framework", "torch", "--top-k", "5",
                     "--json", *flags]) == 0  # fmt: skip
        rows = [json.loads(line)["top"] for line in capsys.readouterr().out.splitlines()]
        return np.array([[r["probability"] for r in sorted(top, key=lambda r: r["class"])] for top in rows])

    ours, before = predict(), predict("--rescale-factor", str(1 / 255))
    kind, bound = tolerance("tensor", "float32")
    assert np.abs(ours - theirs).max() <= bound, np.abs(ours - theirs).max()
    # measured: 6.6e-8 now; 0.94 before, top-1 agreement 1 of 6 images
    assert np.abs(before - theirs).max() > 0.5, np.abs(before - theirs).max()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        pytest.param(
            {"size": {"shortest_edge": 250}, "do_center_crop": True, "crop_size": {"height": 224, "width": 224}},
            marks=pytest.mark.slow,
        ),
    ],
    ids=["saved_default", "shortest_edge_crop"],
)
def test_dinov3_processor_resizes_floats(tmp_path, photos, kw):
    """DINOv3ViTImageProcessor rescales before it resizes (torchvision, float32): read from the file
    save_pretrained writes, the float resize is its pixels to float32 rounding, where the uint8 resize
    the other processors make is a level off; written back, it is the same processor."""
    from transformers import DINOv3ViTImageProcessor

    DINOv3ViTImageProcessor(**kw).save_pretrained(tmp_path)
    pp = hf_preprocess_file(tmp_path)
    assert pp.rescale_before_resize and pp.mean == IMAGENET_MEAN and pp.interpolation == "bilinear"
    floats = _compare(tmp_path, pp, photos, "torchvision")
    assert floats <= tolerance("pixels_float_resize", "uint8")[1], floats  # measured 3.6e-3
    uint8 = _compare(tmp_path, pp.replace(rescale_before_resize=False), photos, "torchvision")
    assert uint8 >= 0.5, uint8  # measured 1.0
    config, _ = hf_preprocessor_config(pp, (224, 224), 3)
    assert config["image_processor_type"] == "DINOv3ViTImageProcessor"
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    assert hf_preprocess_file(tmp_path) == pp


def test_dataset_pixels_resize_floats_as_the_dinov3_processor(tmp_path):
    """`vit evaluate`'s pipeline (``load_dataset`` + ``EvalBatches``) with a DINOv3 processor's file gives
    transformers' pixels to the float resize's tolerance, for image files and for an npz dataset of
    uint8 arrays; resized as uint8 (the flag off) it is a level off."""
    from transformers import DINOv3ViTImageProcessor

    from vit_common.data.augment import ImageTransform
    from vit_common.data.batches import EvalBatches
    from vit_common.data.datasets import load_dataset

    rng = np.random.default_rng(0)
    shapes = ((50, 70), (97, 61), (130, 130))
    images = [rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for hw in shapes]
    for split in ("train", "val"):
        for k, x in enumerate(images):
            (tmp_path / "photos" / split / f"c{k}").mkdir(parents=True)
            Image.fromarray(x).save(tmp_path / "photos" / split / f"c{k}" / "a.png")
    square = [x[:40, :40] for x in images]
    np.savez(tmp_path / "squares.npz", x=np.stack(square), y=np.arange(3),
             x_test=np.stack(square), y_test=np.arange(3))  # fmt: skip
    DINOv3ViTImageProcessor(size={"height": 64, "width": 64}).save_pretrained(tmp_path / "m")
    pp = hf_preprocess_file(tmp_path / "m")
    proc = AutoImageProcessor.from_pretrained(tmp_path / "m", backend="torchvision")

    def worst(spec: str, originals: list[np.ndarray], pp: Preprocess) -> float:
        data = load_dataset(spec, (64, 64), 3, preprocess=pp)
        batch = EvalBatches(data.test, data.num_classes, 4, ImageTransform((64, 64), 3, pp))[0]
        theirs = proc(images=[Image.fromarray(x) for x in originals], return_tensors="np")["pixel_values"]
        assert batch["mask"].tolist() == [1, 1, 1, 0]
        return _levels(batch["image"][:3], theirs.transpose(0, 2, 3, 1), pp)

    for spec, originals in (
        (f"imagefolder:{tmp_path / 'photos'}", images),
        (f"npz:{tmp_path / 'squares.npz'}", square),
    ):
        floats = worst(spec, originals, pp)
        assert floats <= tolerance("pixels_float_resize", "uint8")[1], (spec, floats)  # measured 6.8e-5
        uint8 = worst(spec, originals, pp.replace(rescale_before_resize=False))
        assert uint8 >= 0.5, (spec, uint8)  # measured 0.98, 1.0
