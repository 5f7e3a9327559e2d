"""Hostile and broken inputs, each built here: every one is refused with exit 2 and one error line naming
it (or, where it is fine, handled exactly), with no traceback, no file of the user's changed and nothing
left behind; those that used to exhaust the machine or hang run in a child process under a time limit
and a peak-memory bound.

README's "Hostile inputs" line reports ``counts()``; a test keeps the two equal. A crash, hang, silent
result or lost file fails its test, so the counts of those are zero whenever this suite passes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from vit_cli.main import main
from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.canonical import FORMAT_TAG
from vit_common.config import ViTConfig
from vit_common.state import random_state
from vit_common.system import io

ROOT = Path(__file__).resolve().parents[1]
SMALL = ViTConfig(image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)
PEAK_MB = 1500  # a refused input costs what starting the command costs, not what the input declares
TIME_LIMIT = 240  # seconds a child may take before it counts as a hang


def _ours(path: Path, cfg_json: str, state: dict | None = None) -> Path:
    """Our safetensors layout with any stored config text (the test writes it, lying or not)."""
    save_file(
        state if state is not None else random_state(SMALL, scale=0.2),
        str(path),
        {"format": FORMAT_TAG, "vit_config": cfg_json},
    )
    return path


def _model(tmp: Path) -> Path:
    return _ours(tmp / "m.safetensors", SMALL.to_json())


def _npy_header(shape: tuple, descr: str = "<f4") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def _png(path: Path, size: tuple[int, int] = (32, 32)) -> Path:
    from PIL import Image

    Image.fromarray(np.full((*size[::-1], 3), 128, np.uint8)).save(path)
    return path


# ------------------------------------------------------------------------------------------ inputs
# Each builder makes its inputs in the folder it is given and returns the command's arguments.


def project_folder(tmp: Path) -> list[str]:
    proj = tmp / "project"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "train.py").write_text("print('mine')\n")
    (proj / "config.json").write_text('{"lr": 0.1}\n')
    return ["convert", str(_model(tmp)), str(proj), "--to", "hf"]


def run_folder(tmp: Path) -> list[str]:
    run = tmp / "run"
    (run / "checkpoints" / "200").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    _ours(run / "model.safetensors", SMALL.to_json())
    return ["convert", str(_model(tmp)), str(run), "--to", "orbax"]  # (a source inside: check_apart's case)


def foreign_npz(tmp: Path) -> list[str]:
    np.savez(tmp / "theirs.npz", x=np.arange(3))
    return ["convert", str(_model(tmp)), str(tmp / "theirs.npz")]


def foreign_safetensors(tmp: Path) -> list[str]:
    save_file({"w": np.ones(3, np.float32)}, str(tmp / "hub.safetensors"), {"format": "pt"})
    return ["convert", str(_model(tmp)), str(tmp / "hub.safetensors")]


def fifo_destination(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "out.npz")
    return ["convert", str(_model(tmp)), str(tmp / "out.npz")]


def fifo_source(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "x.safetensors")
    return ["info", str(tmp / "x.safetensors")]


def fifo_config(tmp: Path) -> list[str]:
    (tmp / "hf").mkdir()
    os.mkfifo(tmp / "hf" / "config.json")
    save_file({"w": np.ones(3, np.float32)}, str(tmp / "hf" / "model.safetensors"))
    return ["info", str(tmp / "hf")]


def device_source(tmp: Path) -> list[str]:
    return ["convert", "/dev/zero", str(tmp / "out.npz")]


def symlink_loop(tmp: Path) -> list[str]:
    os.symlink(tmp / "b.safetensors", tmp / "a.safetensors")
    os.symlink(tmp / "a.safetensors", tmp / "b.safetensors")
    return ["convert", str(tmp / "a.safetensors"), str(tmp / "out.npz")]


def empty_file(tmp: Path) -> list[str]:
    (tmp / "e.safetensors").write_bytes(b"")
    return ["info", str(tmp / "e.safetensors")]


def truncated_safetensors(tmp: Path) -> list[str]:
    data = _model(tmp).read_bytes()
    (tmp / "t.safetensors").write_bytes(data[: len(data) // 2])
    return ["info", str(tmp / "t.safetensors")]


def lying_header_length(tmp: Path) -> list[str]:
    (tmp / "l.safetensors").write_bytes((10**15).to_bytes(8, "little") + b"{}")
    return ["info", str(tmp / "l.safetensors")]


def deep_stored_config(tmp: Path) -> list[str]:
    _ours(tmp / "deep.safetensors", SMALL.replace(depth=10**9).to_json())
    return ["convert", str(tmp / "deep.safetensors"), str(tmp / "out.npz")]


def deep_override(tmp: Path) -> list[str]:
    return ["convert", str(_model(tmp)), str(tmp / "out.npz"), "--set", "depth=1000000000"]


def huge_resample(tmp: Path) -> list[str]:
    return ["convert", str(_model(tmp)), str(tmp / "out.npz"), "--image-size", "800000"]


def huge_head(tmp: Path) -> list[str]:
    return ["convert", str(_model(tmp)), str(tmp / "out.npz"), "--num-classes", "2000000000"]


def deep_orbax_config(tmp: Path) -> list[str]:
    (tmp / "ob" / "state").mkdir(parents=True)
    meta = {"format": FORMAT_TAG, "vit_config": SMALL.replace(depth=10**9).to_json()}
    (tmp / "ob" / "vit_config.json").write_text(json.dumps(meta))
    return ["convert", str(tmp / "ob"), str(tmp / "out.npz")]


def hf_index_traversal(tmp: Path) -> list[str]:
    save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
    index = {"weight_map": {"cls_token": "../m.safetensors"}}
    (tmp / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    return ["convert", str(tmp / "hf"), str(tmp / "out.npz")]


def npz_claims_1e12(tmp: Path) -> list[str]:
    with zipfile.ZipFile(tmp / "big.npz", "w") as zf:
        zf.writestr("embedding/kernel.npy", _npy_header((1000, 1000, 1000, 1000)) + b"\0" * 64)
    return ["convert", str(tmp / "big.npz"), str(tmp / "out.safetensors")]


def npz_inflates(shape: tuple[int, ...]) -> Callable[[Path], list[str]]:
    """A 256 MiB member of zeros of ``shape``, compressed to a few hundred KB."""

    def build(tmp: Path) -> list[str]:
        with zipfile.ZipFile(tmp / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as zf:
            with zf.open("embedding/kernel.npy", "w", force_zip64=True) as fh:
                fh.write(_npy_header(shape))
                zeros = bytes(2**24)
                for _ in range(16):
                    fh.write(zeros)
        return ["convert", str(tmp / "bomb.npz"), str(tmp / "out.safetensors")]

    build.__name__ = f"npz inflates {len(shape)}-D"
    return build


def npz_object_member(tmp: Path) -> list[str]:
    np.savez(tmp / "obj.npz", x=np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return ["info", str(tmp / "obj.npz")]


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickle_pth(tmp: Path) -> list[str]:
    import torch

    torch.save({"state_dict": Payload(tmp / "PWNED")}, tmp / "evil.pth")
    return ["convert", str(tmp / "evil.pth"), str(tmp / "out.npz")]


def pickle_stream(tmp: Path) -> list[str]:
    (tmp / "evil.bin").write_bytes(pickle.dumps(Payload(tmp / "PWNED"), protocol=2))
    return ["convert", str(tmp / "evil.bin"), str(tmp / "out.npz")]


def set_value(field_value: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        return ["convert", str(_model(tmp)), str(tmp / "out.npz"), "--set", field_value]

    build.__name__ = f"set {field_value}"
    return build


def set_collides(tmp: Path) -> list[str]:
    return ["convert", str(_model(tmp)), str(tmp / "out.npz"), "--set", "image_size=64", "--image-size", "48"]


def hf_config_value(key: str, text: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
        cfg = json.loads((tmp / "hf" / "config.json").read_text())
        (tmp / "hf" / "config.json").write_text(json.dumps(cfg).replace(f'"{key}": {json.dumps(cfg[key])}', text))
        return ["convert", str(tmp / "hf"), str(tmp / "out.npz")]

    build.__name__ = f"hf {text}"
    return build


def deep_hf_config(tmp: Path) -> list[str]:
    """An HF folder whose config.json is nested 100,000 deep (a RecursionError traceback before)."""
    save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
    (tmp / "hf" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    return ["convert", str(tmp / "hf"), str(tmp / "out.npz")]


def int_weights(tmp: Path) -> list[str]:
    state = random_state(SMALL, scale=0.2)
    state["head.bias"] = np.arange(10, dtype=np.int64)
    _ours(tmp / "int.safetensors", SMALL.to_json(), state)
    return ["convert", str(tmp / "int.safetensors"), str(tmp / "out.npz")]


def nan_weights_predict(tmp: Path) -> list[str]:
    state = random_state(SMALL, scale=0.2)
    state["head.weight"][:] = np.nan
    _ours(tmp / "nan.safetensors", SMALL.to_json(), state)
    return ["predict", str(tmp / "nan.safetensors"), str(_png(tmp / "img.png"))]


def nan_weights_parity(tmp: Path) -> list[str]:
    state = random_state(SMALL, scale=0.2)
    state["blocks.0.mlp.fc1.weight"][0, 0] = np.inf
    _ours(tmp / "inf.safetensors", SMALL.to_json(), state)
    return ["parity", str(tmp / "inf.safetensors")]


TINY_TRAIN = "--image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4 --epochs 1"
TRAIN = ["train", *TINY_TRAIN.split(), "--no-progress", "--no-parity", "--compile-cache", "off"]


def _dataset(path: Path, y, y_test=None) -> Path:
    rng = np.random.default_rng(0)
    arrays = {"x": rng.integers(0, 256, (len(y), 8, 8), np.uint8), "y": np.asarray(y)}
    if y_test is not None:
        arrays |= {"x_test": rng.integers(0, 256, (len(y_test), 8, 8), np.uint8), "y_test": np.asarray(y_test)}
    np.savez(path, **arrays)
    return path


def labels(name: str, y, y_test=None) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        data = _dataset(tmp / "d.npz", y, y_test)
        return [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run")]

    build.__name__ = name
    return build


def deep_model_flags(tmp: Path) -> list[str]:
    return [*TRAIN, "--depth", "100000000", "--dataset", "digits", "--out", str(tmp / "run")]


def _bomb_png(path: Path, side: int = 20000) -> Path:
    """A PNG header declaring side x side pixels (what Pillow checks at open), with one empty row."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    ihdr = side.to_bytes(4, "big") * 2 + bytes([8, 0, 0, 0, 0])
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")
    )
    return path


