"""`vit evaluate CHECKPOINT --dataset ...`: accuracy and a confusion matrix for a trained model.

The results are printed before anything is drawn, and every figure is bounded in size whatever the class
count K: a PNG is at most ``MAX_INCHES`` x 100 dpi pixels a side (2,000 px); up to ``MAX_LABELLED``
classes it names every class (and up to ``MAX_VALUES`` shows every count), above that it is a heat map
of the row-normalised matrix without labels, and the counts are in the output the user asked for
(``--confusion FILE.csv``, or the ``--json`` object's ``confusion_matrix``), as the printed line says.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vit_cli.convert import add_checkpoint_arguments, checkpoint_options
from vit_cli.flags import add_image_flags
from vit_cli.main import HelpFormatter
from vit_common.system.validate import arg, float_in, int_in

MAX_INCHES = 20.0  # a confusion PNG's side at most (x 100 dpi = 2,000 px; 1,000 classes once drew 45,200 px)
MAX_LABELLED = 50  # classes up to which the PNG names each class on its axes
MAX_VALUES = 30  # classes up to which the PNG writes each count in its cell
SUFFIXES = (".png", ".csv")  # what --confusion writes: a picture, or the counts as numbers


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="accuracy and confusion matrix of a checkpoint on a dataset",
        formatter_class=HelpFormatter,
        description="Evaluate a checkpoint (any format vit_jax/vit_torch load_model reads, e.g. a run's "
        "model.safetensors) on a dataset: accuracy, per-class accuracy and a confusion-matrix PNG labelled "
        "with the class names. Images get the checkpoint's preprocessing (vit_common.data.images; a NaFlex "
        "model's keep their aspect ratio, at most --max-patches patches each: vit_common.naflex). When the "
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
    p.add_argument(
        "--confusion",
        default=None,
        help="write the confusion matrix here (default: none written): .png a picture (at most 2,000 px a side; above "
        f"{MAX_LABELLED} classes a heat map without class labels), .csv the counts (rows true, columns predicted)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (with the counts, confusion_matrix)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    from tqdm import tqdm

    from vit_cli.flags import values
    from vit_common.data.augment import ImageTransform
    from vit_common.data.batches import EvalBatches
    from vit_common.data.datasets import load_dataset, read_dataset
    from vit_common.data.images import Preprocess
    from vit_common.naflex import NaFlexEvalBatches, check_model
    from vit_common.system.io import check_destination, check_writable
    from vit_compare.run_model import class_names, load_with_info, logits

    if args.batch_size < 1:
        raise ValueError(f"--batch-size={args.batch_size}: expected a positive int")
    if args.confusion is not None:
        if Path(args.confusion).suffix.lower() not in SUFFIXES:
            raise ValueError(f"--confusion {args.confusion}: expected a .png or .csv file")
        check_destination(args.confusion)  # refused before the evaluation, not after it
        check_writable(args.confusion)
    model, info = load_with_info(
        args.checkpoint, args.framework, checkpoint_options(args), values(Preprocess, args), args.classes
    )
    cfg, pp = model.cfg, info.preprocess
    if pp.max_patches is None:
        data = load_dataset(args.dataset, cfg.image_size, cfg.in_chans, val_fraction=args.val_fraction, preprocess=pp)
    else:  # NaFlex: every image at its own size and aspect ratio
        data = read_dataset(args.dataset, val_fraction=args.val_fraction)
    classes = class_names(info, cfg.num_classes)
    to_model = label_map(data.classes, info.classes, cfg.num_classes, args.dataset)
    source = data.test if args.split == "test" else data.train
    if pp.max_patches is None:
        batches = EvalBatches(
            source, data.num_classes, args.batch_size, ImageTransform(cfg.image_size, cfg.in_chans, pp)
        )
    else:
        check_model(cfg, pp.max_patches, min(args.batch_size, len(source)), str(args.checkpoint))
        batches = NaFlexEvalBatches(source, args.batch_size, cfg.patch_size[0], cfg.in_chans, pp)
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
    matrix = confusion_counts(label, pred, len(classes))
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
        "confusion": args.confusion,
        "confusion_matrix": matrix.tolist(),
    }
    path = None if args.confusion is None else Path(args.confusion)
    if args.json:  # printed before anything is drawn: a failed picture loses no result
        print(json.dumps(result), flush=True)
    else:
        print(
            f"accuracy {result['accuracy']:.4f} on {result['images']} {args.split} images of {args.dataset} "
            f"({args.framework}); confusion matrix: {confusion_line(path, len(classes))}"
        )
        print(per_class_line(per_class), flush=True)
    if path is None:
        return 0
    if path.suffix.lower() == ".csv":
        confusion_csv(matrix, classes, path)
    else:
        confusion_png(matrix, classes, path, title=f"{args.dataset} {args.split}: accuracy {result['accuracy']:.4f}")
    return 0


def per_class_line(per_class: dict[str, float]) -> str:
    """Every class's accuracy up to ``MAX_LABELLED`` classes, else the 10 lowest (one bounded line)."""
    if len(per_class) <= MAX_LABELLED:
        return "per class: " + ", ".join(f"{k} {v:.3f}" for k, v in per_class.items())
    lowest = sorted(per_class.items(), key=lambda kv: kv[1])[:10]
    return f"per class ({len(per_class)} classes; the 10 lowest, all in --json): " + ", ".join(
        f"{k} {v:.3f}" for k, v in lowest
    )


