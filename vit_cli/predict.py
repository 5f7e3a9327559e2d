"""`vit predict CHECKPOINT IMAGE...`: top-k classes of image files with either twin."""

from __future__ import annotations

import argparse
import json

from vit_cli.convert import add_checkpoint_arguments, checkpoint_options
from vit_cli.flags import add_image_flags
from vit_cli.main import HelpFormatter
from vit_common.system.validate import arg, int_in


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="top-k classes of image files",
        formatter_class=HelpFormatter,
        description="Classify images with a checkpoint (any format vit_jax/vit_torch load_model reads). Each "
        "image is decoded upright (EXIF orientation), converted to the model's channels, resized and "
        "centre-cropped and normalised with the checkpoint's preprocessing (vit_common.data.images), as in "
        "evaluation; for a NaFlex model (SigLIP 2) resized keeping its aspect ratio to at most --max-patches "
        "patches (vit_common.naflex). Class names come from the checkpoint, the run's config.json beside it, or "
        "--classes.",
    )
    p.add_argument("checkpoint", help="model file or folder")
    add_checkpoint_arguments(p)
    p.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE",
        help="image files, or folders searched for images (a folder of class folders, train/ + val/, ...)",
    )
    p.add_argument("--framework", choices=("jax", "torch"), default="jax", help="which twin runs the model")
    p.add_argument("--top-k", type=arg(int_in, 1), default=3, help="how many classes to list per image")
    p.add_argument("--batch-size", type=arg(int_in, 1), default=64, help="images per forward pass")
    add_image_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per image")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from vit_cli.flags import values
    from vit_common.data.images import Preprocess, list_images, load_image, normalize, open_image
    from vit_common.naflex import check_model, preprocess, stack_patches
    from vit_compare.run_model import class_names, load_with_info, logits

    files = list_images(args.images)
    model, info = load_with_info(
        args.checkpoint, args.framework, checkpoint_options(args), values(Preprocess, args), args.classes
    )
    cfg = model.cfg
    if not cfg.num_classes:
        raise ValueError(
            f"{args.checkpoint}: the model has no classifier head (num_classes 0), so no classes to rank: "
            "expected a classifier (vit train --init CHECKPOINT --dataset DATA fine-tunes a head on this backbone)"
        )
    classes = class_names(info, cfg.num_classes)
    k = min(args.top_k, cfg.num_classes)
    n = info.preprocess.max_patches  # NaFlex: square patches of the model's size, at most n an image
    if n is not None:
        check_model(cfg, n, min(args.batch_size, len(files)), str(args.checkpoint))

    def naflex(path):
        image = open_image(path)  # its errors name the path
        try:
            return preprocess(image, cfg.patch_size[0], n, cfg.in_chans, info.preprocess)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e

    def batches():
        for lo in range(0, len(files), args.batch_size):
            chunk = files[lo : lo + args.batch_size]
            if n is not None:
                yield stack_patches([naflex(p) for p in chunk], n)
                continue
            x = np.stack([load_image(p, cfg.image_size, cfg.in_chans, info.preprocess) for p in chunk])
            yield normalize(x, info.preprocess)

    out = np.concatenate(list(logits(model, args.framework, batches()))).astype(np.float64)
    bad = [str(path) for path, row in zip(files, out, strict=True) if not np.isfinite(row).all()]
    if bad:
        raise ValueError(
            f"{args.checkpoint}: the logits of {', '.join(bad)} are NaN or Inf (weights holding NaN/Inf, "
            f"or overflow in {cfg.dtype}); no prediction printed"
        )
    probs = np.exp(out - out.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    for path, p in zip(files, probs, strict=True):
        top = np.argsort(-p, kind="stable")[:k]
        if args.json:
            print(
                json.dumps(
                    {
                        "image": str(path),
                        "top": [{"class": classes[i], "index": int(i), "probability": float(p[i])} for i in top],
                    }
                )
            )
        else:
            print(f"{path}: " + ", ".join(f"{classes[i]} {p[i]:.3f}" for i in top))
    return 0
