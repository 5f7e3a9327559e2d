"""`vit convert SRC DST`: any supported checkpoint to any other, through the canonical state.

Imports jax only for orbax folders and torch only for .pth/.bin files; everything else is numpy.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping

from vit_common.system.validate import arg, int_in

# Fields --set does not take: each has flags of its own, whose meanings differ.
OWN_FLAGS = {
    "image_size": "--source-image-size (the size the file was trained at) or --image-size (resample to)",
    "num_classes": "--num-classes (keep or replace the head)",
}


def _setting(text: str) -> tuple[str, object]:
    """``FIELD=VALUE`` -> (field, value), VALUE read as JSON where it parses (a number, true, a list)
    and as a string otherwise; the value itself is checked where the config is built.

    Raises:
        argparse.ArgumentTypeError: not FIELD=VALUE, an unknown field, or a field with flags of its own.
    """
    from vit_common.config import ViTConfig

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=VALUE, e.g. num_heads=16 or gelu=tanh")
    if key in OWN_FLAGS:
        raise argparse.ArgumentTypeError(f"{text!r}: {key} is not set with --set; use {OWN_FLAGS[key]}")
    if key not in ViTConfig.__dataclass_fields__:
        raise argparse.ArgumentTypeError(f"{text!r}: {key!r} is not a ViTConfig field")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def add_checkpoint_arguments(p: argparse.ArgumentParser, set_also: str = "", rope_periods: bool = True) -> None:
    """What every command that reads a checkpoint takes: ``--set FIELD=VALUE`` (repeatable; ->
    ``args.settings``, a list of (field, value) config overrides; ``set_also``: what else it does in
    this command), ``--source-image-size`` (the size a file that stores none was trained at),
    ``--rope-periods`` (DINOv3's stored or recomputed periods; not added where ``rope_periods`` is False,
    a parser with the ViTConfig field's own flag), ``--strict`` (refuse to assume) and ``--weights-entry``
    (which weights of a training checkpoint: applied around the whole command by ``vit_cli.main``).
    ``checkpoint_options(args)`` turns the others into ``load_checkpoint`` / ``load_model`` keywords."""
    p.add_argument(
        "--set",
        dest="settings",
        type=_setting,
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help=f"a config field the checkpoint does not store or stores wrongly{set_also} (repeatable), "
        "e.g. --set num_heads=16 --set gelu=tanh --set pool=gap",
    )
    p.add_argument(
        "--source-image-size",
        type=_size,
        metavar="S|HxW",
        help="the image size the checkpoint was trained at, for files that store none (timm, .npz): "
        "needed for a non-square patch grid",
    )
    p.add_argument(
        "--weights-entry",
        default="auto",
        metavar="ENTRY",
        help="which weights of a timm training checkpoint (.pth holding state_dict and state_dict_ema) to read: "
        "state_dict_ema, model_ema, state_dict, model or module; auto (default) takes the EMA weights when "
        "present, as timm's own loader does; the choice is printed as a warning",
    )
    if rope_periods:
        p.add_argument(
            "--rope-periods",
            dest="read_periods",
            choices=("stored", "recomputed"),
            help="DINOv3 RoPE periods: the checkpoint's stored values (Meta's files: rounded to bfloat16, the "
            "original's numbers; their default) or recomputed in float32 as timm and transformers do",
        )
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse a checkpoint whose config would have to be assumed (head count, pooling, GELU, "
        "LayerNorm eps, image size, ...) instead of warning; pass what it lacks with --set / --source-image-size",
    )


def accepted_fields(text: str) -> tuple[str, ...] | str:
    """``--accept-assumed``'s value: "all", or comma-separated ViTConfig fields and "preprocess".

    Raises:
        argparse.ArgumentTypeError: a name that is not a ViTConfig field.
    """
    from vit_common.config import ViTConfig

    if text.strip() == "all":
        return "all"
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ViTConfig.__dataclass_fields__ and n != "preprocess"]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected all or ViTConfig fields and preprocess, comma-separated; not {unknown}"
        )
    return names


def add_accept_assumed(p: argparse.ArgumentParser) -> None:
    """``--accept-assumed FIELD,...|all`` (-> ``args.accept_assumed``) of every command that writes a
    checkpoint: a field the source does not state is written into an HF config.json or a timm call (whose
    readers take it as fact) only when given with --set or accepted here."""
    p.add_argument(
        "--accept-assumed",
        type=accepted_fields,
        default=(),
        metavar="FIELD,...|all",
        help="write these assumed config fields, preprocess (the preprocessing), or all into formats whose "
        "readers take them as fact (an HF config.json or preprocessor_config.json, a timm hub config.json, the "
        "printed timm call); without it such a write is refused, naming the fields",
    )


def checkpoint_options(args: argparse.Namespace) -> dict:
    """``load_checkpoint`` keywords from ``add_checkpoint_arguments``' flags."""
    options = dict(args.settings)
    if getattr(args, "read_periods", None) is not None:
        options["rope_periods"] = {"stored": "stored", "recomputed": "computed"}[args.read_periods]
    if args.source_image_size is not None:
        options["source_image_size"] = args.source_image_size
    if args.strict:
        options["strict"] = True
    return options


def _size(text: str) -> int | tuple[int, int]:
    parts = text.lower().split("x")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected S or HxW, e.g. 384 or 256x512") from None
    if len(sizes) not in (1, 2) or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected S or HxW with positive sizes")
    return sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])


