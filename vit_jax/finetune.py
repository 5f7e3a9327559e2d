"""Fine-tuning the JAX twin from a checkpoint of any format: reading it for a dataset, matching its
head to the dataset's classes, and exporting the result in the checkpoint's own format.

(Moved verbatim from vit_cli/train.py; the redesign follows.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vit_common.data.train_config import TrainConfig

# Architecture flags: with --init they must agree with the checkpoint (image size excepted: it resamples).
ARCH_FLAGS = ("patch_size", "width", "depth", "num_heads", "mlp_dim", "pool", "posemb")


def check_flags_against(cfg, args: argparse.Namespace, path: str) -> None:
    """With --init: every architecture flag given (and --variant) must describe the checkpoint.

    Raises:
        ValueError: naming the flag, its value and the checkpoint's.
    """
    from vit_common.config import VARIANTS

    bad = []
    if args.variant:
        name = args.variant.split("/")[0].strip()
        row = VARIANTS.get(name)
        if row is None:
            raise ValueError(f"--variant {args.variant!r}: unknown name {name!r}; known: {', '.join(VARIANTS)}")
        bad += [
            f"--variant {args.variant} has {k}={v}, the checkpoint {k}={getattr(cfg, k)}"
            for k, v in row.items()
            if getattr(cfg, k) != v
        ]
        patch = args.variant.split("/")[-1].strip()
        if patch.isdigit() and (int(patch), int(patch)) != tuple(cfg.patch_size):
            bad.append(f"--variant {args.variant} has patch_size={patch}, the checkpoint {cfg.patch_size[0]}")
    for k in ARCH_FLAGS:
        v = getattr(args, k)
        have = cfg.patch_size[0] if k == "patch_size" and cfg.patch_size[0] == cfg.patch_size[1] else getattr(cfg, k)
        if v is not None and v != have:
            bad.append(f"--{k.replace('_', '-')} {v}, the checkpoint has {k}={have!r}")
    if bad:
        raise ValueError(f"{path} does not match the model flags: " + "; ".join(bad))


def _readers(path: str) -> dict:
    """The checkpoint readers ``path`` needs (vit_common.checkpoints.convert: orbax folders need jax, PyTorch
    .pth/.bin files torch, which is imported only then)."""
    from vit_common.checkpoints.convert import needs

    if needs(path) == "torch":
        from vit_torch.formats import READERS
    else:
        from vit_jax.formats import READERS
    return READERS


def _writers(fmt: str, path: Path) -> dict:
    if fmt == "orbax":
        from vit_jax.formats import WRITERS

        return WRITERS
    if fmt == "timm" and path.suffix in (".pth", ".pt", ".bin"):
        from vit_torch.formats import WRITERS

        return WRITERS
    return {}


def load_init(args, tcfg: TrainConfig, name_classes, preprocess_flags: dict, log):
    """Read --init: (config, float32 weights, ModelInfo, data with ``name_classes`` applied, conversion
    report) for the dataset.

    The checkpoint is read once for its config (image size, channels, preprocessing) and again for the
    dataset's class count and image size, which replace its head (zero-initialised, reported) and
    resample its position embedding with the file's own method.
    """
    import numpy as np

    from vit_cli.convert import checkpoint_options
    from vit_common.checkpoints.convert import load_checkpoint
    from vit_common.checkpoints.metadata import read_info, with_overrides
    from vit_common.data.datasets import load_dataset

    readers = _readers(tcfg.init)
    overrides = checkpoint_options(args)
    first = load_checkpoint(tcfg.init, readers=readers, **overrides)
    check_flags_against(first.cfg, args, tcfg.init)
    size = first.cfg.image_size if args.image_size is None else (args.image_size, args.image_size)
    probe = first.cfg.replace(image_size=size)  # an image size the patch does not divide fails here, named
    info = with_overrides(read_info(tcfg.init, first.report.format), preprocess_flags, None)
    data = load_dataset(
        tcfg.dataset, probe.image_size, probe.in_chans, val_fraction=tcfg.val_fraction, preprocess=info.preprocess
    )
    data = name_classes(data)
    ckpt = load_checkpoint(tcfg.init, readers=readers, image_size=size, num_classes=data.num_classes, **overrides)
    report, state = ckpt.report, dict(ckpt.state)
    if info.classes is not None and len(info.classes) == data.num_classes == first.cfg.num_classes:
        state = _match_head(state, info.classes, data.classes, report)
    for line in report.lines():
        log(f"  {line}")
    log(f"  preprocessing {json.dumps(info.preprocess.to_dict())} ({info.preprocess_source})")
    for w in info.warnings:
        log(f"  WARNING  {w}")
    cfg = ckpt.cfg.replace(
        dropout=ckpt.cfg.dropout if args.dropout is None else args.dropout,
        drop_path=ckpt.cfg.drop_path if args.drop_path is None else args.drop_path,
        dtype=args.dtype,
        param_dtype="float32",
    )
    weights = {k: np.asarray(v, np.float32) for k, v in state.items()}
    return cfg, weights, info, data, report


def _match_head(state: dict, have: tuple[str, ...], want: tuple[str, ...], report) -> dict:
    """The head for the dataset's class order: kept if the checkpoint's class names are the same list,
    rows reordered if they are the same names in another order, zero-initialised otherwise."""
    import numpy as np

    if tuple(have) == tuple(want) or "head.weight" not in state:
        return state
    if sorted(have) == sorted(want):
        order = [have.index(c) for c in want]
        report.notes.append(f"head rows reordered from the checkpoint's class order {list(have)} to the dataset's")
        return {**state, "head.weight": state["head.weight"][order], "head.bias": state["head.bias"][order]}
    report.notes.append(
        f"new {len(want)}-class head, zero-initialised: the checkpoint's classes {list(have)} are not the "
        f"dataset's {list(want)}"
    )
    return {**state, "head.weight": np.zeros_like(state["head.weight"]), "head.bias": np.zeros_like(state["head.bias"])}


def export(out: Path, cfg, weights, preprocess, classes, report, log) -> tuple[dict[str, Path], dict[str, str]]:
    """Write model.safetensors (ours), model_timm.safetensors and, after --init, the model in the
    checkpoint's own format (model_hf/, model_big_vision.npz, ...). Returns ({format: path} of the
    exports besides ours, {format: the library call that loads that export strictly}); a format that
    cannot hold the model is skipped with a note."""
    from vit_common.checkpoints.convert import save_checkpoint

    save_checkpoint(out / "model.safetensors", cfg, weights, "canonical", preprocess=preprocess, classes=classes)
    targets = {"timm": out / "model_timm.safetensors"}
    if report is not None and report.format not in ("canonical", "timm"):
        name = {"hf": "model_hf", "orbax": "model_orbax"}.get(report.format, f"model_{report.format}.npz")
        targets[report.format] = out / name
    elif report is not None and report.format == "timm" and Path(report.source).suffix in (".pth", ".pt", ".bin"):
        targets["timm"] = out / f"model_timm{Path(report.source).suffix}"
    written, load_calls = {}, {}
    for fmt, path in targets.items():
        try:
            r = save_checkpoint(
                path, cfg, weights, fmt, writers=_writers(fmt, path), preprocess=preprocess, classes=classes
            )
        except (ValueError, ImportError) as e:
            log(f"  not exported as {fmt}: {e}")
            continue
        for line in r.notes + r.warnings:
            log(f"  {path.name}: {line}")
        written[fmt] = path
        if r.load_call:
            load_calls[fmt] = r.load_call
    return written, load_calls
