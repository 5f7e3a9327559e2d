"""What every format module shares: the mapping rules between file tensors and the canonical state,
the conversion report, and the errors.

A format is described by a list of ``Rule`` built from a ``ViTConfig``: each rule fills one canonical
tensor from one or more file tensors (several are concatenated along axis 0, e.g. q, k, v -> qkv), each
file tensor optionally reshaped, transposed and, for scan-stacked files, sliced from a stacked array.
The same list drives reading and writing, so the two are inverse by construction and every conversion
can check that each file tensor is used exactly once and each canonical tensor is filled (K05).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vit_common.config import VARIANTS, ViTConfig
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


# ------------------------------------------------------------------------------- config inference


def shape_fields(**fields: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """(config fields, their 'tensor shapes' provenance) for values read off tensor shapes."""
    return dict(fields), {k: "tensor shapes" for k in fields}


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


def guess_num_heads(width: int) -> tuple[int, str]:
    """num_heads for a width when the file stores none: the VARIANTS row of that width, else width/64.

    Returns (num_heads, how it was chosen). Raises FormatError if no rule gives a divisor.
    """
    for name, row in VARIANTS.items():
        if row["width"] == width:
            return row["num_heads"], f"guessed from width {width} (variant {name}); override with num_heads"
    if width % 64 == 0:
        return width // 64, "guessed as width/64 (head_dim 64); override with num_heads"
    raise FormatError(f"cannot guess num_heads for width {width}: the file does not store it; pass num_heads")


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


def posemb_layout(rows: int, num_prefix: int, grid: tuple[int, int] | None, name: str) -> tuple[tuple[int, int], bool]:
    """(patch grid, posemb_prefix) of a stored pos_embed with ``rows`` rows.

    With prefix rows (timm default, original ViT) the rows are prefix + grid; without (no_embed_class,
    big_vision) they are the grid alone. ``grid`` is the known grid (from metadata or an override);
    without it the grid must be square. When both readings fit, the one with prefix rows wins only if
    the other is impossible.

    Raises:
        FormatError: no square (or given) grid fits; the message names the tensor and what to pass.
    """
    without = grid_of(rows, 0, grid)
    if without is not None and not num_prefix:
        return without, True  # nothing to place: ViTConfig's default
    with_prefix = grid_of(rows, num_prefix, grid) if num_prefix else None
    if without is not None and (with_prefix is None or grid is None):
        return without, False
    if with_prefix is not None:
        return with_prefix, True
    hint = f"grid {grid[0]}x{grid[1]}" if grid else "a square grid"
    raise FormatError(
        f"{name} has {rows} rows, which is not {hint} (with or without {num_prefix} prefix rows); "
        "pass source_image_size=(H, W) for a non-square grid"
    )


# ------------------------------------------------------------------------------- representability


def materialize_posemb(
    cfg: ViTConfig, state: Mapping[str, np.ndarray], *, prefix_rows: bool
) -> tuple[ViTConfig, dict[str, np.ndarray], list[str]]:
    """Rewrite the position embedding into a learned table, for formats that only store one.

    ``posemb='sincos2d'`` becomes a learned ``pos_embed`` holding the table (cast to the parameter
    dtype, as the twins cast it before adding). With ``prefix_rows=True`` a table without prefix rows
    gains zero rows for the class token (exact: adding zero changes nothing). Returns the new config,
    state and one note per change. Register tokens cannot gain rows this way (they would be resampled
    with the grid otherwise): the caller's format check rejects them.
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


def unsupported(fmt: str, cfg: ViTConfig, checks: Mapping[str, bool]) -> None:
    """Raise ValueError naming every config choice ``fmt`` cannot hold (``checks``: description -> bad)."""
    bad = [what for what, fails in checks.items() if fails]
    if bad:
        raise ValueError(f"the {fmt} format cannot hold this model: " + "; ".join(bad))


# ---------------------------------------------------------------------------------------- report


@dataclass
class Report:
    """What a conversion read, inferred, dropped, resampled and wrote, and why.

    ``inferred`` maps a config field to where its value came from ('config.json', 'tensor shapes',
    'guess: ...', 'override', 'format default: ...').
    """

    source: str = ""
    format: str = ""
    layout: str = ""
    tensors_read: int = 0
    inferred: dict[str, str] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    resampled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    config: ViTConfig | None = None
    written: str = ""
    written_format: str = ""

    @property
    def variant(self) -> str:
        cfg = self.config
        if cfg is None:
            return "?"
        p = cfg.patch_size[0] if cfg.patch_size[0] == cfg.patch_size[1] else "x".join(map(str, cfg.patch_size))
        if cfg.variant is not None:
            return f"{cfg.variant}/{p}"
        return f"custom (width {cfg.width}, depth {cfg.depth}, heads {cfg.num_heads}, mlp {cfg.mlp_dim}, patch {p})"

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
        out += [f"inferred {k} = {getattr(cfg, k, '?')!r} ({v})" for k, v in self.inferred.items()]
        out += [f"dropped  {k}: {why}" for k, why in self.dropped]
        out += [f"resampled {r}" for r in self.resampled]
        out += [f"note     {n}" for n in self.notes]
        out += [f"WARNING  {w}" for w in self.warnings]
        if self.written:
            out.append(f"wrote    {self.written} ({self.written_format})")
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
            "inferred": dict(self.inferred),
            "dropped": [list(d) for d in self.dropped],
            "resampled": list(self.resampled),
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "config": self.config.to_dict() if self.config else None,
            "written": self.written,
            "written_format": self.written_format,
        }


@dataclass
class Decoded:
    """What a format reader returns: config, canonical state and its part of the report."""

    cfg: ViTConfig
    state: dict[str, np.ndarray]
    layout: str = ""
    inferred: dict[str, str] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # stored metadata vs head shape (see convert.py)


def build_config(fields: dict, inferred: dict[str, str], overrides: Mapping, context: str) -> ViTConfig:
    """ViTConfig from inferred ``fields`` with ``overrides`` on top (recorded as 'override').

    Raises:
        FormatError: the combination is invalid (names the file and the fields).
    """
    for k, v in overrides.items():
        fields[k] = v
        inferred[k] = "override"
    try:
        return ViTConfig(**fields)
    except (TypeError, ValueError) as e:
        raise FormatError(
            f"{context}: the inferred config is invalid ({e}); pass the right value as an override"
        ) from e


def check_canonical(cfg: ViTConfig, state: Mapping[str, np.ndarray], context: str) -> None:
    """The final K05 check: the canonical state fits the config exactly."""
    check_state(canonical_shapes(cfg), state, context)


__all__ = ["FormatError", "StateMismatchError", "Piece", "Rule", "Report", "Decoded"]
