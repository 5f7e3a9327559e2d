"""Flax ``.npz`` checkpoints of the original ViT and of big_vision <-> the canonical state.

Keys are flax parameter paths joined with '/'. What varies between files, and is detected per file:

- prefix: none, ``opt/target/`` (flax.optim checkpoints of the original ViT; ``opt/state/...`` is optimizer
  state), ``params/`` or ``params/img/`` (big_vision; the image tower of a two-tower model such as SigLIP,
  whose text tower ``params/txt/``, log temperature ``params/t`` and logit bias ``params/b`` are reported
  as ignored, by name: big_vision ``models/proj/image_text/two_towers.py``);
- block counters: pre-linen global counters ``LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2,
  MlpBlock_3`` (original ViT files) or linen per-type ones ``LayerNorm_0, MultiHeadDotProductAttention_0,
  LayerNorm_1, MlpBlock_0`` (big_vision ``models/vit.py`` ``Encoder1DBlock``);
- blocks ``Transformer/encoderblock_{i}/...`` or scan-stacked ``Transformer/encoderblock/...`` with a
  leading layer axis (big_vision ``scan=True``);
- position embedding ``Transformer/posembed_input/pos_embedding`` (original ViT: added after the class
  token is prepended, so it has a class row), ``Transformer/pos_embedding`` (older big_vision) or
  top-level ``pos_embedding`` (big_vision: added before, no class row; a class row is the old
  "combined cls+posemb" form that big_vision's ``fix_old_checkpoints`` folds into ``cls``); absent
  means ``sincos2d`` (computed, not stored);
- pooling: ``cls`` -> class token; ``MAPHead_0/{probe, MultiHeadDotProductAttention_0, LayerNorm_0,
  MlpBlock_0}`` -> MAP head; neither -> global average pooling (big_vision 'gap');
- big_vision NaFlex (``models/proj/image_text/naflex_vit.py``, SigLIP 2 NaFlex): ``embedding/kernel`` a
  Dense [P*P*C, D] over patches flattened (P, P, C) and ``pos_embedding`` [G, G, D], read as vit.py's
  [P, P, C, D] and [1, G*G, D] and written back so (``npz_naflex``), resized per image bilinearly with
  antialias;
- ``pre_logits`` (original ViT ``representation_size``, big_vision ``rep_size``; dense + tanh) and
  ``head``. ImageNet-21k releases of the original ViT ship a 21,843-class head of zeros: it is dropped
  (reported), since it would make every logit zero.

Attention kernels are flax ``DenseGeneral``: query/key/value (D, N, D/N) and out (N, D/N, D); they map
to timm's fused qkv (3D, D) and proj (D, D), and give the head count. GELU (flax's default tanh
approximation in both codebases) and LayerNorm eps (flax's 1e-6) are not stored: they are assumed, and
warned, since files written from other models exist. ``NpzFormat`` is the format object; the modules
``original_vit`` and ``big_vision`` each export one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats import timm
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.npz_naflex import (
    is_naflex_vit,
    naflex_tensors,
    naflex_vit_cannot_hold,
    naflex_vit_load_call,
    naflex_vit_tensors,
)
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Format, Reference, Source, WriteOptions
from vit_common.checkpoints.formats.provenance import (
    assumed,
    build_config,
    common_float_dtype,
    derived,
    posemb_layout,
    positive_dims,
    shape_fields,
    square_grid_origin,
)
from vit_common.checkpoints.formats.rules import (
    LAYERNORM_ALL_BIASES,
    Piece,
    Rule,
    conv_kernel,
    copy,
    from_canonical,
    linear_kernel,
    materialize_posemb,
    norm_and_bias_checks,
    refuse,
    rope_family_fields,
    stack_layers,
    to_canonical,
    unsupported,
    zero_head_bias,
)
from vit_common.checkpoints.formats.source import NPZ_PREFIXES
from vit_common.checkpoints.formats.tensors import Tensor, TensorMap, Widened, dtype_of
from vit_common.checkpoints.formats.timm_state import timm_load_call
from vit_common.checkpoints.metadata import HF_NAFLEX_MODEL_TYPES, Declared
from vit_common.config import ViTConfig
from vit_common.data.images import Preprocess
from vit_common.system import io

PREFIXES = NPZ_PREFIXES
POSEMB_KEYS = ("pos_embedding", "Transformer/posembed_input/pos_embedding", "Transformer/pos_embedding")
_COUNTERS = {  # block sub-module names: norm1, attention, norm2, mlp
    "old": ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"),
    "new": ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"),
}
_BLOCK = re.compile(r"^(.*Transformer/)encoderblock_(\d+)/(.*)$")
_DROPPED_OUTSIDE = {
    "opt/target/": "optimizer state, outside opt/target/",
    "params/": "not a model parameter, outside params/",
    "params/img/": "outside the image tower params/img/ (e.g. the text tower of a two-tower model)",
}
# What else a big_vision two-tower checkpoint (SigLIP, LiT) holds beside its image tower ``params/img/``:
# big_vision models/proj/image_text/two_towers.py names its towers 'img' and 'txt' and adds the parameters
# 't' (log temperature) and, with bias_init (SigLIP's sigmoid loss), 'b'.
_TWO_TOWER = {
    "params/txt/": "the text tower of a big_vision two-tower model (SigLIP, LiT): not the image tower",
    "params/t": "the two-tower model's log temperature t (two_towers.py): a contrastive loss parameter",
    "params/b": "the two-tower model's logit bias b (two_towers.py bias_init, SigLIP's sigmoid loss)",
}


def _outside(key: str, prefix: str) -> str:
    """Why ``key``, outside ``prefix``, is not read: a two-tower model's text tower, ``t`` and ``b`` by name."""
    if prefix == "params/img/":
        for start, why in _TWO_TOWER.items():
            if key == start or (start.endswith("/") and key.startswith(start)):
                return why
    return _DROPPED_OUTSIDE[prefix]


