"""`vit predict CHECKPOINT IMAGE...`: top-k classes of image files with either twin."""

from __future__ import annotations

import argparse
import json

from vit_cli.convert import add_checkpoint_arguments, checkpoint_options
from vit_cli.main import HelpFormatter
from vit_common.validate import arg, int_in


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="top-k classes of image files",
        formatter_class=HelpFormatter,
        description="Classify image files with a checkpoint (any format vit_jax/vit_torch load_model reads). "
        "Each image is converted to the model's channels, resized to its image size and scaled to [-1, 1], "
        "as in training. Class names come from the run's config.json beside the checkpoint, if any.",
    )
    p.add_argument("checkpoint", help="model file or folder")
    add_checkpoint_arguments(p)
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, ...)")
    p.add_argument("--framework", choices=("jax", "torch"), default="jax", help="which twin runs the model")
    p.add_argument("--top-k", type=arg(int_in, 1), default=3, help="how many classes to list per image")
    p.add_argument("--json", action="store_true", help="print one JSON object per image")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from vit_cli.evaluate import class_names
    from vit_cli.run_model import load, logits
    from vit_jax.data import normalize, read_image

    model = load(args.checkpoint, args.framework, checkpoint_options(args))
    cfg = model.cfg
    if not 1 <= args.top_k:
        raise ValueError(f"--top-k={args.top_k}: expected a positive int")
    images = normalize(np.stack([read_image(p, cfg.image_size, cfg.in_chans) for p in args.images]))
    out = next(iter(logits(model, args.framework, [images]))).astype(np.float64)
    bad = [path for path, row in zip(args.images, out, strict=True) if not np.isfinite(row).all()]
    if bad:
        raise ValueError(
            f"{args.checkpoint}: the logits of {', '.join(bad)} are NaN or Inf (weights holding NaN/Inf, "
            f"or overflow in {cfg.dtype}); no prediction printed"
        )
    probs = np.exp(out - out.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    classes = class_names(args.checkpoint, cfg.num_classes)
    k = min(args.top_k, cfg.num_classes)
    for path, p in zip(args.images, probs, strict=True):
        top = np.argsort(-p, kind="stable")[:k]
        if args.json:
            print(
                json.dumps(
                    {
                        "image": path,
                        "top": [{"class": classes[i], "index": int(i), "probability": float(p[i])} for i in top],
                    }
                )
            )
        else:
            print(f"{path}: " + ", ".join(f"{classes[i]} {p[i]:.3f}" for i in top))
    return 0
