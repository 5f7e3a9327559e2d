"""Where each config field came from, the config a file's tensors imply, and the report of a conversion.

Every config field that changes the function (``vit_common.config.FUNCTION_FIELDS``) gets an ``Origin``
when a file is read: declared (the file, or the format's own definition of a missing key, states it),
derived (tensor shapes imply it without ambiguity), assumed (a default or a guess: the file cannot tell)
or given (the caller passed it). Assumed fields are what a reader must be told about. The helpers here
read config fields off tensor shapes (head count, grid, prefix rows) and refuse, by name, what the twins
do not implement.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.tensors import dtype_of
from vit_common.config import FUNCTION_FIELDS, VARIANTS, ViTConfig
from vit_common.system.validate import check_holds, is_float

DECLARED, DERIVED, ASSUMED, GIVEN = "declared", "derived", "assumed", "given"


@dataclass(frozen=True)
class Origin:
    """Where a config field's value came from: ``kind`` (DECLARED, DERIVED, ASSUMED or GIVEN) and
    ``source``, a short phrase (e.g. "config.json layer_norm_eps", "pos_embed rows", "timm's default")."""

    kind: str
    source: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.source}"


def declared(source: str) -> Origin:
    return Origin(DECLARED, source)


def derived(source: str) -> Origin:
    return Origin(DERIVED, source)


def assumed(source: str) -> Origin:
    return Origin(ASSUMED, source)


_NO_VALUE = object()


def flag_for(name: str, value: Any = _NO_VALUE) -> str:
    """How a caller supplies config field ``name`` (with ``value`` if given), said once: the CLI flag
    "--set num_heads=12" or "--set gelu=VALUE" (in Python the same ``FIELD=VALUE`` is a keyword of
    ``load_checkpoint``), and for the image size, whose keyword differs, "--source-image-size HxW
    (source_image_size=(H, W))"."""
    if name == "image_size":
        if value is _NO_VALUE:
            return "--source-image-size HxW (source_image_size=(H, W))"
        h, w = value
        return f"--source-image-size {h}x{w} (source_image_size=({h}, {w}))"
    if value is _NO_VALUE:
        return f"--set {name}=VALUE"
    cli = value if isinstance(value, str) else json.dumps(list(value) if isinstance(value, tuple) else value)
    return f"--set {name}={cli}"


def assumed_fields(cfg: ViTConfig, provenance: Mapping[str, Origin]) -> list[str]:
    """The fields of ``cfg`` that change its function, were assumed, and matter given the others: the
    ``FUNCTION_FIELDS``, and ``posemb_resample`` of a model that resizes its learned table to each input
    (``dynamic_img_size``: a NaFlex model, whose output at any other grid the resize decides)."""
    inert = cfg.inert_fields()
    resizes = cfg.dynamic_img_size and cfg.posemb == "learn"
    fields = (*FUNCTION_FIELDS, "posemb_resample") if resizes else FUNCTION_FIELDS
    return [k for k in fields if k not in inert and k in provenance and provenance[k].kind == ASSUMED]


def shape_fields(**fields: Any) -> tuple[dict[str, Any], dict[str, Origin]]:
    """(config fields, their provenance) for values read off tensor shapes (derived)."""
    return dict(fields), {k: derived("tensor shapes") for k in fields}


def positive_dims(shape: tuple[int, ...], name: str, context: str) -> tuple[int, ...]:
    """``shape`` if every dimension is positive; FormatError naming the tensor otherwise."""
    if not all(int(n) > 0 for n in shape):
        raise FormatError(f"{context}: {name} has shape {tuple(shape)} with an empty dimension")
    return tuple(int(n) for n in shape)


def common_float_dtype(tensors: Mapping[str, Any]) -> str | None:
    """The one floating dtype name all float tensors share, or None if they are mixed or absent."""
    names = {dtype_of(v).name for v in tensors.values() if is_float(v)}
    return names.pop() if len(names) == 1 else None


# The origin a read-back check gives a field the file does not hold and no rule guesses: the value of
# the config being written, which a reader of the file must be given (``readback``'s note says how).
WRITTEN = Origin(GIVEN, "the config being written; the file does not hold it")


def _heads_rule(width: int) -> tuple[int, Origin] | None:
    for name, row in VARIANTS.items():
        if row["width"] == width:
            return row["num_heads"], assumed(f"not stored; the variant table's {name} row for width {width}")
    if width % 64 == 0:
        return width // 64, assumed("not stored; width / 64 (head_dim 64)")
    return None


def guesses_num_heads(width: int) -> bool:
    """Whether ``guess_num_heads`` has a rule for ``width``."""
    return _heads_rule(width) is not None