@dataclass(frozen=True)
class Layout:
    """Where an .npz file puts things (see the module docstring)."""

    prefix: str = ""
    counters: str = "old"
    posemb_key: str = "Transformer/posembed_input/pos_embedding"
    scan: bool = False

    def describe(self) -> str:
        parts = [
            f"prefix {self.prefix!r}" if self.prefix else "no prefix",
            "scan-stacked blocks" if self.scan else "one entry per block",
            f"{_COUNTERS[self.counters][1]} counters",
            f"posemb at {self.posemb_key}",
        ]
        return ", ".join(parts)


LAYOUTS = {
    "original_vit": Layout("", "old", "Transformer/posembed_input/pos_embedding", False),
    "big_vision": Layout("params/", "new", "pos_embedding", False),
}


def family_of(keys) -> str | None:
    """'original_vit', 'big_vision' or None for the key names of an .npz file."""
    keys = list(keys)
    prefix = next((p for p in PREFIXES if p + "embedding/kernel" in keys), None)
    if prefix is None:
        return None
    if any("MultiHeadDotProductAttention_1/" in k for k in keys if "encoderblock" in k):
        return "original_vit"
    return "big_vision"


def _norm(src: str, dst: str, d: int) -> list[Rule]:
    return [copy(f"{src}/scale", f"{dst}.weight", (d,)), copy(f"{src}/bias", f"{dst}.bias", (d,))]


def _dense(src: str, dst: str, d_in: int, d_out: int) -> list[Rule]:
    return [
        linear_kernel(f"{src}/kernel", f"{dst}.weight", (d_out, d_in)),
        copy(f"{src}/bias", f"{dst}.bias", (d_out,)),
    ]


