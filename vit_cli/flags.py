"""Command-line flags generated from dataclass fields: one field, one flag, its help from the metadata.

``add_flags(group, cls)`` adds ``--field-name`` (or ``field.metadata["flag"]``) for each field of
``cls`` (``field.metadata["help"]``, optional ``"choices"`` and ``"metavar"``); the type comes from the
annotation: bool -> ``--x/--no-x``, int / float / str, ``X | None`` -> X, ``tuple[float, ...]`` -> one or
more values; a field with a ``Range`` in its metadata (``vit_common.system.validate``) is checked against it as the
flag is parsed. ``values(cls, args)`` collects the parsed values that were given. ``add_image_flags`` and
``class_list``: the preprocessing and class-name flags of the commands that run a checkpoint on images.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any


def _kind(annotation: Any) -> tuple[Any, bool]:
    """(element type, is a variable-length tuple) of a field annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return _kind(next(a for a in args if a is not type(None)))
    if typing.get_origin(annotation) is tuple:
        return args[0], True
    return annotation, False


def add_flags(
    group: argparse._ActionsContainer,
    cls: type,
    *,
    only: tuple[str, ...] | None = None,
    skip: tuple[str, ...] = (),
    given_only: bool = False,
    defaults_help: dict[str, str] | None = None,
    choices: dict[str, tuple] | None = None,
) -> None:
    """Add a flag per field of the dataclass ``cls``: the fields in ``only`` (all if None), in that order,
    except ``skip`` and dataclass-typed fields.

    ``given_only``: every flag defaults to None (so ``values`` returns only what was given) and its help
    says where the value comes from otherwise: ``defaults_help[name]``, or the field's default.
    ``choices[name]``: the values this command takes, a subset of the field's ``choices``.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for f in (fields[n] for n in only) if only is not None else fields.values():
        kind, many = _kind(hints[f.name])
        if f.name in skip or dataclasses.is_dataclass(kind):
            continue
        default = None if f.default is dataclasses.MISSING else f.default
        help_text = f.metadata.get("help")
        if not help_text:
            raise ValueError(f"{cls.__name__}.{f.name} has no help text in its field metadata")
        kw: dict[str, Any] = {"dest": _dest(f), "help": help_text}
        if given_only:
            shown = (defaults_help or {}).get(f.name) or f"default {default!r}"
            kw["help"] = f"{help_text} ({shown})"
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif many:
            kw |= {"type": kind, "nargs": "+", "metavar": f.name.upper()}
        else:
            kw["type"] = f.metadata["range"].flag_type() if "range" in f.metadata else kind
        if f.name in (choices or {}):
            kw["choices"] = choices[f.name]
        elif "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if "metavar" in f.metadata:
            kw["metavar"] = f.metadata["metavar"]
        kw["default"] = None if given_only else default
        group.add_argument(f.metadata.get("flag") or "--" + f.name.replace("_", "-"), **kw)


def _dest(f: dataclasses.Field) -> str:
    """The namespace attribute of a field's flag: its ``flag`` metadata as argparse names it, else the field."""
    flag = f.metadata.get("flag")
    return flag.lstrip("-").replace("-", "_") if flag else f.name


def flag_name(cls: type, name: str) -> str:
    """The flag ``add_flags`` makes for field ``name`` of ``cls``: ``--x``, or ``--x / --no-x`` for a bool."""
    flag = "--" + name.replace("_", "-")
    return f"{flag} / --no-{flag[2:]}" if typing.get_type_hints(cls)[name] is bool else flag


def values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """{field: value} of the flags ``add_flags`` made for ``cls`` that hold a value (not None)."""
    out = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name]):
            continue
        v = getattr(args, _dest(f), None)
        if v is not None:
            out[f.name] = tuple(v) if isinstance(v, list) else v
    return out


def add_image_flags(p: argparse.ArgumentParser, naflex: bool = True) -> None:
    """--mean/--std/--interpolation/--crop-pct/--crop-mode/... (default: the checkpoint's) and --classes;
    ``naflex`` False: without --max-patches (a command that feeds fixed-size images only)."""
    from vit_common.data.images import Preprocess

    g = p.add_argument_group("preprocessing (default: what the checkpoint declares, else its format's usual)")
    add_flags(
        g,
        Preprocess,
        skip=() if naflex else ("max_patches",),
        given_only=True,
        defaults_help=dict.fromkeys(Preprocess.__dataclass_fields__, "see above"),
    )
    p.add_argument(
        "--classes",
        type=class_list,
        help="class names for a checkpoint that has none: comma-separated, or a file with one per line",
    )


def class_list(text: str) -> list[str]:
    """--classes: 'a,b,c', or the path of a text file with one name per line."""
    path = Path(text)
    names = path.read_text().splitlines() if path.is_file() else text.split(",")
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"--classes {text!r}: no names")
    return names
