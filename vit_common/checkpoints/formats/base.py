"""What every format module shares: the ``Format`` interface, the mapping rules between file tensors
and the canonical state, where each config field came from (provenance), the report, and the errors.

A format's tensor layout is a list of ``Rule`` built from a ``ViTConfig``: each rule fills one canonical
tensor from one or more file tensors (several are concatenated along axis 0, e.g. q, k, v -> qkv), each
file tensor optionally reshaped, transposed and, for scan-stacked files, sliced from a stacked array.
The same list drives reading and writing, so the two are inverse by construction and every conversion
can check that each file tensor is used exactly once and each canonical tensor is filled.

Provenance: every config field that changes the function (``vit_common.config.FUNCTION_FIELDS``) gets an
``Origin`` when a file is read: declared (the file, or the format's own definition of a missing key,
states it), derived (tensor shapes imply it without ambiguity), assumed (a default or a guess: the file
cannot tell) or given (the caller passed it). Assumed fields are what a reader must be told about.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.config import FUNCTION_FIELDS, VARIANTS, ViTConfig
from vit_common.posemb import sincos2d
from vit_common.state import StateMismatchError, canonical_shapes, check_state


class FormatError(ValueError):
    """A file or folder that is not a readable checkpoint of the expected format (the message names it)."""


@dataclass(frozen=True)
class Piece:
    """One file tensor (or one layer of a scan-stacked file tensor) <-> one canonical tensor or slice.

    file -> canonical: take ``[layer]`` if stacked, reshape to ``reshape``, transpose by ``perm``.
    ``shape`` is the file tensor's shape without the leading layer axis.
    """

    key: str
    shape: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    perm: tuple[int, ...] | None = None
    layer: int | None = None

    def to_canonical(self, a: np.ndarray) -> np.ndarray:
        if self.layer is not None:
            a = a[self.layer]
        if self.reshape is not None:
            a = a.reshape(self.reshape)
        return a.transpose(self.perm) if self.perm is not None else a

    def canonical_shape(self) -> tuple[int, ...]:
        s = self.reshape if self.reshape is not None else self.shape
        return tuple(s[i] for i in self.perm) if self.perm is not None else tuple(s)

    def from_canonical(self, a: np.ndarray) -> np.ndarray:
        if self.perm is not None:
            a = a.transpose(np.argsort(self.perm))
        return a.reshape(self.shape)


@dataclass(frozen=True)
class Rule:
    """Canonical tensor ``dst`` = concatenation along axis 0 of its pieces (one piece: a plain copy)."""

    dst: str
    pieces: tuple[Piece, ...]


def copy(key: str, dst: str, shape: tuple[int, ...]) -> Rule:
    """File tensor stored exactly as the canonical one."""
    return Rule(dst, (Piece(key, tuple(shape)),))


def linear_kernel(key: str, dst: str, shape_out_in: tuple[int, int]) -> Rule:
    """Flax Dense kernel (in, out) -> torch Linear weight (out, in)."""
    o, i = shape_out_in
    return Rule(dst, (Piece(key, (i, o), perm=(1, 0)),))


def conv_kernel(key: str, dst: str, shape_oihw: tuple[int, int, int, int]) -> Rule:
    """Flax Conv kernel HWIO -> torch Conv2d weight OIHW."""
    o, i, h, w = shape_oihw
    return Rule(dst, (Piece(key, (h, w, i, o), perm=(3, 2, 0, 1)),))


def stack_layers(rules: list[Rule], layer_key) -> list[Rule]:
    """Scan-stacked variant of per-layer rules: the file holds one array per parameter, [depth, ...].

    ``layer_key(key)`` maps a per-layer file key to its stacked key and layer index, or None for keys
    that are not per-layer.
    """
    out = []
    for rule in rules:
        pieces = []
        for p in rule.pieces:
            hit = layer_key(p.key)
            pieces.append(p if hit is None else Piece(hit[0], p.shape, p.reshape, p.perm, hit[1]))
        out.append(Rule(rule.dst, tuple(pieces)))
    return out


def file_shapes(rules: list[Rule]) -> dict[str, tuple[int, ...]]:
    """Every file tensor the rules use, with its shape (stacked ones with the layer axis first).

    Raises:
        AssertionError: two rules use the same file tensor (or the same layer of it): a format bug.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    used: set[tuple[str, int | None]] = set()
    layers: dict[str, set[int]] = {}
    for rule in rules:
        for p in rule.pieces:
            assert (p.key, p.layer) not in used, f"format rules use {p.key} (layer {p.layer}) twice"
            used.add((p.key, p.layer))
            if p.layer is None:
                shapes[p.key] = p.shape
            else:
                layers.setdefault(p.key, set()).add(p.layer)
                shapes[p.key] = p.shape
    for key, idx in layers.items():
        assert idx == set(range(len(idx))), f"format rules leave layers of {key} unused"
        shapes[key] = (len(idx),) + shapes[key]
    return shapes