def _heads(src: str, names: tuple[str, ...], dst: str, cfg: ViTConfig, bias: bool = True) -> list[Rule]:
    """DenseGeneral q/k/v kernels (D, N, D/N) and biases (N, D/N), concatenated into one torch Linear."""
    d, n, hd = cfg.width, cfg.num_heads, cfg.head_dim
    r = [Rule(f"{dst}.weight", tuple(Piece(f"{src}/{m}/kernel", (d, n, hd), (d, d), (1, 0)) for m in names))]
    if bias:
        r.append(Rule(f"{dst}.bias", tuple(Piece(f"{src}/{m}/bias", (n, hd), (d,)) for m in names)))
    return r


def _attention_out(src: str, dst: str, cfg: ViTConfig) -> list[Rule]:
    d, n, hd = cfg.width, cfg.num_heads, cfg.head_dim
    return [
        Rule(f"{dst}.weight", (Piece(f"{src}/out/kernel", (n, hd, d), (d, d), (1, 0)),)),
        copy(f"{src}/out/bias", f"{dst}.bias", (d,)),
    ]


def rules(cfg: ViTConfig, layout: Layout) -> list[Rule]:
    """File <-> canonical rules for ``cfg`` written in ``layout``."""
    d, f, p = cfg.width, cfg.mlp_dim, layout.prefix
    ph, pw = cfg.patch_size
    ln1, mha, ln2, mlp = _COUNTERS[layout.counters]
    r = [
        conv_kernel(p + "embedding/kernel", "patch_embed.proj.weight", (d, cfg.in_chans, ph, pw)),
        copy(p + "embedding/bias", "patch_embed.proj.bias", (d,)),
    ]
    if cfg.class_token:
        r.append(copy(p + "cls", "cls_token", (1, 1, d)))
    if cfg.posemb == "learn":
        r.append(copy(p + layout.posemb_key, "pos_embed", (1, cfg.posemb_len, d)))
    for i in range(cfg.depth):
        b, t = f"{p}Transformer/encoderblock_{i}/", f"blocks.{i}."
        r += _norm(b + ln1, t + "norm1", d)
        r += _heads(b + mha, ("query", "key", "value"), t + "attn.qkv", cfg, cfg.qkv_bias)
        r += _attention_out(b + mha, t + "attn.proj", cfg)
        r += _norm(b + ln2, t + "norm2", d)
        r += _dense(f"{b}{mlp}/Dense_0", t + "mlp.fc1", d, f) + _dense(f"{b}{mlp}/Dense_1", t + "mlp.fc2", f, d)
    r += _norm(p + "Transformer/encoder_norm", "norm", d)
    if cfg.pool == "map":
        h = p + "MAPHead_0/"
        r.append(copy(h + "probe", "attn_pool.latent", (1, 1, d)))
        r += _heads(h + "MultiHeadDotProductAttention_0", ("query",), "attn_pool.q", cfg)
        r += _heads(h + "MultiHeadDotProductAttention_0", ("key", "value"), "attn_pool.kv", cfg)
        r += _attention_out(h + "MultiHeadDotProductAttention_0", "attn_pool.proj", cfg)
        r += _norm(h + "LayerNorm_0", "attn_pool.norm", d)
        r += _dense(h + "MlpBlock_0/Dense_0", "attn_pool.mlp.fc1", d, f)
        r += _dense(h + "MlpBlock_0/Dense_1", "attn_pool.mlp.fc2", f, d)
    if cfg.rep_size:
        r += _dense(p + "pre_logits", "pre_logits.fc", d, cfg.rep_size)
    if cfg.num_classes:
        r += _dense(p + "head", "head", cfg.features_dim, cfg.num_classes)
    if layout.scan:

        def stacked(key: str):
            m = _BLOCK.match(key)
            return (f"{m.group(1)}encoderblock/{m.group(3)}", int(m.group(2))) if m else None

        r = stack_layers(r, stacked)
    return r


