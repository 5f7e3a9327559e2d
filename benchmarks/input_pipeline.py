"""Images per second the training input pipeline delivers, from an image folder and from ArrayRecord
files of the same JPEGs, with one worker process and with several.

What it runs is ``vit train``'s pipeline (``vit_jax.data.train_batches`` + ``iterate``): read each JPEG
(a file of the image folder, or a record of the ArrayRecord files ``vit data convert`` writes from that
folder: the same bytes), decode it, random-resized crop and flip (or, with ``--mode eval``, resize and
centre crop), normalise, batch, and hand the batch to this process through grain's ``mp_prefetch``
worker processes. The folder is ``--data`` or, by default, one it writes: ``--images`` 224x224 JPEGs
(quality 90), random crops of four scikit-image sample photos (one class each).

Formats (``--formats``, default both) and worker counts (``--workers``, default 1 and every usable
core) run interleaved (folder 1, folder N, records 1, records N, then again). Each run first takes 3
batches per worker untimed (the workers' start-up, reported separately, and their filled buffers),
then times ``--batches`` batches (default 8 per worker of the largest count, at least 12), so that
every worker makes several. One JSON line per run goes to ``--out``; the summary gives each (format,
worker count)'s median rate, its ratio to the first count's, and ArrayRecord's ratio to the folder's.

    python -m benchmarks.input_pipeline --out benchmarks/results/input-pipeline-cpu.jsonl
    python -m benchmarks.input_pipeline --data photos/ --workers 1,2,4,8 --batch-size 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from benchmarks import report
from benchmarks.harness import host

SCHEMA = "vit-input-pipeline/2"
FORMATS = ("imagefolder", "arrayrecord")
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")  # scikit-image sample photos, one class each
# Every record (one JSON line) has exactly these keys.
RECORD_FIELDS: dict[str, str] = {
    "schema": SCHEMA,
    "time": "start of the run, UTC ISO 8601",
    "machine": "cpu model, cpu_flags (AVX-512, AMX, ...), usable cores, load average (1, 5, 15 min) at the start",
    "data": "the image folder",
    "format": "'imagefolder' (one file per image) or 'arrayrecord' (the same JPEGs as records, vit data convert)",
    "images": "images in the training split",
    "mode": "'train' (random-resized crop + flip) or 'eval' (resize + centre crop)",
    "image_size": "side of the square model input, pixels",
    "batch_size": "images per batch",
    "workers": "worker processes (grain mp_prefetch)",
    "repeat": "index of this run among the interleaved repeats",
    "startup_s": "seconds from creating the iterator to the first batch (the workers' start-up)",
    "warmup_batches": "batches taken untimed first (3 per worker, at least 3)",
    "batches": "batches timed after the warm-up",
    "seconds": "time to deliver them",
    "images_per_s": "batches * batch_size / seconds",
}


def make_folder(root: Path, n: int, size: int = 224, seed: int = 0) -> Path:
    """Write ``n`` ``size`` x ``size`` JPEGs (quality 90) into ``root``/<photo>/, random crops (a side of
    50-100% of the photo's shorter side) of the scikit-image sample photos, resized with Pillow."""
    from PIL import Image
    from skimage import data

    rng = np.random.default_rng(seed)
    photos = {name: getattr(data, name)() for name in PHOTOS}
    for i in range(n):
        name = PHOTOS[i % len(PHOTOS)]
        photo = photos[name]
        h, w = photo.shape[:2]
        side = int(rng.integers(min(h, w) // 2, min(h, w) + 1))
        top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        crop = Image.fromarray(photo[top : top + side, left : left + side]).resize((size, size), Image.BICUBIC)
        (root / name).mkdir(parents=True, exist_ok=True)
        crop.save(root / name / f"{i:05d}.jpg", quality=90)
    return root


def warmup_batches(workers: int) -> int:
    return 3 * max(workers, 1)


def run_once(ds, *, workers: int, batches: int) -> tuple[float, float]:
    """(seconds to the first batch, seconds for ``batches`` batches after ``warmup_batches``) of one
    iterator with ``workers`` worker processes (one thread each)."""
    from vit_jax.data import iterate

    t0 = time.perf_counter()
    with iterate(ds, workers=workers, threads=1) as it:
        next(it)
        t1 = time.perf_counter()
        for _ in range(warmup_batches(workers) - 1):
            next(it)
        t2 = time.perf_counter()
        for _ in range(batches):
            next(it)
        t3 = time.perf_counter()
    return t1 - t0, t3 - t2


def parse_args(argv=None) -> argparse.Namespace:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.input_pipeline", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--data", help="image folder (a folder per class); default: write one of --images JPEGs")
    p.add_argument("--images", type=int, default=512, help="JPEGs to write when --data is not given")
    p.add_argument("--mode", choices=("train", "eval"), default="train", help="training or evaluation transform")
    p.add_argument("--image-size", type=int, default=224, help="model input side, pixels")
    p.add_argument("--batch-size", type=int, default=32, help="images per batch")
    p.add_argument("--batches", type=int, help="batches timed per run (default: 8 per worker, at least 12)")
    p.add_argument("--workers", default=f"1,{cores}", help="comma-separated worker counts")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: imagefolder, arrayrecord")
    p.add_argument("--repeats", type=int, default=2, help="interleaved runs per worker count")
    p.add_argument("--out", help="append one JSON line per run to this file")
    args = p.parse_args(argv)
    try:
        args.workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        p.error(f"--workers {args.workers!r}: expected comma-separated ints, e.g. 1,2")
    if min(args.workers) < 1:
        p.error(f"--workers {args.workers}: expected counts >= 1")
    args.formats = args.formats.split(",")
    if not args.formats or set(args.formats) - set(FORMATS):
        p.error(f"--formats {','.join(args.formats)}: expected some of {','.join(FORMATS)}")
    if args.batches is None:
        args.batches = max(12, 8 * max(args.workers))
    for name in ("images", "image_size", "batch_size", "batches", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive int")
    return args


def main(argv=None) -> int:
    from vit_common.data.arrayrecord import write_arrayrecord
    from vit_common.data.augment import Augment
    from vit_common.data.datasets import load_dataset, open_stored
    from vit_common.data.images import PRESETS
    from vit_jax.data import train_batches, transform_for

    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.data) if args.data else make_folder(Path(tmp) / "jpegs", args.images)
        specs = {"imagefolder": f"imagefolder:{folder}"}
        if "arrayrecord" in args.formats:
            write_arrayrecord(open_stored(specs["imagefolder"]), Path(tmp) / "records")
            specs["arrayrecord"] = f"arrayrecord:{Path(tmp) / 'records'}"
        size = (args.image_size, args.image_size)
        augment = Augment(crop_scale=0.08, flip=True) if args.mode == "train" else None
        pipelines = {}
        for fmt in args.formats:
            data = load_dataset(specs[fmt], size, 3, val_fraction=0.01)
            need = (args.batches + warmup_batches(max(args.workers))) * args.batch_size
            ds = train_batches(
                data.train,
                data.num_classes,
                batch_size=args.batch_size,
                epochs=-(-need // len(data.train)) + 1,
                seed=0,
                transform=transform_for(data, PRESETS["imagenet"], augment),
            )
            pipelines[fmt] = (ds, len(data.train))
        rates: dict[tuple[str, int], list[float]] = {(f, w): [] for f in args.formats for w in args.workers}
        for r in range(args.repeats):
            for fmt, (ds, images) in pipelines.items():
                for w in args.workers:
                    record = {
                        "schema": SCHEMA,
                        "time": datetime.now(UTC).isoformat(timespec="seconds"),
                        "machine": host(),
                        "data": str(args.data or f"{args.images} generated 224x224 JPEGs"),
                        "format": fmt,
                        "images": images,
                        "mode": args.mode,
                        "image_size": args.image_size,
                        "batch_size": args.batch_size,
                        "workers": w,
                        "repeat": r,
                    }
                    startup, seconds = run_once(ds, workers=w, batches=args.batches)
                    rate = args.batches * args.batch_size / seconds
                    rates[(fmt, w)].append(rate)
                    record |= {
                        "startup_s": startup,
                        "warmup_batches": warmup_batches(w),
                        "batches": args.batches,
                        "seconds": seconds,
                        "images_per_s": rate,
                    }
                    assert set(record) == set(RECORD_FIELDS)
                    print(f"{fmt}, workers {w}: {rate:7.1f} images/s (start-up {startup:.1f} s)", file=sys.stderr)
                    if args.out:
                        report.append_jsonl([record], args.out)
    med = {k: statistics.median(v) for k, v in rates.items()}
    for (fmt, w), m in med.items():
        line = (
            f"{fmt}, {w} worker(s): median {m:.1f} images/s, {m / med[(fmt, args.workers[0])]:.2f}x {args.workers[0]}"
        )
        if fmt == "arrayrecord" and ("imagefolder", w) in med:
            line += f"; {m / med[('imagefolder', w)]:.2f}x the image folder's"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
