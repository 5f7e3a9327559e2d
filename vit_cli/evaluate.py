"""`vit evaluate CHECKPOINT --dataset ...`: accuracy and a confusion-matrix PNG for a trained model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vit_cli.convert import add_checkpoint_arguments, checkpoint_options
from vit_cli.main import HelpFormatter
from vit_common.validate import arg, float_in, int_in


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="accuracy and confusion matrix of a checkpoint on a dataset",
        formatter_class=HelpFormatter,
        description="Evaluate a checkpoint (any format vit_jax/vit_torch load_model reads, e.g. a run's "
        "model.safetensors) on a dataset: accuracy, per-class accuracy and a confusion-matrix PNG. Images "
        "are resized to the model's image size and channels.",
    )
    p.add_argument("checkpoint", help="model file or folder")
    add_checkpoint_arguments(p)
    p.add_argument("--dataset", default="mnist5k", help="mnist5k, digits, imagefolder:PATH or npz:PATH")
    p.add_argument("--split", choices=("test", "train"), default="test", help="which split to evaluate")
    p.add_argument(
        "--val-fraction",
        type=arg(float_in, 0, 1, lo_open=True, hi_open=True),
        default=0.2,
        help="test share for datasets without their own split (must match training's)",
    )
    p.add_argument("--framework", choices=("jax", "torch"), default="jax", help="which twin runs the model")
    p.add_argument("--batch-size", type=arg(int_in, 1), default=256, help="images per forward pass")
    p.add_argument("--confusion", default="confusion.png", help="where to write the confusion-matrix PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    from tqdm import tqdm

    from vit_cli.run_model import load, logits
    from vit_jax.data import eval_batches, load_dataset

    if args.batch_size < 1:
        raise ValueError(f"--batch-size={args.batch_size}: expected a positive int")
    model = load(args.checkpoint, args.framework, checkpoint_options(args))
    cfg = model.cfg
    data = load_dataset(args.dataset, cfg.image_size, cfg.in_chans, val_fraction=args.val_fraction)
    if data.num_classes > cfg.num_classes:
        raise ValueError(f"dataset {args.dataset!r} has {data.num_classes} classes, the model only {cfg.num_classes}")
    source = data.test if args.split == "test" else data.train
    batches = list(eval_batches(source, data.num_classes, batch_size=args.batch_size))
    outs = tqdm(
        logits(model, args.framework, (b["image"] for b in batches)),
        total=len(batches),
        unit="batch",
        desc="evaluate",
        disable=args.json,
    )
    pred = np.concatenate([o.argmax(-1) for o in outs])
    mask = np.concatenate([b["mask"] for b in batches]) > 0
    label = np.concatenate([b["label"] for b in batches])[mask]
    pred = pred[mask]
    classes = class_names(args.checkpoint, cfg.num_classes)
    matrix = confusion_png(label, pred, classes, Path(args.confusion), title=f"{args.dataset} {args.split}")
    per_class = {classes[k]: float(matrix[k, k] / matrix[k].sum()) for k in range(len(matrix)) if matrix[k].sum()}
    result = {
        "checkpoint": str(args.checkpoint),
        "dataset": args.dataset,
        "split": args.split,
        "framework": args.framework,
        "images": int(mask.sum()),
        "accuracy": float((pred == label).mean()),
        "per_class_accuracy": per_class,
        "confusion_png": args.confusion,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"accuracy {result['accuracy']:.4f} on {result['images']} {args.split} images of {args.dataset} "
            f"({args.framework}); confusion matrix: {args.confusion}"
        )
        print("per class: " + ", ".join(f"{k} {v:.3f}" for k, v in per_class.items()))
    return 0


def class_names(checkpoint: str, num_classes: int) -> list[str]:
    """Class names from the run's config.json beside the checkpoint, else "0".."K-1"."""
    p = Path(checkpoint)
    cfg_json = (p if p.is_dir() else p.parent) / "config.json"
    if cfg_json.is_file():
        try:
            classes = json.loads(cfg_json.read_text()).get("classes")
        except (ValueError, AttributeError):
            classes = None
        if isinstance(classes, list) and len(classes) == num_classes:
            return [str(c) for c in classes]
    return [str(k) for k in range(num_classes)]


def confusion_png(label, pred, classes: list[str], png: Path, title: str):
    """Write the K x K confusion matrix (rows true, columns predicted) as a PNG; return the counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay, confusion_matrix

    from vit_common.io import atomic_write

    matrix = confusion_matrix(label, pred, labels=list(range(len(classes))))
    size = max(5.0, 0.45 * len(classes) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ConfusionMatrixDisplay(matrix, display_labels=classes).plot(
        ax=ax, colorbar=False, cmap="Blues", include_values=len(classes) <= 30
    )
    ax.set_title(f"{title}: accuracy {(label == pred).mean():.4f}")
    fig.tight_layout()
    atomic_write(png, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)
    return matrix
