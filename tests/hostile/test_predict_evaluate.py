"""Hostile inputs to `vit predict` and `vit evaluate`: NaN weights, a decompression-bomb image, a FIFO,
a bad flag, a 1,000-class evaluation (its picture and counts bounded), a model without a head, and NaFlex
patch budgets (`vit attention`'s too): one beyond memory, one an image cannot fit, one for a fixed-size
model, a stored one that contradicts itself, an unknown position-table resize."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from vit_common.checkpoints.formats.canonical import FORMAT_TAG
from vit_common.config import ViTConfig
from vit_common.state import random_state

from .harness import SMALL, Case, bomb_png, check_case, flag, npz_dataset, ours, small_model, write_png


def nan_weights_predict(tmp: Path) -> list[str]:
    state = random_state(SMALL, scale=0.2)
    state["head.weight"][:] = np.nan
    ours(tmp / "nan.safetensors", SMALL.to_json(), state)
    return ["predict", str(tmp / "nan.safetensors"), str(write_png(tmp / "img.png"))]


def bomb_predict(tmp: Path) -> list[str]:
    return ["predict", str(small_model(tmp)), str(bomb_png(tmp / "bomb.png"))]


def fifo_image(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "img.png")
    return ["predict", str(small_model(tmp)), str(tmp / "img.png")]


def _many_classes(tmp: Path, k: int = 1000) -> tuple[Path, Path]:
    """A K-class model (ImageNet's count) and an npz dataset of K test images, one per class."""
    cfg = ViTConfig(image_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=k)
    model = ours(tmp / "k.safetensors", cfg.to_json(), random_state(cfg, scale=0.2))
    x = np.random.default_rng(0).integers(0, 256, (k, 8, 8), np.uint8)
    np.savez(tmp / "k.npz", x=x, y=np.arange(k), x_test=x, y_test=np.arange(k))
    return model, tmp / "k.npz"


# SMALL as a NaFlex model: no class token, its table resized per image as SigLIP 2's
NAFLEX = SMALL.replace(class_token=False, pool="gap", posemb_resample="bilinear_aa")


def naflex_model(tmp: Path, preprocess: dict | None = None, cfg: ViTConfig = NAFLEX) -> Path:
    """``cfg`` in our layout at ``tmp/n.safetensors``, its stored preprocessing a budget of 16 patches."""
    pre = {"mean": [0.5], "std": [0.5], "max_patches": 16} | (preprocess or {})
    meta = {"format": FORMAT_TAG, "vit_config": cfg.to_json(), "preprocess": json.dumps(pre)}
    save_file(random_state(cfg, scale=0.2), str(tmp / "n.safetensors"), meta)
    return tmp / "n.safetensors"


def naflex_predict(*flags: str, size: tuple[int, int] = (40, 24), label: str = "", command="predict", **model):
    """``vit predict`` (or ``vit attention``: ``command``) of a NaFlex model (``naflex_model(**model)``,
    ``label`` saying how it differs) on one PNG of (W, H) = ``size``."""

    def build(tmp: Path) -> list[str]:
        model_path, image = str(naflex_model(tmp, **model)), str(write_png(tmp / "img.png", size))
        if command == "attention":
            return ["attention", image, "--checkpoint", model_path, "--out", str(tmp / "a"), *flags]
        return ["predict", model_path, image, *flags]

    build.__name__ = " ".join(filter(None, [f"{command} NAFLEX", label, *flags, f"{size[0]}x{size[1]}"]))
    return build


def naflex_unreadable_image(tmp: Path) -> list[str]:
    """A NaFlex model on a .png holding no image: the line names the path once."""
    (tmp / "img.png").write_bytes(b"not an image")
    return ["predict", str(naflex_model(tmp)), str(tmp / "img.png")]


def headless_predict(tmp: Path) -> list[str]:
    cfg = SMALL.replace(num_classes=0)
    return [
        "predict",
        str(ours(tmp / "h.safetensors", cfg.to_json(), random_state(cfg))),
        str(write_png(tmp / "i.png")),
    ]


def naflex_npz_without_budget(tmp: Path) -> list[str]:
    """``vit predict`` of a big_vision NaFlex .npz, which declares no patch budget, without --max-patches."""
    from vit_common.checkpoints.convert import save_checkpoint
    from vit_common.checkpoints.formats.npz import NpzWriteOptions

    cfg, options = NAFLEX.replace(gelu="tanh"), NpzWriteOptions(naflex=True)
    save_checkpoint(tmp / "n.npz", cfg, random_state(cfg, scale=0.2), "big_vision", options=options)
    return ["predict", str(tmp / "n.npz"), str(write_png(tmp / "img.png"))]


def fixed_size_max_patches(tmp: Path) -> list[str]:
    return ["predict", str(small_model(tmp)), str(write_png(tmp / "img.png")), "--max-patches", "16"]


def fixed_size_attention_max_patches(tmp: Path) -> list[str]:
    image = str(write_png(tmp / "img.png"))
    return ["attention", image, "--checkpoint", str(small_model(tmp)), "--out", str(tmp / "a"), "--max-patches", "16"]


def evaluate_1000_classes(tmp: Path) -> list[str]:
    model, data = _many_classes(tmp)
    return ["evaluate", str(model), "--dataset", f"npz:{data}", "--confusion", str(tmp / "c.png")]


def evaluate_into(where: str):
    """``vit evaluate`` whose --confusion is ``where`` under a folder holding the user's notes.txt and
    photo.png (not vit's): refused before anything is evaluated, not after."""

    def build(tmp: Path) -> list[str]:
        (tmp / "notes.txt").write_text("mine\n")
        write_png(tmp / "photo.png")
        data = npz_dataset(tmp / "d.npz", [0, 1] * 4, [0, 1])
        return ["evaluate", str(small_model(tmp)), "--dataset", f"npz:{data}", "--confusion", str(tmp / where)]

    build.__name__ = f"evaluate --confusion {where}"
    return build


def _bounded_png(tmp: Path, out: str) -> None:
    """The picture is at most 2,000 px a side (it was 45,200), the line names where the counts are."""
    from PIL import Image

    assert max(Image.open(tmp / "c.png").size) <= 2000
    assert f"{tmp / 'c.png'} (1000 classes: a heat map without class labels; the counts: --confusion" in out
    assert "per class (1000 classes; the 10 lowest" in out


def evaluate_1000_classes_csv(tmp: Path) -> list[str]:
    model, data = _many_classes(tmp)
    return ["evaluate", str(model), "--dataset", f"npz:{data}", "--confusion", str(tmp / "c.csv"), "--json"]


def _counts_csv(tmp: Path, out: str) -> None:
    """The CSV and the JSON hold the same 1000 x 1000 counts, one image per true class."""
    import csv

    rows = list(csv.reader((tmp / "c.csv").open()))
    counts = np.array([r[1:] for r in rows[1:]], np.int64)
    assert rows[0][:3] == ["true/predicted", "0", "1"] and counts.shape == (1000, 1000)
    result = json.loads(out.splitlines()[0])
    assert np.array_equal(counts, np.array(result["confusion_matrix"])) and (counts.sum(1) == 1).all()
    assert result["accuracy"] == np.trace(counts) / 1000


CASES = [
    # silent wrong results
    Case(nan_weights_predict, r"{tmp}/nan.safetensors: the logits of {tmp}/img.png are NaN or Inf"),
    Case(flag("predict", "MODEL", "x.png", "--top-k", "-1"), r"--top-k: '-1': expected an integer"),
    # tracebacks instead of named errors
    Case(bomb_predict, r"{tmp}/bomb.png: unreadable image \(Image size \(400000000 pixels\) exceeds limit"),
    Case(fifo_image, r"{tmp}/img.png: a FIFO, expected a regular image file", child=True),
    Case(headless_predict, r"{tmp}/h.safetensors: the model has no classifier head \(num_classes 0\)"),
    # NaFlex budgets: memory is checked before any image is read (the batch of 100,000 patches once ran out)
    Case(
        naflex_predict("--max-patches", "100000"),
        r"{tmp}/n.safetensors: max_patches=100000 at a batch of 1 images needs about 80.1 GB \(attention over "
        r"100000 tokens\), beyond the limit of 4 GB",
        env={"VIT_MAX_BYTES": "4000000000"},
    ),
    Case(
        naflex_predict("--max-patches", "1", size=(9_000_000, 1)),
        r"{tmp}/img.png: an image of 9000000x1 pixels needs 1x2 patches at the least, more than max_patches=1",
    ),
    Case(naflex_unreadable_image, r"error: {tmp}/img.png: unreadable image \(cannot identify image file\)$"),
    Case(fixed_size_max_patches, r"{tmp}/m.safetensors: max_patches=16 for a fixed-size model \(preprocessing"),
    Case(
        naflex_npz_without_budget,
        r"{tmp}/n.npz: a NaFlex model whose file declares no patch budget \(a big_vision naflex_vit \.npz\): "
        r"expected max_patches \(--max-patches N\)",
    ),
    # vit attention runs a NaFlex model's images at their own aspect ratios: the same budgets refused
    Case(
        naflex_predict("--max-patches", "100000", command="attention"),
        r"{tmp}/n.safetensors: max_patches=100000 at a batch of 1 images needs about 80.1 GB",
        env={"VIT_MAX_BYTES": "4000000000"},
    ),
    Case(
        naflex_predict("--max-patches", "1", size=(9_000_000, 1), command="attention"),
        r"{tmp}/img.png: an image of 9000000x1 pixels needs 1x2 patches at the least, more than max_patches=1",
    ),
    Case(fixed_size_attention_max_patches, r"{tmp}/m.safetensors: max_patches=16 for a fixed-size model"),
    Case(
        naflex_predict(preprocess={"crop_pct": 0.9}, label="crop_pct 0.9"),
        r"{tmp}/n.safetensors metadata: the stored preprocessing .* is invalid \(max_patches=16 with resize_size=None, "
        r"crop_pct=0.9",
    ),
    Case(
        naflex_predict("--set", "posemb_resample=bicubic_spline"),
        r"{tmp}/n.safetensors: .*posemb_resample='bicubic_spline': expected one of",
    ),
    Case(
        naflex_predict(cfg=NAFLEX.replace(posemb="sincos2d", posemb_prefix=False), label="sincos2d"),
        r"{tmp}/n.safetensors: NaFlex input with posemb='sincos2d', rope='none': only a learned position table",
    ),
    # output that grows with the square of its input: bounded, the results first
    Case(
        evaluate_into("notes.txt/c.png"),
        r"{tmp}/notes.txt/c.png: cannot be written \({tmp}/notes.txt is not a folder\)",
    ),
    Case(evaluate_into("photo.png"), r"{tmp}/photo.png: exists and vit cannot tell it wrote it"),
    Case(  # refused: the folders of a relative --confusion are not made
        flag("evaluate", "MODEL", "--dataset", "npz:none.npz", "--confusion", "a/b/c.png"),
        r"none.npz: no such .npz file",
    ),
    Case(evaluate_1000_classes, "", code=0, child=True, check=_bounded_png, creates=("c.png",)),
    Case(evaluate_1000_classes_csv, "", code=0, child=True, check=_counts_csv, creates=("c.csv",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)