def to_canonical(rules: list[Rule], tensors: Mapping[str, np.ndarray], context: str = "") -> dict[str, np.ndarray]:
    """Apply ``rules`` to file tensors: every file tensor used exactly once, every rule filled.

    Raises:
        StateMismatchError: lists missing, unexpected and wrong-shape file tensors together (file names).
    """
    check_state(file_shapes(rules), tensors, context)
    out = {}
    for rule in rules:
        parts = [p.to_canonical(np.asarray(tensors[p.key])) for p in rule.pieces]
        out[rule.dst] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return out


def from_canonical(rules: list[Rule], state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of ``to_canonical``: the file tensors (contiguous) for a canonical state."""
    singles: dict[str, np.ndarray] = {}
    stacked: dict[str, dict[int, np.ndarray]] = {}
    for rule in rules:
        a = np.asarray(state[rule.dst])
        sizes = [p.canonical_shape()[0] for p in rule.pieces]
        parts = np.split(a, np.cumsum(sizes)[:-1], axis=0) if len(rule.pieces) > 1 else [a]
        for p, part in zip(rule.pieces, parts, strict=True):
            v = p.from_canonical(part)
            if p.layer is None:
                singles[p.key] = v
            else:
                stacked.setdefault(p.key, {})[p.layer] = v
    for key, layers in stacked.items():
        singles[key] = np.stack([layers[i] for i in range(len(layers))])
    return {k: np.ascontiguousarray(v) for k, v in singles.items()}


# ------------------------------------------------------------------------------------- provenance

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
    """How a caller supplies config field ``name`` (with ``value`` if given): the CLI flag and the API
    keyword, e.g. "--set num_heads=12 (num_heads=12)" or "--source-image-size HxW (source_image_size=(H, W))"."""
    if name == "image_size":
        if value is _NO_VALUE:
            return "--source-image-size HxW (source_image_size=(H, W))"
        h, w = value
        return f"--source-image-size {h}x{w} (source_image_size=({h}, {w}))"
    if value is _NO_VALUE:
        return f"--set {name}=VALUE ({name}=VALUE)"
    cli = value if isinstance(value, str) else json.dumps(list(value) if isinstance(value, tuple) else value)
    return f"--set {name}={cli} ({name}={value!r})"


def assumed_fields(cfg: ViTConfig, provenance: Mapping[str, Origin]) -> list[str]:
    """The fields of ``cfg`` that change its function, were assumed, and matter given the others."""
    inert = cfg.inert_fields()
    return [k for k in FUNCTION_FIELDS if k not in inert and k in provenance and provenance[k].kind == ASSUMED]


# ------------------------------------------------------------------------------- config inference


def shape_fields(**fields: Any) -> tuple[dict[str, Any], dict[str, Origin]]:
    """(config fields, their provenance) for values read off tensor shapes (derived)."""
    return dict(fields), {k: derived("tensor shapes") for k in fields}


def positive_dims(shape: tuple[int, ...], name: str, context: str) -> tuple[int, ...]:
    """``shape`` if every dimension is positive; FormatError naming the tensor otherwise."""
    if not all(int(n) > 0 for n in shape):
        raise FormatError(f"{context}: {name} has shape {tuple(shape)} with an empty dimension")
    return tuple(int(n) for n in shape)


def common_float_dtype(tensors: Mapping[str, np.ndarray]) -> str | None:
    """The one floating dtype name all float tensors share, or None if they are mixed or absent."""
    names = {
        np.dtype(np.asarray(v).dtype).name
        for v in tensors.values()
        if np.issubdtype(np.asarray(v).dtype, np.floating) or np.asarray(v).dtype.name == "bfloat16"
    }
    return names.pop() if len(names) == 1 else None


def guess_num_heads(width: int) -> tuple[int, Origin]:
    """num_heads for a width when the file stores none: the VARIANTS row of that width, else width/64.

    Returns (num_heads, assumed origin). Raises FormatError if no rule gives a divisor.
    """
    for name, row in VARIANTS.items():
        if row["width"] == width:
            return row["num_heads"], assumed(f"not stored; the variant table's {name} row for width {width}")
    if width % 64 == 0:
        return width // 64, assumed("not stored; width / 64 (head_dim 64)")
    raise FormatError(
        f"cannot guess num_heads for width {width}: the file does not store it; pass num_heads (--set num_heads=N)"
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
    if not isinstance(names, list) or not all(isinstance(n, str) and n in FUNCTION_FIELDS for n in names):
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
    (re.compile(r"^patch_embed\.norm\."), "a LayerNorm inside the patch embedding"),
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


# ------------------------------------------------------------------------------- representability


def materialize_posemb(
    cfg: ViTConfig, state: Mapping[str, np.ndarray], *, prefix_rows: bool
) -> tuple[ViTConfig, dict[str, np.ndarray], list[str]]:
    """Rewrite the position embedding into a learned table, for formats that only store one.

    ``posemb='sincos2d'`` becomes a learned ``pos_embed`` holding the table (cast to the parameter
    dtype, as the twins cast it before adding). With ``prefix_rows=True`` a table without prefix rows
    gains zero rows for the class (and distillation) token (exact: adding zero changes nothing). Returns
    the new config, state and one note per change. Register tokens cannot gain rows this way (they would
    be resampled with the grid otherwise): the caller's format check rejects them.
    """
    notes, state = [], dict(state)
    if cfg.posemb == "sincos2d":
        any_param = next(iter(state.values()))
        table = sincos2d(cfg.grid, cfg.width)[None].astype(np.asarray(any_param).dtype)
        state = {"pos_embed": table, **state}
        cfg = cfg.replace(posemb="learn")
        notes.append("sincos2d position embedding written as a learned pos_embed table")
    if prefix_rows and cfg.posemb == "learn" and not cfg.posemb_prefix and cfg.num_prefix_tokens:
        pe = np.asarray(state["pos_embed"])
        zeros = np.zeros((1, cfg.num_prefix_tokens, pe.shape[-1]), pe.dtype)
        state["pos_embed"] = np.concatenate([zeros, pe], axis=1)
        cfg = cfg.replace(posemb_prefix=True)
        notes.append(
            f"pos_embed: {cfg.num_prefix_tokens} zero row(s) added for the prefix token(s), which the "
            "source model adds no position to (exact)"
        )
    return cfg, state, notes


def unsupported(fmt: str, checks: Mapping[str, bool]) -> list[str]:
    """The descriptions in ``checks`` (description -> fails) that fail: what ``fmt`` cannot hold."""
    return [what for what, fails in checks.items() if fails]


def refuse(fmt: str, reasons: list[str]) -> None:
    """Raise ValueError naming every config choice ``fmt`` cannot hold."""
    if reasons:
        raise ValueError(f"the {fmt} format cannot hold this model: " + "; ".join(reasons))


# ---------------------------------------------------------------------------------------- report


@dataclass
class Report:
    """What a conversion read, where each config field came from, what it dropped, resampled and wrote.

    ``provenance`` maps each config field that changes the function to its ``Origin``; ``assumed``
    lists those that were assumed and matter (each also has a warning naming its flag).
    ``load_call`` is the library code that loads a written file strictly (timm or transformers).
    """

    source: str = ""
    format: str = ""
    layout: str = ""
    tensors_read: int = 0
    provenance: dict[str, Origin] = field(default_factory=dict)
    assumed: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    resampled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    config: ViTConfig | None = None
    written: str = ""
    written_format: str = ""
    load_call: str = ""

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
        """One line per config field: name, value, kind and source (assumed fields marked)."""
        cfg = self.config
        out = []
        for k, origin in self.provenance.items():
            mark = "  <- assumed" if k in self.assumed else ""
            out.append(f"{k:20s} = {getattr(cfg, k, '?')!r:24s} {origin.kind:9s} {origin.source}{mark}")
        return out

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
        out += [f"WARNING  {w}" for w in self.warnings]
        if self.written:
            out.append(f"wrote    {self.written} ({self.written_format})")
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
            "dropped": [list(d) for d in self.dropped],
            "resampled": list(self.resampled),
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "config": self.config.to_dict() if self.config else None,
            "written": self.written,
            "written_format": self.written_format,
            "load_call": self.load_call,
        }


@dataclass
class Decoded:
    """What a format reader returns: config, canonical state and its part of the report."""

    cfg: ViTConfig
    state: dict[str, np.ndarray]
    layout: str = ""
    provenance: dict[str, Origin] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # stored metadata vs head shape (see convert.py)


def build_config(fields: dict, provenance: dict[str, Origin], overrides: Mapping, context: str) -> ViTConfig:
    """ViTConfig from inferred ``fields`` with ``overrides`` on top (recorded as given).

    Raises:
        FormatError: the combination is invalid (names the file and the fields).
    """
    for k, v in overrides.items():
        fields[k] = v
        provenance[k] = Origin(GIVEN, "passed by the caller")
    try:
        return ViTConfig(**fields)
    except (TypeError, ValueError) as e:
        raise FormatError(
            f"{context}: the inferred config is invalid ({e}); pass the right value as an override"
        ) from e


def check_canonical(cfg: ViTConfig, state: Mapping[str, np.ndarray], context: str) -> None:
    """The final check of every read and write: the canonical state fits the config exactly."""
    check_state(canonical_shapes(cfg), state, context)


# ---------------------------------------------------------------------------------------- formats


@dataclass
class Source:
    """A checkpoint file or folder as found on disk, before any format reads it.

    ``container``: 'safetensors', 'npz', 'torch' (.pth/.bin pickle), 'hf_folder' (config.json +
    weights), 'orbax_folder'. ``files``: the files holding tensors (shards in index order).
    ``config``: an HF config.json beside the weights, or None. ``weight_map``: a sharded folder's
    tensor -> shard file map. ``tensors`` and ``meta`` (safetensors header metadata) are filled by
    ``vit_common.checkpoints.formats.source.load_tensors``; ``dropped`` lists what the container held besides weights.
    """

    path: Path
    container: str
    files: tuple[Path, ...]
    config: dict | None = None
    weight_map: dict[str, str] | None = None
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def context(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class ReadOptions:
    """What a caller tells a reader: ``source_image_size`` (H, W) the file was trained at (for files that
    store none), ``overrides`` (config fields, recorded as given), ``keep_zero_head`` (.npz), ``readers``
    (framework readers for containers vit_common cannot open: 'torch', 'orbax')."""

    source_image_size: tuple[int, int] | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    keep_zero_head: bool = False
    readers: Mapping[str, Callable[..., Any]] | None = None


@dataclass
class Encoded:
    """A state as a format holds it, in memory, before it is written.

    ``cfg`` and ``state``: the config and canonical state the file will hold (they differ from the input
    only where the format needs it: ``notes`` say how). ``tensors``: the file's tensors. ``config_json``:
    an HF folder's config.json. ``meta``: safetensors header metadata (None where the container has none).
    ``json_files``: other JSON files of a folder format, by name (an HF folder's preprocessor_config.json).
    """

    cfg: ViTConfig
    state: dict[str, np.ndarray]
    tensors: dict[str, np.ndarray]
    config_json: dict | None = None
    meta: dict[str, str] | None = None
    notes: list[str] = field(default_factory=list)
    json_files: dict[str, dict] = field(default_factory=dict)


Writer = Callable[..., Any]


class Format:
    """One checkpoint format. Each module of ``vit_common.checkpoints.formats`` exports one instance as ``FORMAT``.

    Attributes: ``name`` (what --from/--to take), ``description``, ``suffixes`` (file suffixes written as
    this format when no --to is given; a folder format has none), ``folder`` (written as a folder),
    ``framework`` ('jax', 'torch' or None: what reading and writing need whatever the container).
    """

    name: str = ""
    description: str = ""
    suffixes: tuple[str, ...] = ()
    folder: bool = False
    framework: str | None = None

    def detect(self, src: Source) -> bool:
        """Whether ``src`` (tensors loaded) is this format."""
        raise NotImplementedError

    def read(self, src: Source, opts: ReadOptions) -> Decoded:
        """Canonical state, config and provenance of ``src``.

        Raises:
            FormatError: not this format, or what the twins lack (named). StateMismatchError: tensors
                missing, unexpected or of the wrong shape (file names).
        """
        raise NotImplementedError

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        """Every choice of ``cfg`` this format cannot hold (empty: it can), before ``encode``'s rewrites."""
        return []

    def encode(self, cfg: ViTConfig, state: Mapping[str, np.ndarray], path: Path, **options: Any) -> Encoded:
        """``state`` as this format holds it at ``path`` (its suffix may matter); ValueError if it cannot."""
        raise NotImplementedError

    def decode(self, enc: Encoded) -> Decoded:
        """Read ``enc`` back in memory, as ``read`` would read the written file."""
        raise NotImplementedError

    def write(self, path: Path, enc: Encoded, writers: Mapping[str, Writer]) -> None:
        """Write ``enc`` to ``path`` atomically (through ``vit_common.system.io``)."""
        raise NotImplementedError

    def needs(self, path: Path) -> str | None:
        """The framework writing ``path`` in this format needs ('jax', 'torch' or None)."""
        return self.framework

    def load_call(self, path: Path, cfg: ViTConfig) -> str:
        """Python code that loads the written file strictly in the library that defines the format."""
        return ""


def writer(writers: Mapping[str, Writer] | None, what: str, path: Path) -> Writer:
    """The framework writer ``what`` ('torch' | 'orbax') from ``writers``; FormatError if not given."""
    fn = (writers or {}).get(what)
    if fn is None:
        framework = "jax" if what == "orbax" else "torch"
        raise FormatError(
            f"{path}: writing {what} needs vit_{framework}.formats.WRITERS, which the caller did not pass"
        )
    return fn


__all__ = [
    "ASSUMED",
    "DECLARED",
    "DERIVED",
    "GIVEN",
    "Decoded",
    "Encoded",
    "Format",
    "FormatError",
    "Origin",
    "Piece",
    "ReadOptions",
    "Report",
    "Rule",
    "Source",
    "StateMismatchError",
]
