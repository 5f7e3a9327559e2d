"""The mapping rules between file tensors and the canonical state, and what a format's layout cannot hold.

A format's tensor layout is a list of ``Rule`` built from a ``ViTConfig``: each rule fills one canonical
tensor from one or more file tensors (several are concatenated along axis 0, e.g. q, k, v -> qkv), each
file tensor optionally reshaped, transposed and, for scan-stacked files, sliced from a stacked array.
The same list drives reading and writing, so the two are inverse by construction and every conversion
can check that each file tensor is used exactly once and each canonical tensor is filled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from vit_common.checkpoints.formats.tensors import (
    LazyTensor,
    Tensor,
    TensorMap,
    Widened,
    concat_rows,
    dtype_of,
    row_slice,
)
from vit_common.config import ViTConfig
from vit_common.posemb import SINCOS_CONVENTIONS, sincos2d
from vit_common.state import canonical_shapes, check_state
from vit_common.system.tensor_files import contiguous


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

    def from_canonical(self, a: np.ndarray, dtype: np.dtype | type | None = None) -> np.ndarray:
        """The file tensor (C order, cast to ``dtype`` if given) of canonical rows ``a`` (a transposed view
        of them, or a view of a transposed file tensor, is copied a tile at a time, cast as it is copied)."""
        if self.perm is not None:
            a = a.transpose(np.argsort(self.perm))
        return contiguous(a, dtype).reshape(self.shape)


class PieceTensor(LazyTensor):
    """The canonical rows one ``Piece`` computes from the file tensor ``key`` of ``tensors`` (a view of it
    where numpy allows: a transpose is not copied), loaded on use."""

    __slots__ = ("_piece", "_tensors", "key")

    def __init__(self, piece: Piece, tensors: TensorMap):
        super().__init__(piece.canonical_shape(), dtype_of(tensors[piece.key]), self._rows)
        self.key, self._piece, self._tensors = piece.key, piece, tensors

    def _rows(self) -> np.ndarray:
        return self._piece.to_canonical(np.asarray(self._tensors[self.key]))


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


def to_canonical(rules: list[Rule], tensors: TensorMap, context: str = "") -> dict[str, Tensor]:
    """Apply ``rules`` to file tensors: every file tensor used exactly once, every rule filled.

    Lazy: checked from the shapes alone; a canonical tensor stored as the file's is the file's value
    itself, any other a ``PieceTensor`` per piece that reshapes and transposes it when loaded, several
    joined by ``concat_rows`` (pieces of different dtypes: one ``LazyTensor`` that promotes them).

    Raises:
        StateMismatchError: lists missing, unexpected and wrong-shape file tensors together (file names).
    """
    check_state(file_shapes(rules), tensors, context)
    out: dict[str, Tensor] = {}
    for rule in rules:
        pieces = rule.pieces
        first = pieces[0]
        if len(pieces) == 1 and first.layer is None and first.reshape is None and first.perm is None:
            out[rule.dst] = tensors[first.key]
            continue
        if len({dtype_of(tensors[p.key]) for p in pieces}) == 1:  # a join of pieces, each loaded on its own
            out[rule.dst] = concat_rows([PieceTensor(p, tensors) for p in pieces])
            continue
        shapes = [p.canonical_shape() for p in pieces]
        shape = (sum(s[0] for s in shapes), *shapes[0][1:])
        dtype = np.result_type(*(dtype_of(tensors[p.key]) for p in pieces))

        def make(pieces=pieces) -> np.ndarray:
            return np.concatenate([p.to_canonical(np.asarray(tensors[p.key])) for p in pieces], axis=0)

        out[rule.dst] = LazyTensor(shape, dtype, make)
    return out


def from_canonical(rules: list[Rule], state: TensorMap) -> dict[str, Tensor]:
    """Inverse of ``to_canonical``: the file tensors (contiguous when loaded) for a canonical state, lazy
    as ``to_canonical``'s (a scan-stacked tensor gathers its layers when loaded)."""
    singles: dict[str, Tensor] = {}
    stacked: dict[str, dict[int, Callable[[], np.ndarray]]] = {}
    kinds: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for rule in rules:
        src = state[rule.dst]
        bounds = np.cumsum([0] + [p.canonical_shape()[0] for p in rule.pieces])
        whole = len(rule.pieces) == 1
        for j, p in enumerate(rule.pieces):

            def make(src=src, p=p, lo=int(bounds[j]), hi=int(bounds[j + 1]), whole=whole) -> np.ndarray:
                # a widened tensor is cast as the layout copies it: one float32 copy, in the file's order
                base, dtype = (src.base, np.float32) if isinstance(src, Widened) else (src, None)
                return p.from_canonical(np.asarray(base if whole else row_slice(base, lo, hi)), dtype)

            plain = whole and p.perm is None and tuple(p.shape) == tuple(np.shape(src))
            if p.layer is not None:
                stacked.setdefault(p.key, {})[p.layer] = make
                kinds[p.key] = (tuple(p.shape), dtype_of(src))
            elif plain and isinstance(src, np.ndarray) and src.flags.c_contiguous:
                singles[p.key] = src
            else:
                singles[p.key] = LazyTensor(p.shape, dtype_of(src), make)
    for key, layers in stacked.items():
        parts = [layers[i] for i in range(len(layers))]
        shape, dtype = kinds[key]
        singles[key] = LazyTensor((len(parts), *shape), dtype, lambda parts=parts: np.stack([m() for m in parts]))
    return singles


