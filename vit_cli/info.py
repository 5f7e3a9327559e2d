"""`vit info VARIANT|CHECKPOINT`: the config, parameter count and forward GFLOPs per image of a variant, or
of a checkpoint together with where each of its config fields came from."""

from __future__ import annotations

import argparse
import json
import os

from vit_cli.convert import add_checkpoint_arguments, checkpoint_options
from vit_common.system.validate import arg, int_in


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="show a variant's or a checkpoint's config, parameter count and GFLOPs",
        description="Show the config, parameter count and forward GFLOPs per image of a ViT variant, "
        "e.g. 'vit info B/16' or 'vit info S/16 --num-classes 10 --image-size 384', or of a checkpoint "
        "file or folder (any format `vit convert` reads), with the provenance of each config field: "
        "declared by the file, derived from tensor shapes, assumed (a warning names the flag that "
        "supplies it) or given with --set. Needs neither JAX nor PyTorch, except to open orbax folders "
        "(JAX) and .pth/.bin files (PyTorch).",
    )
    p.add_argument("source", metavar="VARIANT|CHECKPOINT", help="variant NAME/PATCH (B/16, So400m/14) or a path")
    p.add_argument(
        "--num-classes", type=arg(int_in, 0), default=None, help="variant: head size K (default 1000; 0 = none)"
    )
    p.add_argument(
        "--image-size", type=arg(int_in, 1), default=None, help="variant: square image size in pixels (default 224)"
    )
    add_checkpoint_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def _summary(cfg, info=None) -> list[str]:
    """Parameters, GFLOPs and tokens of an image: at a NaFlex model's patch budget (``info``'s
    ``max_patches``: the padded batch's patches an image), else at the config's grid."""
    n = None if info is None else info.preprocess.max_patches
    grid, prefix = f"grid {cfg.grid[0]}x{cfg.grid[1]}", f"{cfg.num_prefix_tokens} prefix"
    if n is not None:
        at = f"at the patch budget, {n} patches"
        tokens = f"{n + cfg.num_prefix_tokens}  (patch budget {n} + {prefix}; the position table's {grid})"
    else:
        at = f"at the {grid}" + ("; the patch budget is not declared" if info is not None and info.no_budget else "")
        tokens = f"{cfg.seq_len}  ({grid} + {prefix})"
    return [
        f"  parameters      {cfg.param_count():,}",
        f"  GFLOPs / image  {cfg.flops(patches=n) / 1e9:.2f}  (forward, 2 x multiply-adds, {at})",
        f"  tokens          {tokens}",
    ]


def _checkpoint(args: argparse.Namespace) -> int:
    from vit_cli.convert import readers_for
    from vit_common.checkpoints.convert import load_checkpoint, open_checkpoint
    from vit_common.config import RUNTIME_FIELDS

    if args.num_classes is not None or args.image_size is not None:
        raise ValueError("--num-classes and --image-size describe a variant; a checkpoint says its own")
    src = open_checkpoint(args.source)
    ckpt = load_checkpoint(src, readers=readers_for(src), **checkpoint_options(args))
    cfg, report = ckpt.cfg, ckpt.report
    pp = ckpt.info
    n = pp.preprocess.max_patches  # a NaFlex model: its patch budget
    if args.json:
        seq = cfg.seq_len if n is None else n + cfg.num_prefix_tokens
        out = report.to_dict() | {"gflops": cfg.flops(patches=n) / 1e9, "seq_len": seq, "info": pp.to_dict()}
        print(json.dumps(out))
        return 0
    print(f"{args.source}: {report.format}" + (f" ({report.layout})" if report.layout else ""))
    print(f"  variant         {report.variant}")
    print("\n".join(_summary(cfg, pp)))
    print(f"  preprocessing   {pp.describe(cfg.image_size)}  ({pp.preprocess_source})")
    print("  config          (value, then where it came from)")
    for line in report.provenance_lines():
        print(f"    {line}")
    for k in sorted(RUNTIME_FIELDS):
        print(f"    {k:20s} = {getattr(cfg, k)!r:24s} run-time  (a training or execution choice)")
    for k, why in report.dropped:
        print(f"  dropped         {k}: {why}")
    for n in report.notes:
        print(f"  note            {n}")
    for i, line in enumerate(report.assumption_block()):
        print(f"  {'assumed' if i == 0 else '':16s}{line}")
    for w in report.warnings:
        print(f"  WARNING         {w}")
    return 0


def run(args: argparse.Namespace) -> int:
    from vit_common.checkpoints.hub import is_hub_id
    from vit_common.config import ViTConfig

    if os.path.exists(args.source) or is_hub_id(args.source):
        return _checkpoint(args)
    if args.settings or args.source_image_size or args.strict:
        raise ValueError(f"{args.source!r}: no such checkpoint; --set, --source-image-size and --strict read one")
    overrides = {}
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    if args.image_size is not None:
        overrides["image_size"] = args.image_size
    try:
        cfg = ViTConfig.from_name(args.source, **overrides)
    except ValueError as e:
        raise ValueError(f"{e} (and {args.source!r} is no checkpoint path)") from None
    params, flops = cfg.param_count(), cfg.flops()
    if args.json:
        print(
            json.dumps(
                {
                    "variant": args.source,
                    "params": params,
                    "gflops": flops / 1e9,
                    "seq_len": cfg.seq_len,
                    "config": cfg.to_dict(),
                }
            )
        )
        return 0
    print(f"ViT {args.source}")
    print("\n".join(_summary(cfg)))
    print("  config")
    fields = cfg.to_dict()
    width = max(map(len, fields)) + 2  # the longest name (pool_include_prefix) still has a gap after it
    for k, v in fields.items():
        print(f"    {k:{width}s}{v}")
    return 0