def add_parser(sub: argparse._SubParsersAction) -> None:
    from vit_common.checkpoints.convert import FORMATS

    formats = ", ".join(FORMATS)
    p = sub.add_parser(
        "convert",
        help="convert a checkpoint between timm, Hugging Face, big_vision, original ViT, orbax, ours",
        description="Read SRC (format detected from its contents) and write DST. Prints what was read "
        "(format, variant, parameter count), where each config field came from (declared by the file, "
        "derived from tensor shapes, assumed, or given by you), what was dropped or resampled and why, "
        "and the timm or transformers code that loads DST strictly. The assumed fields that change the "
        "model are listed in one block and named on the 'wrote' line; --strict refuses them. "
        f"Formats: {formats}. Nothing is written unless the whole conversion succeeds.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", help="checkpoint file or folder to read")
    p.add_argument(
        "dst",
        help="file or folder to write (.safetensors = our file, .pth/.bin = timm, "
        ".npz = big_vision; folders need --to hf or --to orbax)",
    )
    p.add_argument("--from", dest="from_fmt", choices=tuple(FORMATS), help="force the input format")
    p.add_argument("--to", dest="to_fmt", choices=tuple(FORMATS), help="output format (default: from DST's suffix)")
    p.add_argument("--image-size", type=_size, help="resample the position embedding to this image size (S or HxW)")
    p.add_argument(
        "--num-classes", type=arg(int_in, 0), help="keep a head of this size; another size gets a new zero head"
    )
    add_checkpoint_arguments(p)
    add_write_options(p)
    add_accept_assumed(p)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def _option_classes() -> dict[type, list[str]]:
    """Each format's ``WriteOptions`` class that has fields, with the formats that take it."""
    import dataclasses

    from vit_common.checkpoints.registry import REGISTRY

    out: dict[type, list[str]] = {}
    for f in REGISTRY.values():
        if dataclasses.fields(f.write_options):
            out.setdefault(f.write_options, []).append(f.name)
    return out


def add_write_options(p: argparse.ArgumentParser) -> None:
    """The flags of every format's write options (``Format.write_options``, one group per class, made by
    ``vit_cli.flags.add_flags`` from the fields' metadata): --hf-spelling, --npz-prefix, --scan."""
    from vit_cli.flags import add_flags

    for cls, names in _option_classes().items():
        add_flags(p.add_argument_group(f"writing {' / '.join(names)}"), cls, given_only=True)


def write_options(args: argparse.Namespace, fmt: str):
    """The ``WriteOptions`` of format ``fmt`` from ``add_write_options``' flags.

    Raises:
        ValueError: a flag was given that belongs to another format's options (names the flag and ``fmt``).
    """
    import dataclasses

    from vit_cli.flags import values
    from vit_common.checkpoints.registry import REGISTRY

    own = REGISTRY[fmt].write_options
    for cls, names in _option_classes().items():
        given = values(cls, args)
        if cls is not own and given:
            flags = ", ".join(f.metadata["flag"] for f in dataclasses.fields(cls) if f.name in given)
            raise ValueError(f"{flags}: an option of {' / '.join(names)} files, but the output format is {fmt}")
    return own(**values(own, args))


def _adapters(framework: str | None, kind: str) -> dict:
    if framework == "torch":
        from vit_torch import formats
    elif framework == "jax":
        from vit_jax import formats
    else:
        return {}
    return getattr(formats, kind)


class Adapters(Mapping):
    """A framework's READERS or WRITERS (``vit_torch.formats`` / ``vit_jax.formats``), imported when first
    looked into: what a command passes to a run that needs them only for some files (``vit train``:
    ``vit_jax.launch.RunSpec``), so that the framework is imported only when such a file is read or written."""

    def __init__(self, framework: str, kind: str) -> None:
        self.framework, self.kind = framework, kind

    def __getitem__(self, key: str):
        return _adapters(self.framework, self.kind)[key]

    def __iter__(self):
        return iter(_adapters(self.framework, self.kind))

    def __len__(self) -> int:
        return len(_adapters(self.framework, self.kind))


def _timm_hub_config(folder):
    """timm's own reading of a timm hub folder (``vit_torch.timm_models.read_hub_config``, torch imported
    only now), or None where torch or timm is not installed (the folder's stated fields are then read)."""
    try:
        from vit_torch.timm_models import read_hub_config
    except ImportError:
        return None
    return read_hub_config(folder)


def readers_for(src) -> dict:
    """The framework readers ``src`` (a path or an opened ``Source``) needs (importing only that
    framework), for ``load_checkpoint``, and timm's reading of a timm hub folder's config.json (which
    imports torch only if one is read)."""
    from vit_common.checkpoints.convert import needs

    return {"timm": _timm_hub_config, **_adapters(needs(src), "READERS")}


def run(args: argparse.Namespace) -> int:
    from vit_common.checkpoints.convert import convert, needs, open_checkpoint, output_format

    to_fmt = args.to_fmt or output_format(args.dst)
    options = write_options(args, to_fmt)
    src = open_checkpoint(args.src)
    writers = _adapters(needs(args.dst, to_fmt, writing=True), "WRITERS")
    report = convert(
        src,
        args.dst,
        from_fmt=args.from_fmt,
        to_fmt=to_fmt,
        readers=readers_for(src),
        writers=writers,
        write_options=options,
        accept_assumed=args.accept_assumed,
        image_size=args.image_size,
        num_classes=args.num_classes,
        **checkpoint_options(args),
    )
    print(json.dumps(report.to_dict()) if args.json else report)
    return 0