def materialize_posemb(
    cfg: ViTConfig, state: TensorMap, *, prefix_rows: bool
) -> tuple[ViTConfig, dict[str, Tensor], list[str]]:
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
        state = {"pos_embed": table.astype(dtype_of(any_param)), **state}
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


def zero_head_bias(cfg: ViTConfig, state: TensorMap) -> tuple[ViTConfig, dict[str, Tensor], list[str]]:
    """A bias-free head (CLIP's visual projection) for formats whose head has a bias: ``head.weight``
    plus a zero ``head.bias`` (and ``head_dist``'s), as timm's CLIP converter holds it
    (``timm.models.vision_transformer._convert_openai_clip`` writes ``torch.zeros``). Exact: adding zero
    changes nothing. Returns the config with ``head_bias=True``, the state (nothing loaded) and a note
    (none if unchanged)."""
    if cfg.head_bias or not cfg.num_classes:
        return cfg, dict(state), []
    state = dict(state)
    for h in ("head", "head_dist") if cfg.head_dist else ("head",):
        state[f"{h}.bias"] = np.zeros((cfg.num_classes,), dtype_of(state[f"{h}.weight"]))
    note = "the bias-free head written with a zero bias, as timm's CLIP converter writes it (exact)"
    return cfg.replace(head_bias=True), state, [note]


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
        "input_mean/input_std (an input normaliser inside the model: RADIO's)": cfg.input_mean is not None,
    }


def rope_family_fields(cfg: ViTConfig) -> list[str]:
    """The choices of the RoPE backbones (DINOv3, PE, EVA-02, RoPE-ViT) that ``cfg`` makes, one line each:
    what the formats written for plain ViTs (HF ViT and its families, .npz) cannot hold; written as our
    safetensors, as timm's Eva (``timm_eva``), a DINOv3 one as transformers dinov3_vit."""
    return unsupported(
        "",
        {
            f"rope={cfg.rope!r} (rotary position embeddings: write canonical safetensors or timm)": cfg.rope != "none",
            "k_bias=False (q and v biases without a key bias)": cfg.qkv_bias and not cfg.k_bias,
            "attn_inner_norm (a LayerNorm inside attention)": cfg.attn_inner_norm,
            "mlp_inner_norm (a LayerNorm inside the MLP)": cfg.mlp_inner_norm,
            "final_norm=False (no final LayerNorm)": not cfg.final_norm,
            f"map_heads={cfg.map_heads}, map_mlp_dim={cfg.map_mlp_dim} (a MAP head of its own size)": (
                cfg.pool == "map" and (cfg.map_num_heads, cfg.map_mlp_width) != (cfg.num_heads, cfg.mlp_dim)
            ),
        },
    )


def refuse(fmt: str, reasons: list[str]) -> None:
    """Raise ValueError naming every config choice ``fmt`` cannot hold."""
    if reasons:
        raise ValueError(f"the {fmt} format cannot hold this model: " + "; ".join(reasons))


def check_canonical(cfg: ViTConfig, state: Mapping[str, np.ndarray], context: str) -> None:
    """The final check of every read and write: the canonical state fits the config exactly."""
    check_state(canonical_shapes(cfg), state, context)
