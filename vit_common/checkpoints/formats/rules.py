"""The mapping rules between file tensors and the canonical state, and what a format's layout cannot hold.

A format's tensor layout is a list of ``Rule`` built from a ``ViTConfig``: each rule fills one canonical
tensor from one or more file tensors (several are concatenated along axis 0, e.g. q, k, v -> qkv), each
file tensor optionally reshaped, transposed and, for scan-stacked files, sliced from a stacked array.
The same list drives reading and writing, so the two are inverse by construction and every conversion
can check that each file tensor is used exactly once and each canonical tensor is filled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from vit_common.config import ViTConfig
from vit_common.posemb import SINCOS_CONVENTIONS, sincos2d
from vit_common.state import canonical_shapes, check_state


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


def materialize_posemb(
    cfg: ViTConfig, state: Mapping[str, np.ndarray], *, prefix_rows: bool
) -> tuple[ViTConfig, dict[str, np.ndarray], list[str]]:
    """Rewrite the position embedding into a learned table, for formats that only store one.

    ``posemb='sincos2d'`` (or ``'sincos2d_mae'``) becomes a learned ``pos_embed`` holding the table (cast
    to the parameter dtype, as the twins cast it before adding). With ``prefix_rows=True`` a table without prefix rows
    gains zero rows for the class (and distillation) token (exact: adding zero changes nothing). Returns
    the new config, state and one note per change. Register tokens cannot gain rows this way (they would
    be resampled with the grid otherwise): the caller's format check rejects them.
    """
    notes, state = [], dict(state)
    if cfg.posemb in SINCOS_CONVENTIONS:
        any_param = next(iter(state.values()))
        table = sincos2d(cfg.grid, cfg.width, convention=SINCOS_CONVENTIONS[cfg.posemb])[None]
        state = {"pos_embed": table.astype(np.asarray(any_param).dtype), **state}
        notes.append(f"{cfg.posemb} position embedding written as a learned pos_embed table")
        cfg = cfg.replace(posemb="learn")
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


# The norm and bias fields of every format whose models have LayerNorms and every bias (all but AIMv2's):
# what such a reader sets them to.
LAYERNORM_ALL_BIASES = dict(norm="layernorm", patch_norm=False, proj_bias=True, mlp_bias=True)


def norm_and_bias_checks(cfg: ViTConfig) -> dict[str, bool]:
    """The AIMv2-style choices (RMSNorm, a patch norm, bias-free projections) as ``unsupported`` checks, for
    the formats whose models have LayerNorms and every bias."""
    return {
        "norm='rmsnorm'": cfg.norm == "rmsnorm",
        "patch_norm": cfg.patch_norm,
        "proj_bias=False": not cfg.proj_bias,
        "mlp_bias=False": not cfg.mlp_bias,
    }


def refuse(fmt: str, reasons: list[str]) -> None:
    """Raise ValueError naming every config choice ``fmt`` cannot hold."""
    if reasons:
        raise ValueError(f"the {fmt} format cannot hold this model: " + "; ".join(reasons))


def check_canonical(cfg: ViTConfig, state: Mapping[str, np.ndarray], context: str) -> None:
    """The final check of every read and write: the canonical state fits the config exactly."""
    check_state(canonical_shapes(cfg), state, context)
