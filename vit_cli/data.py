"""`vit data convert SRC DST`: write a dataset as ArrayRecord files (grain's native format).

SRC is an image folder (``PATH`` or ``imagefolder:PATH``) or a Hugging Face dataset (``hf:PATH``); DST a
new folder, written atomically (``vit_common.data.arrayrecord.write_arrayrecord``), which ``vit train
--dataset arrayrecord:DST`` reads with the same splits, labels and class names, so the same batches.
Every image of SRC is decoded once first; a broken one is refused before anything is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vit_cli.main import HelpFormatter
from vit_common.system.validate import arg, int_in


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "data",
        help="convert a dataset to ArrayRecord files",
        description="Dataset tools. 'vit data convert SRC DST' writes an image folder (PATH or imagefolder:PATH) "
        "or a Hugging Face dataset (hf:PATH) as ArrayRecord files of encoded image + label records into the "
        "new folder DST, for --dataset arrayrecord:DST.",
    )
    tools = p.add_subparsers(dest="tool", metavar="TOOL", required=True)
    c = tools.add_parser(
        "convert", help="write SRC as ArrayRecord files into the new folder DST", formatter_class=HelpFormatter
    )
    c.add_argument("source", metavar="SRC", help="image folder (PATH or imagefolder:PATH) or hf:PATH")
    c.add_argument("dest", metavar="DST", help="new folder for the ArrayRecord files and dataset.json")
    c.add_argument(
        "--shard-size", type=arg(int_in, 1), default=1024, help="records per file (train-00000-of-N.array_record)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vit_common.data.arrayrecord import write_arrayrecord
    from vit_common.data.datasets import check_outside, open_stored, verify_stored

    spec = args.source if args.source.partition(":")[0] in ("imagefolder", "hf") else f"imagefolder:{args.source}"
    check_outside(spec, args.dest, "DST")
    stored = open_stored(spec)
    verify_stored(spec, stored)
    written = write_arrayrecord(stored, Path(args.dest), args.shard_size)
    counts = " + ".join(f"{n} {split}" for split, n in written.items())
    classes = len(stored.classes)
    print(f"{args.dest}: {counts} records, {classes} classes; train on it with --dataset arrayrecord:{args.dest}")
    return 0