def confusion_line(path: Path | None, k: int) -> str:
    """What the printed result says about the confusion matrix of ``k`` classes written to ``path``
    (None: not written, and how to ask for it)."""
    if path is None:
        return "not written (--confusion FILE.png for a picture, FILE.csv for the counts)"
    if path.suffix.lower() == ".csv" or k <= MAX_LABELLED:
        return str(path)
    return (
        f"{path} ({k} classes: a heat map without class labels; the counts: --confusion FILE.csv, "
        "or --json's confusion_matrix)"
    )


def confusion_counts(label, pred, k: int):
    """int64 [K, K] counts, rows the true class, columns the predicted one."""
    from sklearn.metrics import confusion_matrix

    return confusion_matrix(label, pred, labels=list(range(k))).astype("int64")


def confusion_csv(matrix, classes: list[str], path: Path) -> None:
    """The counts as CSV (csv module quoting): a header ``true/predicted`` + the class names, then one row
    per true class, its name first."""
    import csv
    import io as text_io

    from vit_common.system.io import write_text

    buf = text_io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["true/predicted", *classes])
    for name, row in zip(classes, matrix.tolist(), strict=True):
        w.writerow([name, *row])
    write_text(path, buf.getvalue())


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


def confusion_png(matrix, classes: list[str], png: Path, title: str) -> None:
    """Draw the [K, K] counts ``matrix`` (rows true, columns predicted) as a PNG of at most
    ``MAX_INCHES`` x 100 dpi pixels a side: with class names up to ``MAX_LABELLED`` classes (counts in
    the cells up to ``MAX_VALUES``), else a heat map of each row's share without labels."""
    from matplotlib.figure import Figure

    from vit_common.system.io import PNG_TEXT, atomic_write

    k = len(classes)
    size = min(max(5.0, 0.45 * k + 2), MAX_INCHES)
    fig = Figure(figsize=(size, size), dpi=100)
    ax = fig.subplots()
    if k <= MAX_LABELLED:
        from sklearn.metrics import ConfusionMatrixDisplay

        ConfusionMatrixDisplay(matrix, display_labels=classes).plot(
            ax=ax, colorbar=False, cmap="Blues", include_values=k <= MAX_VALUES
        )
    else:
        rows = matrix.sum(1, keepdims=True)
        share = matrix / (rows + (rows == 0))
        im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
        ax.set(xlabel=f"predicted class (0..{k - 1})", ylabel=f"true class (0..{k - 1})")
    ax.set_title(title)
    fig.tight_layout()
    atomic_write(png, lambda tmp: fig.savefig(tmp, dpi=100, format="png", metadata=PNG_TEXT))