def guess_num_heads(width: int) -> tuple[int, Origin]:
    """num_heads for a width when the file stores none: the VARIANTS row of that width, else width/64.

    Returns (num_heads, assumed origin). Raises FormatError if no rule gives a divisor.
    """
    rule = _heads_rule(width)
    if rule is not None:
        return rule
    raise FormatError(
        f"cannot guess num_heads for width {width}: the file does not store it; pass {flag_for('num_heads')}"
    )


def grid_of(rows: int, prefix: int, grid: tuple[int, int] | None) -> tuple[int, int] | None:
    """The patch grid of a pos_embed with ``rows`` rows if its patch rows match ``grid`` (when given)
    or form a square (when not); None otherwise."""
    n = rows - prefix
    if n <= 0:
        return None
    if grid is not None:
        return tuple(grid) if grid[0] * grid[1] == n else None
    side = math.isqrt(n)
    return (side, side) if side * side == n else None


def posemb_layout(
    rows: int, num_prefix: int, grid: tuple[int, int] | None, name: str, context: str = ""
) -> tuple[tuple[int, int], bool, Origin]:
    """(patch grid, posemb_prefix, posemb_prefix's origin) of a stored pos_embed with ``rows`` rows.

    With prefix rows (timm default, original ViT) the rows are prefix + grid; without (no_embed_class,
    big_vision) they are the grid alone. ``grid`` is the known grid (declared or given); without it the
    grid must be square, and since a non-square grid could fit either reading, whether the rows include
    the prefix is then assumed too. When both readings fit, the one with prefix rows is taken.

    Raises:
        FormatError: no square (or given) grid fits; the message names the file (``context``), the
            tensor and the flag that supplies the size.
    """
    without = grid_of(rows, 0, grid)
    with_prefix = grid_of(rows, num_prefix, grid) if num_prefix else None
    if without is not None and not num_prefix:
        return without, True, derived(f"{name} rows (no prefix tokens: nothing to place)")
    if with_prefix is not None and without is not None:
        return with_prefix, True, assumed(f"{name} rows fit the grid with and without prefix rows")
    if with_prefix is None and without is None:
        hint = f"grid {grid[0]}x{grid[1]}" if grid else "a square grid"
        raise FormatError(
            f"{context + ': ' if context else ''}{name} has {rows} rows, which is not {hint} (with or without "
            f"{num_prefix} prefix rows); a non-square grid must be given: pass {flag_for('image_size')}"
        )
    found, prefix_rows = (with_prefix, True) if with_prefix is not None else (without, False)
    how = f"{name} rows: {f'{num_prefix} prefix row(s) + ' if prefix_rows else 'no prefix rows, '}"
    how += f"a {found[0]}x{found[1]} grid"
    return found, prefix_rows, derived(f"{how} (the given size)") if grid else assumed(f"{how}, if it is square")


ASSUMED_KEY = "vit_assumed"  # metadata / config.json key: the fields a written file's source did not state


def carried_assumptions(stored, provenance: dict[str, Origin], context: str) -> None:
    """Mark the fields a file we wrote lists under ``ASSUMED_KEY`` (a JSON list, or a list) as assumed
    again: their values were assumptions when the file was converted, and stay so.

    Raises:
        FormatError: the list is not a list of field names.
    """
    if stored is None:
        return
    try:
        names = json.loads(stored) if isinstance(stored, str) else stored
    except ValueError as e:
        raise FormatError(f"{context}: {ASSUMED_KEY} is not JSON ({e})") from e
    fields = (*FUNCTION_FIELDS, "posemb_resample")  # a NaFlex model's resize is assumed as they are
    if not isinstance(names, list) or not all(isinstance(n, str) and n in fields for n in names):
        raise FormatError(f"{context}: {ASSUMED_KEY}={names!r} is not a list of config field names")
    for name in names:
        provenance[name] = assumed("assumed when this file was converted: its source did not state it")


def square_grid_origin(grid: tuple[int, int], what: str) -> Origin:
    """The origin of an image size read off a square patch count: always an assumption, since a
    non-square grid with the same count is possible."""
    return assumed(f"not stored; {what} read as a square {grid[0]}x{grid[1]} grid")


# Parameters of models the twins do not implement, by the name a reader refuses them with.
UNSUPPORTED_TENSORS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"(^|\.)attn\.(q_bias|v_bias)$"), "separate q_bias/v_bias attention biases (BEiT, EVA)"),
    (
        re.compile(r"relative_position_(bias_table|index)$|(^|\.)rel_pos_bias\.|(^|\.)rel_pos_"),
        "relative position tables (BEiT, EVA, Swin-style relative position bias)",
    ),
    (re.compile(r"(^|\.)mlp\.w12\."), "a gated MLP packed as xformers' w12/w3 (convert with timm first)"),
    (
        re.compile(r"(^|\.)attn\.norm\.|(^|\.)mlp\.norm\."),
        "a LayerNorm inside attention or the MLP (timm scale_*_norm)",
    ),
    (re.compile(r"(^|\.)lambda_[12]$"), "BEiT-style LayerScale lambda_1/lambda_2"),
    (re.compile(r"(^|\.)rope\."), "rotary position embeddings"),
)