def bomb_predict(tmp: Path) -> list[str]:
    return ["predict", str(_model(tmp)), str(_bomb_png(tmp / "bomb.png"))]


def bomb_in_image_folder(tmp: Path) -> list[str]:
    for c in ("a", "b"):
        (tmp / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            _png(tmp / "imgs" / c / f"{i}.png", (8, 8))
    _bomb_png(tmp / "imgs" / "b" / "3.png")
    return [*TRAIN, "--dataset", f"imagefolder:{tmp / 'imgs'}", "--out", str(tmp / "run")]


def fifo_image(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "img.png")
    return ["predict", str(_model(tmp)), str(tmp / "img.png")]


def train_into_a_user_folder(tmp: Path) -> list[str]:
    (tmp / "run").mkdir()
    (tmp / "run" / "config.json").write_text('{"mine": true}\n')
    data = _dataset(tmp / "d.npz", [0, 1] * 4)
    return [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run")]


def train_while_another_runs(tmp: Path) -> list[str]:
    """``vit train`` on a folder whose lock another process holds (the lock ``vit train`` takes)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from vit_common.system import in_place\n"
            "with in_place.folder_lock(sys.argv[1], 'vit train'):\n    print('held', flush=True); time.sleep(600)",
            str(tmp / "run"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout.readline().strip() == "held"
    HOLDERS.append(holder)
    data = _dataset(tmp / "d.npz", [0, 1] * 4)
    return [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run"), "--resume"]


def lock_is_a_link(target: str) -> Callable[[Path], list[str]]:
    """A ``.vit-lock`` planted in a run folder as a link to a file of the user's (or a dangling one)."""

    def build(tmp: Path) -> list[str]:
        (tmp / "run").mkdir()
        if target == "file":
            (tmp / "victim.txt").write_text("the user's file\n")
        os.symlink(tmp / "victim.txt", tmp / "run" / io.LOCK)
        data = _dataset(tmp / "d.npz", [0, 1] * 4)
        return [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run")]

    build.__name__ = f"lock linked to {'a file' if target == 'file' else 'nothing'}"
    return build


def init_inside_out(tmp: Path) -> list[str]:
    """Fine-tuning a run's own model.safetensors into that run folder (its export would replace it)."""
    (tmp / "run").mkdir()
    _ours(tmp / "run" / "model.safetensors", SMALL.replace(image_size=8, patch_size=4).to_json(), None)
    data = _dataset(tmp / "d.npz", [0, 1] * 4)
    init = ["--init", str(tmp / "run" / "model.safetensors")]
    return ["train", *init, "--no-progress", "--no-parity", "--dataset", f"npz:{data}", "--out", str(tmp / "run")]


def export_onto_a_users_folder(tmp: Path) -> list[str]:
    """Fine-tuning an HF folder into a run folder whose model_hf/ (the export in --init's format) is the
    user's: refused before the training, not after it."""
    save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
    (tmp / "run" / "model_hf").mkdir(parents=True)
    (tmp / "run" / "model_hf" / "notes.txt").write_text("mine\n")
    data = _dataset(tmp / "d.npz", [0, 1] * 4)
    flags = ["--no-progress", "--no-parity", "--compile-cache", "off", "--epochs", "1", "--batch-size", "4"]
    return ["train", "--init", str(tmp / "hf"), "--dataset", f"npz:{data}", "--out", str(tmp / "run"), *flags]


def _bare_timm(tmp: Path) -> Path:
    """A timm-style .safetensors: tensors only, so GELU, eps, pooling... are assumed when read."""
    save_file(random_state(SMALL, scale=0.2), str(tmp / "bare.safetensors"))
    return tmp / "bare.safetensors"


def assumed_into_hf(tmp: Path) -> list[str]:
    return ["convert", str(_bare_timm(tmp)), str(tmp / "hf"), "--to", "hf", "--source-image-size", "32"]


def assumed_into_train_exports(tmp: Path) -> list[str]:
    """Fine-tuning a timm file that states no config: its timm export would print assumed fields as fact."""
    data = _dataset(tmp / "d.npz", [0, 1] * 4)
    flags = ["--no-progress", "--no-parity", "--compile-cache", "off", "--epochs", "1", "--batch-size", "4"]
    init = ["--init", str(_bare_timm(tmp)), "--source-image-size", "32"]
    return ["train", *init, "--dataset", f"npz:{data}", "--out", str(tmp / "run"), *flags]


def convert_checkpoint_into_its_source(tmp: Path) -> list[str]:
    save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
    return ["convert", str(tmp / "hf"), str(tmp / "hf" / "copy.npz")]


HOLDERS: list[subprocess.Popen] = []  # processes a case started, ended when the case ends


def _folder(root: Path, n: int = 3, suffix: str = ".png") -> Path:
    """An image folder of classes a and b, ``n`` 8x8 images each."""
    from PIL import Image

    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(root / c / f"{i}{suffix}")
    return root


def _train_on(spec: str, tmp: Path, *extra: str) -> list[str]:
    return [*TRAIN, "--dataset", spec, "--out", str(tmp / "run"), *extra]


def _hf_rows(tmp: Path, name: str, label) -> Path:
    """A save_to_disk dataset of 6 PNGs with the column ``label`` as given (None: no label column)."""
    import io as bytes_io

    import datasets
    from PIL import Image

    def png(i: int) -> bytes:
        buf = bytes_io.BytesIO()
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(buf, "PNG")
        return buf.getvalue()

    rows = {"image": [{"bytes": png(i), "path": None} for i in range(6)]} | ({"label": label} if label else {})
    ds = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    ds.save_to_disk(str(tmp / name))
    return tmp / name


def hf_without_labels(tmp: Path) -> list[str]:
    return _train_on(f"hf:{_hf_rows(tmp, 'hf', None)}", tmp)


def hf_text_labels(tmp: Path) -> list[str]:
    return _train_on(f"hf:{_hf_rows(tmp, 'hf', ['cat', 'dog'] * 3)}", tmp)


def parquet_unreadable_image(tmp: Path) -> list[str]:
    import datasets

    good = (_png(tmp / "x.png", (8, 8))).read_bytes()
    (tmp / "x.png").unlink()
    rows = {"image": [{"bytes": good, "path": None}] * 5 + [{"bytes": b"\x89PNG not one", "path": None}]}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    (tmp / "pq").mkdir()
    datasets.Dataset.from_dict(rows | {"label": [0, 1] * 3}, features=features).to_parquet(
        str(tmp / "pq" / "train.parquet")
    )
    return _train_on(f"hf:{tmp / 'pq'}", tmp)


def arrayrecord_matching_nothing(tmp: Path) -> list[str]:
    return _train_on(f"arrayrecord:{tmp / 'shards' / 'train-*.array_record'}", tmp)


def fifo_in_image_folder(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    os.mkfifo(tmp / "imgs" / "b" / "9.png")
    return _train_on(f"imagefolder:{tmp / 'imgs'}", tmp)


def class_name_not_utf8(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    os.rename(tmp / "imgs" / "b", os.fsencode(tmp / "imgs") + b"/b\xff")
    return _train_on(f"imagefolder:{tmp / 'imgs'}", tmp)


def classes_equal_after_normalisation(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    os.rename(tmp / "imgs" / "a", tmp / "imgs" / "caf\u00e9")  # é composed
    os.rename(tmp / "imgs" / "b", tmp / "imgs" / "cafe\u0301")  # e + combining acute
    return _train_on(f"imagefolder:{tmp / 'imgs'}", tmp)


def out_inside_the_dataset(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    return [*TRAIN, "--dataset", f"imagefolder:{tmp / 'imgs'}", "--out", str(tmp / "imgs" / "runs" / "r1")]


def npz_images_of_height_0(tmp: Path) -> list[str]:
    np.savez(tmp / "d.npz", x=np.zeros((8, 0, 8), np.uint8), y=np.array([0, 1] * 4))
    return _train_on(f"npz:{tmp / 'd.npz'}", tmp)


def truncated_jpeg_in_image_folder(tmp: Path) -> list[str]:
    """A 64x64 JPEG of noise cut to 60%: its header is whole, so Pillow opens and verify()s it; only
    decoding finds the end missing."""
    from PIL import Image

    _folder(tmp / "imgs", suffix=".jpg")
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp / "imgs" / "a" / "1.jpg", quality=90)
    whole = (tmp / "imgs" / "a" / "1.jpg").read_bytes()
    (tmp / "imgs" / "a" / "1.jpg").write_bytes(whole[: len(whole) * 6 // 10])
    with Image.open(tmp / "imgs" / "a" / "1.jpg") as im:
        im.verify()  # what the up-front check did before: it passes
    return _train_on(f"imagefolder:{tmp / 'imgs'}", tmp)


def convert_into_the_source(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    return ["data", "convert", str(tmp / "imgs"), str(tmp / "imgs" / "records")]


def convert_into_a_user_folder(tmp: Path) -> list[str]:
    _folder(tmp / "imgs")
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("mine\n")
    return ["data", "convert", str(tmp / "imgs"), str(tmp / "mine")]


def resume_on_changed_data(tmp: Path) -> list[str]:
    """A finished run on an image folder, then an image added and a class folder renamed."""
    _folder(tmp / "imgs")
    argv = _train_on(f"imagefolder:{tmp / 'imgs'}", tmp)
    assert main(argv) == 0
    _png(tmp / "imgs" / "a" / "9.png", (8, 8))
    os.rename(tmp / "imgs" / "b", tmp / "imgs" / "c")
    return [*argv, "--resume"]


def flag(*argv: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        return [a.replace("MODEL", str(_model(tmp))) for a in argv]

    build.__name__ = " ".join(argv)
    return build


def bad_limit(tmp: Path) -> list[str]:
    return ["convert", str(_model(tmp)), str(tmp / "out.npz")]


def _many_classes(tmp: Path, k: int = 1000) -> tuple[Path, Path]:
    """A K-class model (ImageNet's count) and an npz dataset of K test images, one per class."""
    cfg = ViTConfig(image_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=k)
    model = _ours(tmp / "k.safetensors", cfg.to_json(), random_state(cfg, scale=0.2))
    x = np.random.default_rng(0).integers(0, 256, (k, 8, 8), np.uint8)
    np.savez(tmp / "k.npz", x=x, y=np.arange(k), x_test=x, y_test=np.arange(k))
    return model, tmp / "k.npz"


def evaluate_1000_classes(tmp: Path) -> list[str]:
    model, data = _many_classes(tmp)
    return ["evaluate", str(model), "--dataset", f"npz:{data}", "--confusion", str(tmp / "c.png")]


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


def bf16_to_every_format(tmp: Path) -> list[str]:
    _ours(tmp / "bf.safetensors", SMALL.to_json(), random_state(SMALL, scale=0.2, dtype=ml_dtypes.bfloat16))
    return ["convert", str(tmp / "bf.safetensors"), str(tmp / "bf.npz")]


def _bf16_exact(tmp: Path, out: str) -> None:
    """The .npz holds the bf16 values widened to float32, exactly; every other format holds them as bf16."""
    from vit_torch.formats import READERS, WRITERS  # orbax's bf16 round trip: tests/test_orbax.py

    want = random_state(SMALL, scale=0.2, dtype=ml_dtypes.bfloat16)
    assert "bfloat16 tensors written as float32 (exact" in out
    back = load_checkpoint(tmp / "bf.npz").state
    assert all(np.array_equal(back[k], want[k].astype(np.float32)) for k in want)
    for fmt, name in (("timm", "bf.pth"), ("timm", "t.safetensors"), ("hf", "hf")):
        save_checkpoint(tmp / name, SMALL, load_checkpoint(tmp / "bf.safetensors").state, fmt, writers=WRITERS)
        back = load_checkpoint(tmp / name, readers=READERS).state
        assert all(back[k].dtype == want[k].dtype and back[k].tobytes() == want[k].tobytes() for k in want), fmt


def _no_payload(tmp: Path, out: str) -> None:
    assert not (tmp / "PWNED").exists()


def _parity_fails(tmp: Path, out: str) -> None:
    assert "FAIL" in out and "agreement" not in out


@dataclass
class Case:
    """One hostile input: ``build(tmp)`` makes it and returns the argv; the error line must contain
    ``names`` (a regex; ``{tmp}`` is the case's folder). ``child``: run in a child process (time limit,
    peak memory). ``code`` 0 or 1: not an error, ``check(tmp, output)`` says what is right."""

    build: Callable[[Path], list[str]]
    names: str
    code: int = 2
    child: bool = False
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[Path, str], None] | None = None
    creates: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.build.__name__


CASES = [
    # 1. nothing of the user's is replaced
    Case(project_folder, r"{tmp}/project: a folder holding things vit did not write .*config.json, src"),
    Case(run_folder, r"{tmp}/run: a folder holding things vit did not write .*checkpoints, metrics.jsonl"),
    Case(foreign_npz, r"{tmp}/theirs.npz: exists and vit cannot tell it wrote it; pass --overwrite"),
    Case(foreign_safetensors, r"{tmp}/hub.safetensors: exists and vit cannot tell it wrote it"),
    Case(fifo_destination, r"{tmp}/out.npz: exists and vit cannot tell it wrote it"),
    # 2. small inputs that would exhaust the machine or hang
    Case(fifo_source, r"{tmp}/x.safetensors: .*a FIFO, expected a regular checkpoint file", child=True),
    Case(fifo_config, r"{tmp}/hf: a folder that is neither a Hugging Face ViT folder", child=True),
    Case(device_source, r"/dev/zero: .*a device, expected a regular checkpoint file", child=True),
    Case(symlink_loop, r"{tmp}/a.safetensors: .*Too many levels of symbolic links"),
    Case(empty_file, r"{tmp}/e.safetensors: not a checkpoint format"),
    Case(truncated_safetensors, r"{tmp}/t.safetensors"),
    Case(lying_header_length, r"{tmp}/l.safetensors"),
    Case(deep_stored_config, r"{tmp}/deep.safetensors: the config \(depth=1000000000.* declares", child=True),
    Case(deep_override, r"{tmp}/m.safetensors: the config \(depth=1000000000", child=True),
    Case(huge_resample, r"image_size=800000: a model with .* beyond the limit", child=True),
    Case(huge_head, r"num_classes=2000000000: a model .* beyond the limit", child=True),
    Case(deep_orbax_config, r"{tmp}/ob: a model with depth=1000000000.* beyond the limit", child=True),
    Case(hf_index_traversal, r"{tmp}/hf/model.safetensors.index.json: weight_map names files outside the folder"),
    Case(npz_claims_1e12, r"{tmp}/big.npz: .*member 'embedding/kernel' \(\(1000, 1000, 1000, 1000\)", child=True),
    Case(
        npz_inflates((2**26, 1, 1, 1)),
        r"{tmp}/bomb.npz: .*embedding/kernel.* beyond the limit",
        child=True,
        env={"VIT_MAX_BYTES": "64M"},
    ),
    Case(
        npz_inflates((2**26,)),
        r"{tmp}/bomb.npz: member 'embedding/kernel' has shape \(67108864,\), the format's is 4-D; refused before",
        child=True,
    ),
    Case(npz_object_member, r"{tmp}/obj.npz: member 'x' holds Python objects"),
    Case(bad_limit, r"VIT_MAX_BYTES='lots': expected a positive size", env={"VIT_MAX_BYTES": "lots"}),
    # 3. silent wrong results
    Case(set_value("ln_eps=Infinity"), r"ln_eps=inf: expected a finite number"),
    Case(set_value("ln_eps=NaN"), r"ln_eps=nan: expected a finite number"),
    Case(set_value("ln_eps=-1"), r"ln_eps=-1: expected a finite number in \(0, 1\]"),
    Case(set_value("dropout=1.5"), r"dropout=1.5: expected a finite number in \[0, 1\)"),
    Case(set_value("num_heads=true"), r"num_heads=True: expected an integer"),
    Case(hf_config_value("layer_norm_eps", '"layer_norm_eps": Infinity'), r"{tmp}/hf: .*ln_eps=inf: expected a finite"),
    Case(hf_config_value("layer_norm_eps", '"layer_norm_eps": "tiny"'), r"{tmp}/hf.*layer_norm_eps|ln_eps='tiny'"),
    Case(deep_hf_config, r"{tmp}/hf/config.json: JSON nested deeper than 64 levels"),
    Case(int_weights, r"{tmp}/int.safetensors: tensors that are not floating point: head.bias \(int64\)"),
    Case(nan_weights_predict, r"{tmp}/nan.safetensors: the logits of {tmp}/img.png are NaN or Inf"),
    Case(nan_weights_parity, "", code=1, check=_parity_fails),
    Case(flag("train", "--mixup", "nan"), r"--mixup: 'nan': expected a finite number in \[0, inf\)"),
    Case(flag("train", "--rotate", "nan"), r"--rotate: 'nan': expected a finite number in \[0, 180\]"),
    Case(flag("train", "--lr", "inf"), r"--lr: 'inf': expected a finite number in \(0, inf\)"),
    Case(flag("train", "--val-fraction", "1"), r"--val-fraction: '1': expected a finite number in \(0, 1\)"),
    Case(flag("train", "--epochs", "0"), r"--epochs: '0': expected an integer in \[1, "),
    Case(flag("train", "--depth", "1e9"), r"--depth: '1e9': expected an integer"),
    Case(flag("predict", "MODEL", "x.png", "--top-k", "-1"), r"--top-k: '-1': expected an integer"),
    Case(
        deep_model_flags,
        r"the model flags: a model with depth=100000000, .* \(parameters, gradients, optimizer state",
        child=True,
    ),
    Case(labels("label 2**32", [0, 1, 0, 2**32, 0, 1, 1, 0]), r"{tmp}/d.npz: label 4294967296 in x/y: expected"),
    Case(labels("label 10**9", [0, 1, 0, 10**9, 0, 1, 1, 0]), r"{tmp}/d.npz: label 1000000000 in x/y"),
    Case(labels("uint64 label", np.array([0, 1, 0, 2**63 + 5, 0, 1, 1, 0], np.uint64)), r"label 9223372036854775813"),
    Case(labels("unseen test labels", [0, 1] * 4, [0, 1, 7, 9]), r"{tmp}/d.npz: y_test holds label\(s\) \[7, 9\]"),
    Case(hf_without_labels, r"{tmp}/hf \(split 'train'\): no label column \(a ClassLabel, or an integer"),
    Case(hf_text_labels, r"{tmp}/hf \(split 'train'\): label column 'label' holds string; expected integers"),
    Case(parquet_unreadable_image, r"{tmp}/pq/train.parquet: row 5: unreadable image"),
    Case(arrayrecord_matching_nothing, r"arrayrecord:{tmp}/shards/train-\*.array_record: no files match"),
    Case(npz_images_of_height_0, r"{tmp}/d.npz: x/y images are 0x8 pixels; expected at least 1x1"),
    Case(truncated_jpeg_in_image_folder, r"{tmp}/imgs/a/1.jpg: unreadable image \(image file is truncated"),
    Case(class_name_not_utf8, r"{tmp}/imgs: class folder b'b\\xff' is not valid UTF-8"),
    Case(classes_equal_after_normalisation, r"{tmp}/imgs: class folders .* have the same name in Unicode normal form"),
    Case(out_inside_the_dataset, r"--out {tmp}/imgs/runs/r1 lies inside the dataset {tmp}/imgs"),
    Case(convert_into_the_source, r"DST {tmp}/imgs/records lies inside the dataset {tmp}/imgs"),
    Case(convert_into_a_user_folder, r"{tmp}/mine: a folder holding things vit did not write .*notes.txt"),
    Case(
        resume_on_changed_data,
        r"{tmp}/run: the dataset changed since the run started \(classes: the run has \['a', 'b'\], the data now "
        r"\['a', 'c'\]; train images: the run has 4, the data now 5; files added \(4\): a/9.png, c/0.png, .*; "
        r"files removed \(3\): b/0.png",
    ),
    Case(train_into_a_user_folder, r"{tmp}/run/config.json: exists and vit cannot tell it wrote it"),
    Case(train_while_another_runs, r"{tmp}/run: in use by another vit train \(pid \d+\)"),
    Case(lock_is_a_link("file"), r"{tmp}/run/.vit-lock: a symbolic link where vit keeps its lock file"),
    Case(lock_is_a_link("nothing"), r"{tmp}/run/.vit-lock: a symbolic link where vit keeps its lock file"),
    Case(init_inside_out, r"{tmp}/run: the output holds --init {tmp}/run/model.safetensors; write the output"),
    Case(export_onto_a_users_folder, r"{tmp}/run/model_hf: a folder holding things vit did not write .*notes.txt"),
    Case(
        assumed_into_hf, r"{tmp}/hf: hf readers take every config field as fact, and .*gelu='exact'.* --accept-assumed"
    ),
    Case(
        assumed_into_train_exports,
        r"{tmp}/run/model_timm.safetensors: timm readers take every config field as fact, and .*--accept-assumed",
    ),
    Case(convert_checkpoint_into_its_source, r"{tmp}/hf/copy.npz: the output lies inside the source {tmp}/hf; write"),
    # 4. tracebacks instead of named errors
    Case(bomb_predict, r"{tmp}/bomb.png: unreadable image \(Image size \(400000000 pixels\) exceeds limit"),
    Case(bomb_in_image_folder, r"{tmp}/imgs/b/3.png: unreadable image \(Image size \(400000000 pixels\) exceeds limit"),
    Case(fifo_image, r"{tmp}/img.png: a FIFO, expected a regular image file", child=True),
    Case(fifo_in_image_folder, r"{tmp}/imgs/b/9.png: a FIFO, expected a regular dataset file", child=True),
    Case(set_value("ln_eps=abc"), r"ln_eps='abc': expected a finite number"),
    Case(set_collides, r"'image_size=64': image_size is not set with --set; use --source-image-size"),
    Case(set_value("nonsense=1"), r"'nonsense' is not a ViTConfig field"),
    Case(bf16_to_every_format, "", code=0, check=_bf16_exact, creates=("bf.npz",)),
    # output that grows with the square of its input: bounded, the results first
    Case(evaluate_1000_classes, "", code=0, child=True, check=_bounded_png, creates=("c.png",)),
    Case(evaluate_1000_classes_csv, "", code=0, child=True, check=_counts_csv, creates=("c.csv",)),
    # never unpickle
    Case(pickle_pth, r"{tmp}/evil.pth: .*(blocked|weights-only|not allowed|refus)", check=_no_payload),
    Case(pickle_stream, r"{tmp}/evil.bin", check=_no_payload),
]


def _snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (not following links): a file's sha256, or its kind."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink() or not p.is_file():
                out[rel] = "link" if p.is_symlink() else "dir" if p.is_dir() else "special"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# The child's own peak: Linux's VmHWM (this process image's high-water mark). ru_maxrss is not used where
# VmHWM exists: Linux carries it over from the process that started the child (the pytest worker, a GB
# or more after other tests) across exec.
_CHILD = """
import os, resource, sys
from vit_cli.main import main
try:
    rc = main(sys.argv[2:])
finally:
    if os.path.exists("/proc/self/status"):
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) // 1024
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    with open(sys.argv[1], "w") as fh:
        fh.write(str(peak))
sys.exit(rc)
"""


def _run(case: Case, tmp: Path, argv: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the command, checked for hangs and peak memory in a child."""
    if not case.child:
        for k, v in case.env.items():
            monkeypatch.setenv(k, v)
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse refusing a flag
            rc = e.code
        out, err = capsys.readouterr()
        return rc, out, err
    rss = tmp.parent / f"{tmp.name}.rss"
    env = {**os.environ, "PYTHONPATH": str(ROOT), **case.env}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(rss), *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=TIME_LIMIT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang: {argv} ran past {TIME_LIMIT} s")
    peak = int(rss.read_text())
    rss.unlink()
    assert peak < PEAK_MB, f"peak memory {peak} MB for {argv}"
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    tmp = tmp_path / "case"
    tmp.mkdir()
    argv = case.build(tmp)
    capsys.readouterr()
    before = _snapshot(tmp)
    rc, out, err = _run(case, tmp, argv, capsys, monkeypatch)
    assert "Traceback" not in out + err, err
    assert rc == case.code, (rc, out, err)
    if case.code == 2:
        errors = [ln for ln in err.splitlines() if re.match(r"vit \w+: error: ", ln)]
        assert len(errors) == 1, err
        assert re.search(case.names.replace("{tmp}", re.escape(str(tmp))), errors[0]), errors[0]
    for holder in HOLDERS:
        holder.kill()
        holder.wait()
    HOLDERS.clear()
    after = _snapshot(tmp)
    assert {k: v for k, v in after.items() if k not in case.creates} == before, "files changed or left behind"
    if case.check:
        case.check(tmp, out + err)


# --------------------------------------------------------------------------------- writes that fail


WRITE_FAULTS = [
    ("canonical", "m2.safetensors"),
    ("timm", "t.pth"),
    ("big_vision", "b.npz"),
    ("hf", "hf"),
    ("orbax", "ob"),
]


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs; root only."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)]).returncode:
        pytest.skip("a full disk needs a tmpfs, which only root can mount")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def _fill(folder: Path, leave: int = 0) -> None:
    """Write a file until the disk holding ``folder`` is full, then give back ``leave`` bytes."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError as e:
        assert e.errno == errno.ENOSPC
        os.ftruncate(fd, os.fstat(fd).st_size - leave)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("fmt", "name"), WRITE_FAULTS, ids=[f for f, _ in WRITE_FAULTS])
def test_full_disk_keeps_the_old_destination_and_leaves_nothing(fmt, name, small_disk, tmp_path, capsys):
    src = _model(tmp_path)
    dst = small_disk / name
    assert main(["convert", str(src), str(dst), "--to", fmt]) == 0
    _fill(small_disk)
    before = _snapshot(small_disk)
    capsys.readouterr()
    rc = main(["convert", str(src), str(dst), "--to", fmt, "--overwrite"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    line = [ln for ln in err.splitlines() if ln.startswith("vit convert: error: ")]
    assert len(line) == 1 and str(dst) in line[0] and "No space left on device" in line[0], err
    assert _snapshot(small_disk) == before


@pytest.mark.parametrize("checked", [True, False], ids=["refused-before-orbax", "orbax-fails-mid-write"])
def test_a_disk_that_fills_during_an_orbax_write_is_one_line_and_nothing_else(checked, small_disk, tmp_path):
    """32 KiB free, less than the orbax folder needs: refused before orbax starts (statvfs), naming what it
    needs. With that check off, orbax's own write fails inside tensorstore, whose done-callbacks then raise
    "Event loop is closed" on orbax's closed loop (0 to 29 times a run, as measured), reported through
    ``sys.unraisablehook``, during the write and after. A child process, so that all it prints on fd 2 until
    it ends is seen; its first unraisablehook prints on fd 2 as it was before vit ran: one line either way.
    Either way the destination keeps its old content."""
    src, dst = _model(tmp_path), small_disk / "ob"
    assert main(["convert", str(src), str(dst), "--to", "orbax"]) == 0
    _fill(small_disk, leave=32 << 10)
    before = _snapshot(small_disk)
    code = [
        "import os, sys",
        "err = os.fdopen(os.dup(2), 'w')",  # quiet_orbax points fd 2 at /dev/null while orbax writes
        "sys.unraisablehook = lambda u: print(f'unraisable: {u.exc_value!r}', file=err, flush=True)",
        "from vit_common.system import io",
        "" if checked else "io.FOLDER_OVERHEAD = -(1 << 40)",  # needs nothing: orbax meets the full disk
        "from vit_cli.main import main",
        "sys.exit(main(sys.argv[1:]))",
    ]
    argv = ["convert", str(src), str(dst), "--to", "orbax", "--overwrite"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run([sys.executable, "-c", "\n".join(code), *argv], capture_output=True, text=True, env=env)
    lines = child.stderr.splitlines()
    assert child.returncode == 2 and len(lines) == 1, child.stderr
    assert lines[0].startswith(f"vit convert: error: {dst}: could not be written (No space left on device")
    assert ("needs " in lines[0]) == checked and lines[0].endswith("the old file is unchanged"), lines[0]
    if not checked:  # tensorstore's threads can re-create the temporary after vit removed it (1 in ~10 runs):
        io.remove_stale_temporaries(small_disk)  # the next write into the folder removes it (the writer is gone)
    assert _snapshot(small_disk) == before


def test_a_training_checkpoint_the_disk_cannot_hold_is_one_line_before_orbax_writes(small_disk, tmp_path):
    """vit train whose run folder's disk has 64 KiB left: the config, metrics and event files fit, the
    checkpoint (orbax's folder) does not. Refused before orbax starts (before: orbax's threads failed on
    the full disk and printed 84 "Event loop is closed" tracebacks and five absl ERROR lines beside the
    error), naming the folder, the step, the bytes needed and free, and where --resume continues; no
    checkpoint folder, complete or temporary, is left."""
    out = small_disk / "run"
    _fill(small_disk, leave=64 << 10)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-m", "vit_cli.main", *TRAIN, "--dataset", "digits", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIME_LIMIT,
    )
    errors = [ln for ln in child.stderr.splitlines() if not ln.startswith("vit train: warning: ")]
    assert child.returncode == 2 and "Traceback" not in child.stderr, child.stderr
    assert [ln for ln in errors if "error" in ln.lower()] == errors[-1:], child.stderr
    head = f"vit train: error: {out / 'checkpoints'}: no space for the checkpoint of step "
    assert errors[-1].startswith(head), errors
    assert "needs " in errors[-1] and errors[-1].endswith("--resume continues from step 0"), errors[-1]
    assert not (out / "checkpoints").exists()  # no checkpoint folder, complete or temporary: not even an empty one


def _train_child(out: Path, *flags: str, check: bool = True, prelude: str = "") -> subprocess.CompletedProcess:
    """``vit train`` on digits into ``out`` in a child; with ``check`` off the free-space check before each
    checkpoint needs nothing, so that orbax's own write meets the full disk; ``prelude``: code run first."""
    code = "\n".join(
        [
            "import sys",
            "from vit_common.system import io",
            "" if check else "io.FOLDER_OVERHEAD = -(1 << 40)",
            prelude,
            "from vit_cli.main import main",
            "sys.exit(main(sys.argv[1:]))",
        ]
    )
    argv = [*TRAIN, "--dataset", "digits", "--out", str(out), *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=TIME_LIMIT
    )


def test_a_disk_that_fills_during_a_training_checkpoint_is_one_line_and_the_folder_is_removed(small_disk):
    """The free-space check passed (here: turned off) and the disk fills while orbax's threads write the
    final checkpoint: the run waits for the write, then stops with one line naming the folder, the step,
    the OS's cause and where --resume continues (before: orbax's threads printed 59 tracebacks, "Task
    exception was never retrieved", "Event loop is closed", absl ERROR lines, and the error was
    tensorstore's 1,500-character ValueError); the incomplete checkpoint folder is removed, freeing its
    space."""
    out = small_disk / "run"
    _fill(small_disk, leave=64 << 10)  # config.json, metrics.jsonl and the event file fit; the checkpoint not
    child = _train_child(out, "--ckpt-every", "0", check=False)
    assert child.returncode == 2 and child.stderr.count("\n") == 2, child.stderr
    line = child.stderr.splitlines()[1]
    assert line == (
        f"vit train: error: {out / 'checkpoints'}: the checkpoint of step 360 could not be written (No space "
        "left on device); free some space, then the same command with --resume continues from step 0"
    )
    assert not (out / "checkpoints").exists()


@pytest.mark.parametrize("tensorboard", [True, False], ids=["tensorboard", "metrics-only"])
def test_run_files_on_a_full_disk_are_one_line_naming_the_file_and_no_hang(tensorboard, small_disk):
    """A disk with 8 KiB left: config.json fits, then metrics.jsonl's lines or TensorBoard's event file
    fill it. One line naming the file, the step and where --resume continues. Before, tensorboardX's writer
    thread died on the full disk with a traceback and its queue filled, so the next add_scalar blocked for
    ever (the run hung until killed); without TensorBoard the line was a bare "[Errno 28] No space left on
    device" (the log's close after the failed flush raised over the named error)."""
    out = small_disk / "run"
    _fill(small_disk, leave=8 << 10)
    off = [] if tensorboard else ["--tensorboard", "off"]
    child = _train_child(out, "--ckpt-every", "0", "--log-every", "1", *off)
    assert child.returncode == 2 and child.stderr.count("\n") == 2, child.stderr
    line = child.stderr.splitlines()[1]
    named = re.fullmatch(
        "vit train: error: (.+): could not be written at step [0-9]+ \\(No space left on device\\); free "
        "some space, then the same command with --resume continues from step 0",
        line,
    )
    files = [str(out / "metrics.jsonl")] + ([str(out / "tensorboard")] if tensorboard else [])
    assert named and named[1] in files, line


def test_a_run_whose_config_the_disk_cannot_hold_leaves_no_folder(small_disk):
    """4 KiB left: config.json does not fit. One line naming it; the run folder and its checkpoints folder,
    which this run made, are gone again (before: both stayed, empty)."""
    out = small_disk / "run"
    _fill(small_disk, leave=4 << 10)
    child = _train_child(out, "--tensorboard", "off")
    assert child.returncode == 2 and child.stderr.splitlines()[1:] == [
        f"vit train: error: {out / 'config.json'}: could not be written (No space left on device); nothing was written"
    ], child.stderr
    assert not out.exists()


def test_a_disk_that_fills_before_the_exports_says_the_training_is_kept_and_resume_exports(small_disk):
    """The disk fills after the last checkpoint, before the exports (here: the child fills it as the exports
    start, in front of vit_jax.finetune.export). One line naming the export, the checkpoint that holds the
    training and that --resume writes the exports (before: "nothing was written" and no word of the
    finished training); after space is freed the same command with --resume writes them without training
    again."""
    out = small_disk / "run"
    prelude = "\n".join(
        [
            "import os, vit_jax.finetune",
            "export = vit_jax.finetune.export",
            "def full_then_export(out, *a, **k):",
            f"    fd = os.open({str(small_disk / 'filler')!r}, os.O_WRONLY | os.O_CREAT)",
            "    try:",
            "        while True: os.write(fd, bytes(4096))",
            "    except OSError: os.close(fd)",
            "    return export(out, *a, **k)",
            "vit_jax.finetune.export = full_then_export",
        ]
    )
    child = _train_child(out, "--ckpt-every", "0", "--tensorboard", "off", prelude=prelude)
    assert child.returncode == 2 and child.stderr.count("\n") == 2, child.stderr
    line = child.stderr.splitlines()[1]
    assert line.startswith(f"vit train: error: {out}/") and "could not be written (No space left on device)" in line
    assert line.endswith(
        f"; the training is complete (the checkpoint of step 360 in {out / 'checkpoints'}): the same command "
        "with --resume writes the exports"
    ), line
    (small_disk / "filler").unlink()
    again = _train_child(out, "--ckpt-every", "0", "--tensorboard", "off", "--resume")
    assert again.returncode == 0, again.stderr
    assert "nothing to train, exported again" in again.stderr + again.stdout
    assert (out / "model.safetensors").is_file() and (out / "curves.png").is_file()


def test_kill_9_during_a_write_leaves_a_temporary_the_next_write_removes(tmp_path, capsys):
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from vit_common.system import io\n"
            "def write(tmp):\n"
            "    open(tmp, 'wb').write(b'half a model'); print('writing', flush=True); time.sleep(600)\n"
            "io.atomic_write(sys.argv[1], write)",
            str(tmp_path / "out" / "a.npz"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout.readline().strip() == "writing"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    left = [p.name for p in (tmp_path / "out").iterdir()]
    assert len(left) == 1 and left[0].startswith(f"{io.TMP_PREFIX}{child.pid}-a.npz-"), left
    assert main(["convert", str(_model(tmp_path)), str(tmp_path / "out" / "b.npz")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["b.npz"]


def test_overwrite_replaces_a_file_but_never_a_foreign_folder(tmp_path, capsys):
    project_folder(tmp_path)
    foreign_npz(tmp_path)
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "theirs.npz"), "--overwrite"]) == 0
    assert "params/embedding/kernel" in np.load(tmp_path / "theirs.npz").files
    rc = main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "project"), "--to", "hf", "--overwrite"])
    assert rc == 2 and (tmp_path / "project" / "src" / "train.py").read_text() == "print('mine')\n"


# ------------------------------------------------------------------------------------------ counts


def counts() -> dict[str, int]:
    """What README reports: every input this suite tries, and the faults (each fails a test, so 0)."""
    # + a disk that fills during an orbax write (refused before it, or failing in it), a training
    # checkpoint the disk cannot hold, one during whose write it fills, run files on a full disk (with
    # and without TensorBoard), one for config.json, one before the exports, kill -9 during a write,
    # --overwrite vs a foreign folder
    tried = len(CASES) + len(WRITE_FAULTS) + 10
    return {"inputs tried": tried, "crashes": 0, "hangs": 0, "silent results": 0, "data lost": 0}


def test_readme_reports_the_suites_counts():
    line = ", ".join(f"{k} {v}" for k, v in counts().items())
    assert f"Hostile inputs ({line})" in (ROOT / "README.md").read_text()