def read(
    tensors: TensorMap,
    *,
    source_image_size: tuple[int, int] | None = None,
    overrides: Mapping[str, Any] = (),
    context: str = ".npz file",
    keep_zero_head: bool = False,
) -> Decoded:
    """Canonical state and inferred config of an original-ViT or big_vision .npz (as a dict).

    An all-zero head is dropped (reported) unless ``keep_zero_head``: the ImageNet-21k releases of the
    original ViT ship one, and it makes every logit zero.

    Raises:
        FormatError: not a ViT .npz, or an invalid inferred config.
        StateMismatchError: tensors missing, unexpected or of the wrong shape (file names).
    """
    overrides = dict(overrides)
    prefix = next((p for p in PREFIXES if p + "embedding/kernel" in tensors), None)
    known = {}
    if prefix is not None and np.ndim(tensors[prefix + "embedding/kernel"]) == 2:
        tensors, size, known = naflex_tensors(tensors, prefix, overrides, context)
        source_image_size = size or source_image_size
    if prefix is None or np.ndim(tensors[prefix + "embedding/kernel"]) != 4:
        raise FormatError(f"{context}: no 4-D embedding/kernel under any of the prefixes {PREFIXES}")
    dropped = [(k, _outside(k, prefix)) for k in tensors if not k.startswith(prefix)]
    t = {k: v for k, v in tensors.items() if k.startswith(prefix)}
    ph, pw, c, d = positive_dims(np.shape(t[prefix + "embedding/kernel"]), prefix + "embedding/kernel", context)
    grid = (source_image_size[0] // ph, source_image_size[1] // pw) if source_image_size else None
    tr = prefix + "Transformer/"
    scan = tr + "encoderblock/LayerNorm_0/scale" in t
    block0 = tr + ("encoderblock/" if scan else "encoderblock_0/")
    counters = "old" if any(k.startswith(block0 + "MultiHeadDotProductAttention_1/") for k in t) else "new"
    ln1, mha, ln2, mlp = _COUNTERS[counters]

    def shape(key: str) -> tuple[int, ...]:  # per-layer shape of a block tensor
        if key not in t:
            raise FormatError(f"{context}: missing {key}")
        s = np.shape(t[key])
        return s[1:] if scan and key.startswith(block0) else s

    if scan:
        depth = np.shape(t[block0 + "LayerNorm_0/scale"])[0]
    else:
        depth = 0
        while f"{tr}encoderblock_{depth}/LayerNorm_0/scale" in t:
            depth += 1
    if depth == 0:
        raise FormatError(f"{context}: no {tr}encoderblock_0/ or scan-stacked {tr}encoderblock/ parameters")
    q = shape(f"{block0}{mha}/query/kernel")
    if len(q) != 3:
        raise FormatError(f"{context}: {block0}{mha}/query/kernel has shape {q}, expected (D, N, D/N)")
    f, prov = shape_fields(
        patch_size=(ph, pw),
        in_chans=c,
        width=d,
        depth=depth,
        num_heads=q[1],
        mlp_dim=shape(f"{block0}{mlp}/Dense_0/kernel")[-1],
        qkv_bias=f"{block0}{mha}/query/bias" in t,
        class_token=prefix + "cls" in t,
        patch_bias=True,
        qk_norm=False,
        dist_token=False,
        mlp_type="plain",
        head_bias=True,
        head_dist=False,
        reg_tokens=0,
        norm_pre=False,
        fc_norm=False,
        **LAYERNORM_ALL_BIASES,
    )
    posemb_key = next((k for k in POSEMB_KEYS if prefix + k in t), None)
    notes = []
    if posemb_key is not None:
        f["posemb"] = "learn"
        (gh, gw), f["posemb_prefix"], prov["posemb_prefix"] = posemb_layout(
            np.shape(t[prefix + posemb_key])[1],
            int(f["class_token"]),
            grid,
            prefix + posemb_key,
            context,
        )
        prov["posemb"] = derived("a stored pos_embedding")
        prov["image_size"] = (
            derived("pos_embedding rows and the given size")
            if grid
            else square_grid_origin((gh, gw), "the pos_embedding rows")
        )
    else:
        f["posemb"], f["posemb_prefix"] = "sincos2d", False
        gh, gw = grid or (224 // ph, 224 // pw)
        prov["posemb"] = derived("no pos_embedding stored: big_vision's sincos2d")
        prov["posemb_prefix"] = derived("sincos2d has no prefix rows")
        prov["image_size"] = derived("the given size") if grid else assumed("not stored (sincos2d); 224 assumed")
    f["image_size"] = (gh * ph, gw * pw)
    if prefix + "MAPHead_0/probe" in t:
        f["pool"], prov["pool"] = "map", derived("MAPHead_0 tensors")
    elif f["class_token"]:
        f["pool"], prov["pool"] = "token", derived("a class token (big_vision adds one only for 'tok' pooling)")
    else:
        f["pool"], prov["pool"] = "gap", assumed("not stored; no class token and no MAP head: 'gap' assumed")
    f["pool_include_prefix"] = False
    prov["pool_include_prefix"] = derived("big_vision pools without prefix tokens")
    f["rep_size"] = np.shape(t[prefix + "pre_logits/kernel"])[-1] if prefix + "pre_logits/kernel" in t else 0
    f["num_classes"] = np.shape(t[prefix + "head/kernel"])[-1] if prefix + "head/kernel" in t else 0
    prov["rep_size"], prov["num_classes"] = derived("pre_logits shape"), derived("head shape")
    if (
        f["num_classes"]
        and not keep_zero_head
        and not any(
            np.any(np.asarray(t[prefix + f"head/{w}"])) for w in ("kernel", "bias") if prefix + f"head/{w}" in t
        )
    ):
        why = (
            f"all zeros ({f['num_classes']}-class head zeroed in the release, e.g. ImageNet-21k ViT): "
            "dropped; "
            f"pass num_classes={f['num_classes']} to keep it"
        )
        dropped += [(prefix + f"head/{w}", why) for w in ("kernel", "bias") if prefix + f"head/{w}" in t]
        t = {k: v for k, v in t.items() if not k.startswith(prefix + "head/")}
        f["num_classes"] = 0
    f["gelu"], f["ln_eps"] = "tanh", 1e-6
    prov["gelu"] = assumed(
        ".npz files cannot hold the GELU, even one given when this file was written; the original ViT and "
        "big_vision use flax nn.gelu (tanh approximation)"
    )
    prov["ln_eps"] = assumed(".npz files cannot hold the LayerNorm eps; flax LayerNorm's eps 1e-6")
    f["posemb_resample"] = "bilinear_corners"  # big_vision / original ViT resample with scipy zoom order 1
    for name, (value, origin) in known.items():
        f[name], prov[name] = value, origin
    dt = common_float_dtype(t)
    if dt in ("float32", "float64", "bfloat16", "float16"):
        f["param_dtype"] = dt
    cfg = build_config(f, prov, overrides, context, t)
    layout = Layout(prefix, counters, posemb_key or "pos_embedding", scan)
    state = to_canonical(rules(cfg, layout), t, context)
    return Decoded(cfg, state, layout.describe() + (", naflex_vit" if known else ""), prov, dropped, notes)


def cannot_hold(cfg: ViTConfig) -> list[str]:
    """What an original-ViT or big_vision .npz cannot hold."""
    return rope_family_fields(cfg) + unsupported(
        "npz",
        {
            f"reg_tokens={cfg.reg_tokens}": cfg.reg_tokens > 0,
            "LayerScale": cfg.layer_scale is not None,
            "qk_norm": cfg.qk_norm,
            "fc_norm": cfg.fc_norm,
            "posemb='none' (a file without position embedding reads as sincos2d)": cfg.posemb == "none",
            "a distillation token (DeiT)": cfg.dist_token,
            "norm_pre": cfg.norm_pre,
            "patch_bias=False": not cfg.patch_bias,
            f"pool={cfg.pool!r}": cfg.pool not in ("token", "gap", "map"),
            "a class token with pool other than 'token'": cfg.class_token and cfg.pool != "token",
            "pool_include_prefix=True": cfg.pool_include_prefix and cfg.num_prefix_tokens > 0,
            "quick GELU": cfg.gelu == "quick",
            "mlp_type='swiglu'": cfg.mlp_type == "swiglu",
            "posemb='sincos2d_mae' (a file without position embedding reads as big_vision's sincos2d)": (
                cfg.posemb == "sincos2d_mae"
            ),
        }
        | norm_and_bias_checks(cfg),
    )


def prepare(cfg: ViTConfig, state: TensorMap, family: str) -> tuple[ViTConfig, dict[str, Tensor], list[str]]:
    """Config and tensors as ``family`` ('original_vit' | 'big_vision') holds them.

    A bias-free head gets a zero bias (``rules.zero_head_bias``). The original ViT only has learned
    position embeddings with prefix rows (a table without them gets a zero class row; sincos2d is written
    as a table). bfloat16 is written as float32 (exact): .npz has
    no portable bfloat16.

    Raises:
        ValueError: names every choice the layout cannot hold.
    """
    refuse(family, cannot_hold(cfg))
    cfg, state, notes = zero_head_bias(cfg, state)
    if cfg.num_classes and not any(np.any(np.asarray(state[k])) for k in ("head.weight", "head.bias")):
        notes.append("the head is all zeros: readers drop it unless given num_classes (--num-classes)")
    if family == "original_vit":
        cfg, state, posemb_notes = materialize_posemb(cfg, state, prefix_rows=True)
        notes += posemb_notes
    state = dict(state)
    if any(dtype_of(v).name == "bfloat16" for v in state.values()):
        state = {k: Widened(v) for k, v in state.items()}
        cfg = cfg.replace(param_dtype="float32")
        notes.append("bfloat16 tensors written as float32 (exact; .npz has no portable bfloat16)")
    return cfg, state, notes


def write(
    cfg: ViTConfig,
    state: TensorMap,
    family: str,
    *,
    prefix: str | None = None,
    scan: bool = False,
) -> dict[str, Tensor]:
    """File tensors of an already ``prepare``d state in ``family``'s layout.

    ``prefix`` defaults to '' (original_vit) or 'params/' (big_vision); ``scan`` stacks the blocks.
    """
    base = LAYOUTS[family]
    prefix = base.prefix if prefix is None else prefix
    if prefix not in PREFIXES:
        raise ValueError(f"prefix={prefix!r}: expected one of {PREFIXES}")
    layout = Layout(prefix, base.counters, base.posemb_key, scan)
    return from_canonical(rules(cfg, layout), state)


@dataclass(frozen=True)
class NpzWriteOptions(WriteOptions):
    """How an .npz is laid out: the key ``prefix`` (None: the family's own) and scan-stacked blocks."""

    prefix: str | None = field(
        default=None,
        metadata={
            "flag": "--npz-prefix",
            "choices": PREFIXES,
            "help": "key prefix of a written .npz (default '' for original_vit, 'params/' for big_vision)",
        },
    )
    scan: bool = field(
        default=False, metadata={"flag": "--scan", "help": "write .npz blocks scan-stacked (big_vision scan=True)"}
    )
    naflex: bool | None = field(
        default=None,
        metadata={
            "flag": "--big-vision-naflex",
            "help": "big_vision: naflex_vit's layout (SigLIP 2 NaFlex: embedding/kernel [P*P*C, D], pos_embedding "
            "[G, G, D]); default: a NaFlex source's (big_vision naflex_vit, transformers siglip2, timm NaFlexVit "
            "with a bilinear resize)",
        },
    )


class NpzFormat(Format):
    """The original ViT's or big_vision's .npz (``family``), sharing one layout description; ``signature``
    says how ``detect`` tells the two apart, ``assumed_preprocess`` / ``assumed_why`` what its files are
    read with (they store no preprocessing)."""

    write_options = NpzWriteOptions
    reference = Reference("timm", "npz")
    checks_on_write = True  # io.save_npz loads each tensor once

    def __init__(
        self,
        family: str,
        description: str,
        suffixes: tuple[str, ...],
        signature: str,
        assumed_preprocess: Preprocess,
        assumed_why: str,
    ):
        self.name, self.description, self.suffixes, self.signature = family, description, suffixes, signature
        self.assumed_preprocess, self.assumed_why = assumed_preprocess, assumed_why

    def detect(self, src: Source) -> bool:
        return src.container == "npz" and family_of(src.tensors) == self.name

    def declared(self, src: Source) -> Declared:
        """Nothing (an .npz stores no preprocessing); a big_vision naflex_vit file holds a NaFlex model
        and declares no patch budget (``Declared.no_budget``)."""
        return Declared(no_budget=src.container == "npz" and is_naflex_vit(src.tensors))

    def read(self, src: Source, opts) -> Decoded:
        if src.container != "npz":
            raise FormatError(f"{src.path}: a {src.container} container, not an .npz")
        return read(
            src.tensors,
            source_image_size=opts.source_image_size,
            overrides=opts.overrides,
            context=src.context,
            keep_zero_head=opts.keep_zero_head,
        )

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        return cannot_hold(cfg)

    def complete_options(self, options: NpzWriteOptions, source) -> NpzWriteOptions:
        """big_vision: naflex_vit's layout for a NaFlex ``source`` (a big_vision naflex_vit file, a
        transformers ``siglip2`` folder, a timm NaFlexVit resizing bilinearly) where ``options`` leave it unset."""
        if options.naflex is not None or self.name != "big_vision":
            return options
        layout, cfg = getattr(source, "layout", "") or "", getattr(source, "config", None)
        timm_naflex = ("NaFlexVit" in layout or "naflexvit_" in layout) and getattr(cfg, "posemb_resample", "")
        naflex = layout.endswith("naflex_vit") or getattr(source, "model_type", "") in HF_NAFLEX_MODEL_TYPES
        return replace(options, naflex=naflex or timm_naflex == "bilinear_aa")

    def encode(self, cfg: ViTConfig, state, path: Path, options: NpzWriteOptions, assumed=()) -> Encoded:
        naflex = bool(options.naflex)
        if naflex:
            refuse("big_vision naflex_vit", naflex_vit_cannot_hold(cfg, self.name))
        cfg, state, notes = prepare(cfg, state, self.name)
        tensors = write(cfg, state, self.name, prefix=options.prefix, scan=options.scan)
        if naflex:  # a table resized to each input's grid: what a naflex_vit file reads back as
            cfg, tensors = cfg.replace(dynamic_img_size=True), naflex_vit_tensors(cfg, tensors)
            return Encoded(cfg, state, tensors, None, None, notes, load_call=naflex_vit_load_call(path))
        return Encoded(cfg, state, tensors, None, None, notes)

    def decode(self, enc: Encoded) -> Decoded:
        return read(
            enc.tensors,
            source_image_size=enc.cfg.image_size,
            overrides={"in_chans": enc.cfg.in_chans},  # a naflex_vit kernel's P*P*C rows name no C
            keep_zero_head=True,
            context=f"{self.name} read-back",
        )

    def write(self, path: Path, enc: Encoded, writers) -> None:
        io.save_npz(path, enc.tensors)

    def export_name(self, source: Path | None = None) -> str:
        return f"model_{self.name}.npz"

    def load_call(self, path: Path, cfg: ViTConfig) -> str:
        if timm.FORMAT.cannot_hold(cfg) or cfg.posemb == "sincos2d":
            return ""
        lines = timm_load_call(path.with_suffix(".safetensors"), cfg).splitlines()
        lines = [line for line in lines if "state" not in line and "safetensors" not in line]
        return "\n".join(lines + [f"model.load_pretrained({str(path)!r})  # timm's loader of ViT .npz files"])