def refuse_unsupported(keys, context: str, extra: Mapping[str, bool] = ()) -> None:
    """Raise FormatError naming every model feature in ``keys`` the twins lack (``UNSUPPORTED_TENSORS``,
    plus ``extra``: description -> present), with an example tensor for each."""
    found: dict[str, str] = {}
    for k in keys:
        for pattern, what in UNSUPPORTED_TENSORS:
            if what not in found and pattern.search(k):
                found[what] = k
    lines = [f"{what} (e.g. {k})" for what, k in found.items()]
    lines += [what for what, present in dict(extra).items() if present]
    if lines:
        raise FormatError(f"{context}: the twins do not implement " + "; ".join(lines))


@dataclass
class Report:
    """What a conversion read, where each config field came from, what it dropped, resampled and wrote.

    ``provenance`` maps each config field that changes the function to its ``Origin``; ``assumed``
    lists those that were assumed and matter, ``assumptions`` one line for each, ``field = value (why)``
    (printed as one block, ``assumption_block``, and named in the summary, ``assumed_summary``).
    ``load_call`` is the library code that loads a written file strictly (timm or transformers).
    ``model_type`` is the transformers model_type an HF source folder declares ('' for other sources).
    """

    source: str = ""
    format: str = ""
    layout: str = ""
    tensors_read: int = 0
    provenance: dict[str, Origin] = field(default_factory=dict)
    assumed: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    resampled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    config: ViTConfig | None = None
    written: str = ""
    written_format: str = ""
    load_call: str = ""
    model_type: str = ""

    @property
    def variant(self) -> str:
        cfg = self.config
        if cfg is None:
            return "?"
        p = cfg.patch_size[0] if cfg.patch_size[0] == cfg.patch_size[1] else "x".join(map(str, cfg.patch_size))
        if cfg.variant is not None:
            return f"{cfg.variant}/{p}"
        return f"custom (width {cfg.width}, depth {cfg.depth}, heads {cfg.num_heads}, mlp {cfg.mlp_dim}, patch {p})"

    def provenance_lines(self) -> list[str]:
        """One line per config field but the assumed ones (``assumption_block`` lists those): name,
        value, kind and source."""
        return provenance_table(self.config.to_dict() if self.config else {}, self.provenance, self.assumed)

    @property
    def assumed_summary(self) -> str:
        """'3 fields assumed: gelu, ln_eps, num_heads', or '' when nothing was assumed."""
        return assumed_summary(self.assumed)

    def assumption_block(self, api: bool = False) -> list[str]:
        """The assumed fields as one block (``assumption_block``; ``api``: naming keywords, not flags); []
        when nothing was assumed."""
        return assumption_block(self.assumed, self.assumptions, api)

    def lines(self) -> list[str]:
        cfg = self.config
        out = [
            f"read     {self.source}",
            f"format   {self.format}" + (f" ({self.layout})" if self.layout else ""),
        ]
        if cfg is not None:
            h, w = cfg.image_size
            out += [
                f"variant  {self.variant}, {h}x{w} px, {cfg.num_classes} classes, pool {cfg.pool}",
                f"params   {cfg.param_count():,} in {self.tensors_read} file tensors",
            ]
        out += [f"config   {line}" for line in self.provenance_lines()]
        out += [f"dropped  {k}: {why}" for k, why in self.dropped]
        out += [f"resampled {r}" for r in self.resampled]
        out += [f"note     {n}" for n in self.notes]
        out += [f"{'assumed' if i == 0 else '':9s}{line}" for i, line in enumerate(self.assumption_block())]
        out += [f"WARNING  {w}" for w in self.warnings]
        if self.written:
            summary = f"; {self.assumed_summary}" if self.assumed else ""
            out.append(f"wrote    {self.written} ({self.written_format}){summary}")
        if self.load_call:
            out.append("load it with:")
            out += [f"    {line}" for line in self.load_call.splitlines()]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "format": self.format,
            "layout": self.layout,
            "variant": self.variant,
            "params": self.config.param_count() if self.config else None,
            "tensors_read": self.tensors_read,
            "provenance": {k: {"kind": o.kind, "source": o.source} for k, o in self.provenance.items()},
            "assumed": list(self.assumed),
            "assumptions": list(self.assumptions),
            "dropped": [list(d) for d in self.dropped],
            "resampled": list(self.resampled),
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "config": self.config.to_dict() if self.config else None,
            "written": self.written,
            "written_format": self.written_format,
            "load_call": self.load_call,
            "model_type": self.model_type,
        }


