"""`vit parity CHECKPOINT`: load one checkpoint into both twins (and optionally timm or transformers),
run the same images through each, and compare every intermediate under the one tolerance table.

The flags of ``vit_compare.inference.run_parity``; its table printed, and with --report the pictures of
``vit_compare.report``.
"""

from __future__ import annotations

import argparse

from vit_cli.convert import add_checkpoint_arguments, checkpoint_options
from vit_common.system.io import check_destination, write_json
from vit_common.system.validate import arg, int_in


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "parity",
        help="prove a checkpoint gives the same numbers in the JAX and torch twins",
        description="Load CHECKPOINT (any format `vit convert` reads) into both twins, run the same images "
        "through each with full matmul precision and compare every intermediate (patch embedding, every "
        "block and attention map, final norm, pooling, logits) under the tolerance table of "
        "vit_common.tolerance. Exit code 1 if anything is beyond tolerance.",
    )
    p.add_argument("checkpoint", help="checkpoint file or folder")
    add_checkpoint_arguments(p)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="compute dtype (default float32)")
    p.add_argument(
        "--images",
        metavar="DIR",
        help="folder of images to run, searched recursively as for training, with the checkpoint's "
        "preprocessing (default: 4 generated ones)",
    )
    p.add_argument("--max-images", type=arg(int_in, 1), default=16, help="with --images: use the first this many")
    p.add_argument(
        "--max-patches",
        type=arg(int_in, 1),
        help="with --images, a NaFlex model (SigLIP 2): each image keeps its aspect ratio, resized to at most this "
        "many patches (default: the checkpoint's budget)",
    )
    p.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT")
    p.add_argument(
        "--against",
        choices=("timm", "transformers"),
        help="add that library's own model, loaded from the same weights, as a third column",
    )
    p.add_argument("--image-size", type=arg(int_in, 1), help="resample the position embedding to this size first")
    p.add_argument(
        "--report",
        metavar="DIR",
        help="also write pictures to DIR: diffs.png (per-layer max and mean |JAX - torch|, log scale, "
        "tolerance line), maps.png (one attention map from each twin and their difference) and index.html",
    )
    p.add_argument(
        "--layer", type=arg(int_in, 0), help="with --report: block whose attention it draws (default: the last)"
    )
    p.add_argument("--head", type=arg(int_in, 0), help="with --report: head whose attention it draws (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.max_images < 1:
        raise ValueError(f"--max-images={args.max_images}: expected a positive int")
    if not args.report and (args.layer is not None or args.head is not None):
        raise ValueError("--layer and --head choose the map --report draws: pass --report DIR too")
    if args.max_patches is not None and not args.images:
        raise ValueError(f"--max-patches {args.max_patches} is the budget of --images: pass --images DIR too")
    if args.json:
        check_destination(args.json)  # refused before the comparison, not after it
    from vit_compare.inference import format_table, report_maps, run_parity

    options = checkpoint_options(args) | ({"image_size": args.image_size} if args.image_size else {})
    result = run_parity(
        args.checkpoint,
        dtype=args.dtype,
        images=args.images,
        against=args.against,
        keep_outputs=bool(args.report),
        max_images=args.max_images,
        max_patches=args.max_patches,
        **options,
    )
    print(format_table(result))
    if args.json:
        write_json(args.json, result.to_dict(), indent=1)
    if args.report:
        from vit_compare.report import write_parity_report

        paths = write_parity_report(
            args.report,
            [r.to_dict() for r in result.rows],
            report_maps(result, -1 if args.layer is None else args.layer, args.head or 0),
            meta={
                "checkpoint": result.checkpoint,
                "format": result.format,
                "variant": result.variant,
                "dtype": result.dtype,
                "images": ", ".join(result.images),
            },
        )
        print(f"report: {paths['index']}")
    return 0 if result.ok else 1
