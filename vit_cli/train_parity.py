"""`vit train-parity`: does a JAX training run reproduce the PyTorch one, step by step?

``vit train-parity --steps K`` (flags of ``vit train``'s model and optimisation, ``--torch-recipe``,
``--json``, ``--plot``; ``--init CHECKPOINT`` to start from a checkpoint, with ``--lora RANK`` to fine-tune
LoRA adapters of it in both twins, ``--max-patches N`` for a NaFlex one's patch budget, as ``vit train``'s) runs
``vit_compare.training.compare_training`` and prints one line a step; exit
code 1 when the twins part, 2 on bad input.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from vit_common.training.train_config import TrainConfig


def add_parser(sub) -> None:
    from vit_cli.convert import add_checkpoint_arguments
    from vit_cli.flags import add_flags
    from vit_cli.main import HelpFormatter
    from vit_cli.train import OPTIMISATION
    from vit_common.config import DEMO_MODEL
    from vit_common.data.augment import Augment
    from vit_common.data.images import Preprocess
    from vit_common.system.validate import arg, float_in, int_in
    from vit_common.training.recipes import RECIPES
    from vit_compare.training import LORA_SETTINGS

    p = sub.add_parser(
        "train-parity",
        help="train K steps in both twins from the same weights and batches, compare every parameter and moment",
        formatter_class=HelpFormatter,
        description="Does my JAX run reproduce my PyTorch run? The same initial weights and the same K batches "
        "(one input pipeline) go through K optimizer steps of the JAX twin (optax) and of the torch twin "
        "(torch.optim); per step it prints both losses, the gradient norm, the learning rate and the largest "
        "relative difference of the parameters and of both Adam moments, and a verdict against the tolerance "
        "table. --torch-recipe / --torch-weight-decay give the torch twin other settings, to see where two "
        "recipes part. Exit code 1 when the twins part, 2 on bad input.",
    )
    p.add_argument("--steps", type=arg(int_in, 1), required=True, metavar="K", help="optimizer steps in each twin")
    m = p.add_argument_group("model (default: vit train's demo model)")
    m.add_argument(
        "--init",
        default=None,
        metavar="CHECKPOINT",
        help="start both twins from this checkpoint (any file or folder vit convert reads): its weights, its "
        "head (a zero-initialised one where the dataset's class count differs, as vit train --init), its "
        "preprocessing; --image-size resamples it, the other model flags are the file's",
    )
    add_checkpoint_arguments(m)
    add_flags(m, Preprocess, only=("max_patches",), given_only=True, defaults_help={"max_patches": "the checkpoint's"})
    m.add_argument("--variant", default=None, help="start from a variant NAME/PATCH (e.g. Ti/16)")
    for name in ("image_size", "patch_size", "width", "depth", "num_heads", "mlp_dim"):
        demo = DEMO_MODEL.get(name)
        m.add_argument("--" + name.replace("_", "-"), type=arg(int_in, 1), default=None, help=f"{name} (demo {demo})")
    m.add_argument("--pool", choices=("token", "gap", "map"), default=None, help="pooling (demo gap)")
    m.add_argument(
        "--drop-path",
        type=arg(float_in, 0, 1, hi_open=True),
        default=None,
        help="stochastic depth rate of the last block; both twins take the same masks (default 0)",
    )
    for name, what in (
        ("dropout", "dropout (position embedding, projections, MLP, head)"),
        ("attn_dropout", "attention dropout"),
    ):
        m.add_argument(
            "--" + name.replace("_", "-"),
            type=arg(float_in, 0, 1, hi_open=True),
            default=None,
            help=f"{what} rate; both twins take the same masks (default 0)",
        )
    m.add_argument(
        "--dtype",
        choices=("float64", "float32", "bfloat16"),
        default="float64",
        help="float64: parameters and compute (bound 1e-10); float32; bfloat16 compute, float32 parameters, "
        "both twins held to a float64 run of the torch twin (||twin - f64|| / ||f64||, bound 1e-2)",
    )
    o = p.add_argument_group("training (both twins; the torch twin's may differ by the flags below)")
    add_flags(o, TrainConfig, only=("dataset", "val_fraction", "layer_decay", *OPTIMISATION, *LORA_SETTINGS))
    add_flags(o, Augment)
    t = p.add_argument_group("the torch twin's own settings (default: the same as the JAX twin's)")
    t.add_argument("--torch-recipe", choices=tuple(RECIPES), default=None, help="the torch twin's recipe")
    t.add_argument("--torch-weight-decay", type=arg(float_in, 0), default=None, help="the torch twin's weight decay")
    t.add_argument("--torch-lr", type=arg(float_in, 0, lo_open=True), default=None, help="the torch twin's lr")
    r = p.add_argument_group("output")
    r.add_argument("--json", default=None, metavar="PATH", help="write the report (every step) as JSON here")
    r.add_argument("--plot", default=None, metavar="PATH", help="write the differences against the step as a PNG")
    p.set_defaults(func=run)


MODEL_FLAGS = ("variant", "patch_size", "width", "depth", "num_heads", "mlp_dim", "pool")


def from_checkpoint(args, raw):
    """(config, float32 weights, the dataset fit to them, where they came from, the NaFlex preprocessing
    or None) of ``--init``: the
    checkpoint read as ``vit train --init`` reads it (``vit_jax.finetune.load_init``: the dataset's head,
    the file's preprocessing, ``--image-size`` resampled to), with the run-time model flags on top.

    Raises:
        ValueError: a model flag that the checkpoint decides; what ``load_init`` raises.
    """
    from vit_cli.convert import checkpoint_options
    from vit_jax.finetune import load_init
    from vit_torch.formats import READERS

    decided = [f"--{k.replace('_', '-')}" for k in MODEL_FLAGS if getattr(args, k) is not None]
    if decided:
        raise ValueError(f"{', '.join(decided)}: --init {args.init} decides the model; leave them out")
    given = {k: getattr(args, k) for k in ("dropout", "attn_dropout", "drop_path") if getattr(args, k) is not None}
    if args.dtype == "bfloat16":
        given["dtype"] = "bfloat16"
    budget = {} if args.max_patches is None else {"max_patches": args.max_patches}  # as vit train --init's
    options = checkpoint_options(args)
    init = load_init(
        args.init, raw, image_size=args.image_size, given=given, options=options, preprocess=budget, readers=READERS
    )
    for line in init.report.assumption_block() + init.report.notes:
        print(f"vit train-parity: {line}", file=sys.stderr)
    naflex = init.info.preprocess if init.info.preprocess.max_patches is not None else None
    return init.cfg, init.weights, init.data, f"{args.init} ({init.report.format})", naflex


def run(args) -> int:
    import numpy as np

    from vit_cli.flags import values
    from vit_cli.train import check_budget, model_config
    from vit_common.data.augment import Augment
    from vit_common.data.datasets import read_dataset
    from vit_common.system import io

    for path in (args.json, args.plot):
        if path is not None:
            io.check_destination(path)
    augment = Augment(**values(Augment, args))
    tcfg = TrainConfig(**values(TrainConfig, args), augment=augment)
    torch_tcfg = dataclasses.replace(
        tcfg,
        **{
            k: v
            for k, v in (
                ("recipe", args.torch_recipe),
                ("weight_decay", args.torch_weight_decay),
                ("lr", args.torch_lr),
            )
            if v is not None
        },
    )
    check_budget(args.init, args.max_patches)
    raw = read_dataset(tcfg.dataset, val_fraction=tcfg.val_fraction)  # its classes and channels
    dtype = args.dtype
    if args.init is not None:
        cfg, weights, data, init, preprocess = from_checkpoint(args, raw)
    else:
        if args.settings or args.source_image_size is not None or args.strict:
            raise ValueError("--set, --source-image-size and --strict describe the checkpoint of --init")
        args.posemb = None  # what model_config reads besides these flags
        args.dtype = "float32" if dtype == "float64" else dtype
        cfg = model_config(args, num_classes=raw.num_classes, in_chans=raw.channels)
        weights, init, preprocess = None, "the torch twin's initialisation", None
        data = raw.fit(cfg.image_size, cfg.in_chans)
    if dtype == "float64":
        cfg = cfg.replace(dtype="float64", param_dtype="float64")
        weights = None if weights is None else {k: np.asarray(v, np.float64) for k, v in weights.items()}

    import jax

    from vit_compare.training import compare_training, format_table, plot

    with jax.enable_x64(dtype == "float64"):  # a context: it wins over an enclosing one, and is undone after
        result = compare_training(
            cfg, tcfg, data, args.steps, torch_tcfg=torch_tcfg, weights=weights, init=init, preprocess=preprocess
        )
    print(format_table(result))
    if args.json is not None:
        io.write_json(args.json, result.to_dict())
    if args.plot is not None:
        plot(result, Path(args.plot))
    return 0 if result.ok else 1