def provenance_table(config: Mapping[str, Any], provenance: Mapping[str, Origin | Mapping], skip=()) -> list[str]:
    """One line per field of ``provenance`` not in ``skip``: name, its value in ``config`` (a
    ``ViTConfig.to_dict()``), kind and source. ``provenance`` values are Origins or their dicts."""
    out = []
    for k, o in provenance.items():
        if k not in skip:
            kind, source = (o.kind, o.source) if isinstance(o, Origin) else (o["kind"], o["source"])
            value = config.get(k, "?")
            value = tuple(value) if isinstance(value, list) else value
            out.append(f"{k:20s} = {value!r:24s} {kind:9s} {source}")
    return out


def assumption_line(cfg: ViTConfig, name: str, origin: Origin) -> str:
    """``field = value (why)`` of an assumed field, as ``Report.assumptions`` holds it."""
    return f"{name} = {getattr(cfg, name)!r} ({origin.source})"


def assumed_summary(names) -> str:
    """'3 fields assumed: gelu, ln_eps, num_heads' (or '1 field assumed: gelu'); '' for no names."""
    if not names:
        return ""
    return f"{len(names)} field{'s' if len(names) != 1 else ''} assumed: {', '.join(names)}"


def assumption_block(names, lines, api: bool = False) -> list[str]:
    """What was assumed, as one block: a header line (how many, which, how to give them: the CLI flags, or
    with ``api`` the Python keywords) and one line per field, ``field = value (why)`` (``lines``, from
    ``assumption_line``), indented; [] for no names. Every command that reads a checkpoint prints it
    instead of one warning per field."""
    if not names:
        return []
    if api:
        size = " (the size: source_image_size=(H, W))" if "image_size" in names else ""
        how, strict = f"the keyword FIELD=VALUE{size}", "strict=True"
    else:
        how = "--set FIELD=VALUE" + (" (the size: --source-image-size HxW)" if "image_size" in names else "")
        strict = "--strict"
    head = (
        f"{assumed_summary(names)} (the file does not state them; wrong if the model was made otherwise: "
        f"give each with {how}, or {strict} to refuse)"
    )
    return [head] + [f"  {line}" for line in lines]


# What a plain-ViT format (timm VisionTransformer, HF ViT and its families, .npz) cannot hold, so its reader
# never asks: the RoPE backbones' fields, with the reason a reader states for their defaults.
PLAIN_VIT_ORIGINS = {
    **{
        f.name: declared("the format has no rotary position embeddings")
        for f in dataclasses.fields(ViTConfig)
        if f.name == "rope" or f.name.startswith("rope_")
    },
    "k_bias": derived("the attention biases are one [q; k; v] tensor"),
    "attn_inner_norm": derived("no attn.norm tensor in the format's layout"),
    "mlp_inner_norm": derived("no mlp.norm tensor in the format's layout"),
    "final_norm": derived("the format's models end in a LayerNorm"),
    "input_mean": derived("the format's models take their input as given (no input normaliser)"),
    "input_std": derived("the format's models take their input as given (no input normaliser)"),
    "summary_idxs": derived("the format has no summary of several prefix tokens"),
    "map_heads": derived("the format's MAP head (if any) has the blocks' heads"),
    "map_mlp_dim": derived("the format's MAP head (if any) has the blocks' MLP width"),
}


def build_config(
    fields: dict, provenance: dict[str, Origin], overrides: Mapping, context: str, holds: Mapping[str, Any]
) -> ViTConfig:
    """ViTConfig from inferred ``fields`` with ``overrides`` on top (recorded as given), checked against
    the file's own tensors ``holds`` before any reader builds a rule, a model or an array of it: every
    reader builds its config here, so a declared size (a config.json's ``num_hidden_layers`` of 10^9, an
    override) that claims more parameters than the file holds is refused at once
    (``vit_common.system.validate.check_holds``: a count from the config's formula and the tensors'
    shapes, nothing loaded). The fields of ``PLAIN_VIT_ORIGINS`` not inferred keep their defaults with
    those origins.

    Raises:
        FormatError: the combination is invalid, or declares more parameters than ``holds`` (names the
            file and the fields).
    """
    for k, origin in PLAIN_VIT_ORIGINS.items():
        if k not in fields:
            provenance.setdefault(k, origin)
    for k, v in overrides.items():
        fields[k] = v
        provenance[k] = Origin(GIVEN, "passed by the caller")
    try:
        cfg = ViTConfig(**fields)
    except (TypeError, ValueError) as e:
        raise FormatError(
            f"{context}: the inferred config is invalid ({e}); pass the right value as an override"
        ) from e
    try:
        check_holds(cfg, holds, context)
    except ValueError as e:
        raise FormatError(str(e)) from None
    return cfg
