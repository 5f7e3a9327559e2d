"""`vit evaluate CHECKPOINT --dataset ...`: accuracy and a confusion-matrix PNG for a trained model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vit_cli.convert import add_checkpoint_arguments, checkpoint_options
from vit_cli.main import HelpFormatter
from vit_cli.run_model import add_image_flags
from vit_common.system.validate import arg, float_in, int_in


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="accuracy and confusion matrix of a checkpoint on a dataset",
        formatter_class=HelpFormatter,
        description="Evaluate a checkpoint (any format vit_jax/vit_torch load_model reads, e.g. a run's "
        "model.safetensors) on a dataset: accuracy, per-class accuracy and a confusion-matrix PNG labelled "
        "with the class names. Images get the checkpoint's preprocessing (vit_common.data.images). When the "
        "checkpoint and the dataset both name their classes, labels are matched by name.",
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
    add_image_flags(p)
    p.add_argument("--confusion", default="confusion.png", help="where to write the confusion-matrix PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    from tqdm import tqdm

    from vit_cli.flags import values
    from vit_cli.run_model import class_names, load_with_info, logits
    from vit_common.data.datasets import EvalBatches, ImageTransform, load_dataset
    from vit_common.data.images import Preprocess
    from vit_common.system.io import check_destination

    if args.batch_size < 1:
        raise ValueError(f"--batch-size={args.batch_size}: expected a positive int")
    check_destination(args.confusion)  # refused before the evaluation, not after it
    model, info = load_with_info(
        args.checkpoint, args.framework, checkpoint_options(args), values(Preprocess, args), args.classes
    )
    cfg = model.cfg
    data = load_dataset(
        args.dataset, cfg.image_size, cfg.in_chans, val_fraction=args.val_fraction, preprocess=info.preprocess
    )
    classes = class_names(info, cfg.num_classes)
    to_model = label_map(data.classes, info.classes, cfg.num_classes, args.dataset)
    source = data.test if args.split == "test" else data.train
    batches = EvalBatches(
        source, data.num_classes, args.batch_size, ImageTransform(cfg.image_size, cfg.in_chans, info.preprocess)
    )
    outs = tqdm(
        logits(model, args.framework, (b["image"] for b in batches)),
        total=len(batches),
        unit="batch",
        desc="evaluate",
        disable=args.json,
    )
    pred = np.concatenate([o.argmax(-1) for o in outs])
    mask = np.concatenate([b["mask"] for b in batches]) > 0
    label = to_model[np.concatenate([b["label"] for b in batches])[mask]]
    pred = pred[mask]
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
        "classes": classes,
        "classes_source": info.classes_source,
        "preprocess": info.preprocess.to_dict(),
        "preprocess_source": info.preprocess_source,
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


def label_map(data_classes, model_classes, num_classes: int, dataset: str):
    """int array: dataset label -> model class index. By name when the model names its classes (every
    dataset class must be one of them), else the same index (the dataset may have fewer classes).

    Raises:
        ValueError: the dataset has more classes than the model, or classes the model does not name.
    """
    import numpy as np

    if len(data_classes) > num_classes:
        raise ValueError(f"dataset {dataset!r} has {len(data_classes)} classes, the model only {num_classes}")
    if model_classes is None:
        return np.arange(len(data_classes))
    index = {c: k for k, c in enumerate(model_classes)}
    missing = [c for c in data_classes if c not in index]
    if missing:
        raise ValueError(
            f"dataset {dataset!r} has classes {missing} that the model's classes {list(model_classes)} do not "
            "name (pass --classes to name the model's classes)"
        )
    return np.array([index[c] for c in data_classes])


def confusion_png(label, pred, classes: list[str], png: Path, title: str):
    """Write the K x K confusion matrix (rows true, columns predicted) as a PNG; return the counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay, confusion_matrix

    from vit_common.system.io import PNG_TEXT, atomic_write

    matrix = confusion_matrix(label, pred, labels=list(range(len(classes))))
    size = max(5.0, 0.45 * len(classes) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ConfusionMatrixDisplay(matrix, display_labels=classes).plot(
        ax=ax, colorbar=False, cmap="Blues", include_values=len(classes) <= 30
    )
    ax.set_title(f"{title}: accuracy {(label == pred).mean():.4f}")
    fig.tight_layout()
    atomic_write(png, lambda tmp: fig.savefig(tmp, dpi=100, format="png", metadata=PNG_TEXT))
    plt.close(fig)
    return matrix
