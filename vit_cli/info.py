"""`vit info VARIANT`: the config, parameter count and forward GFLOPs per image of a variant."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="show a variant's config, parameter count and GFLOPs",
        description="Show the config, parameter count and forward GFLOPs per image of a ViT variant, "
        "e.g. 'vit info B/16' or 'vit info S/16 --num-classes 10 --image-size 384'. Needs neither "
        "JAX nor PyTorch.",
    )
    p.add_argument("variant", help="variant string NAME/PATCH, e.g. B/16, Ti/16, So400m/14")
    p.add_argument("--num-classes", type=int, default=None, help="head size K (default 1000; 0 = none)")
    p.add_argument("--image-size", type=int, default=None, help="square image size in pixels (default 224)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vit_common.config import ViTConfig

    overrides = {}
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    if args.image_size is not None:
        overrides["image_size"] = args.image_size
    cfg = ViTConfig.from_name(args.variant, **overrides)
    params, flops = cfg.param_count(), cfg.flops()
    if args.json:
        print(
            json.dumps(
                {
                    "variant": args.variant,
                    "params": params,
                    "gflops": flops / 1e9,
                    "seq_len": cfg.seq_len,
                    "config": cfg.to_dict(),
                }
            )
        )
        return 0
    print(f"ViT {args.variant}")
    print(f"  parameters      {params:,}")
    print(f"  GFLOPs / image  {flops / 1e9:.2f}  (forward, 2 x multiply-adds)")
    print(f"  tokens          {cfg.seq_len}  (grid {cfg.grid[0]}x{cfg.grid[1]} + {cfg.num_prefix_tokens} prefix)")
    print("  config")
    for k, v in cfg.to_dict().items():
        print(f"    {k:18s}{v}")
    return 0
