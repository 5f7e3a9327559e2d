"""`vit recipes`: the optimizer recipes both twins run (vit_common/training/recipes.py), and the translation of a
weight decay from one recipe to another with what it cannot keep.

    vit recipes                                         the table
    vit recipes --translate big_vision timm --lr 1e-3 --weight-decay 1e-4
        big_vision weight_decay=0.0001 at lr=0.001 = timm weight_decay=0.1, then the lines it cannot keep
"""

from __future__ import annotations

import argparse

from vit_common.system.validate import arg, float_in
from vit_common.training.recipes import RECIPES, translate


def add_parser(sub: argparse._SubParsersAction) -> None:
    from vit_cli.main import HelpFormatter

    p = sub.add_parser(
        "recipes",
        help="the optimizer recipes (twins, timm, torch, big_vision, optax); translate a weight decay between them",
        formatter_class=HelpFormatter,
        description="Without --translate: each recipe's decay mask, whether its decay is multiplied by the base "
        "learning rate, its first moment's dtype, its clip and its library's default weight decay. With "
        "--translate SOURCE TARGET: the TARGET weight decay that decays as SOURCE's --weight-decay at --lr, and "
        "what the translation cannot keep.",
    )
    p.add_argument("--translate", nargs=2, metavar=("SOURCE", "TARGET"), default=None, choices=tuple(RECIPES))
    p.add_argument("--lr", type=arg(float_in, 0, lo_open=True), default=1e-3, help="base learning rate")
    p.add_argument("--weight-decay", type=arg(float_in, 0), default=1e-4, help="SOURCE's weight decay")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.translate:
        print(translate(args.weight_decay, args.lr, *args.translate))
        return 0
    print(f"{'recipe':<11} {'decays':<8} {'wd x lr':<8} {'mu dtype':<9} {'clip':<6} {'wd default':>10}  source")
    for r in RECIPES.values():
        print(
            f"{r.name:<11} {r.decay:<8} {'yes' if r.decay_scaled_by_lr else 'no':<8} {r.mu_dtype or 'param':<9} "
            f"{r.clip:<6} {r.weight_decay_default:>10g}  {r.source}"
        )
    return 0
