"""transformers ``dinov3_vit`` (``DINOv3ViTModel``, transformers 5.24) <-> the config and canonical state.

What config.json says (declared): ``hidden_size`` width, ``num_hidden_layers`` depth,
``num_attention_heads``, ``intermediate_size`` F, ``use_gated_mlp`` (SwiGLU: ``down(silu(gate) * up)``,
needs ``hidden_act='silu'``; plain: GELU), ``layer_norm_eps``, ``rope_theta`` (the RoPE temperature),
``patch_size``, ``image_size``, ``num_channels``, ``query_bias`` = ``value_bias`` and ``key_bias``,
``num_register_tokens``. What the model type fixes (declared by the format): a class token, no position
table, RoPE ``dinov3`` (half layout, centred coordinates normalised per axis, offset 0, ``ij``, periods
recomputed in float32), LayerScale (``layer_scale{1,2}.lambda1``, always present), patch bias, a final
norm, and the class token as the pooled output (``pooler_output``; no head: ``num_classes`` 0).

Tensors: files from ``save_pretrained`` name blocks ``layer.{i}.``, the model in memory
``model.layer.{i}.``: both are read. ``attention.{q,k,v}_proj`` are fused into ``attn.qkv`` rows
[q; k; v] (biases into ``attn.qkv.bias`` with ``key_bias``, else ``attn.q_bias`` / ``attn.v_bias``);
``o_proj`` is ``attn.proj``; the gated MLP's ``gate_proj`` and ``up_proj`` pack into ``mlp.fc1`` (gate
rows first), ``down_proj`` is ``mlp.fc2``; a plain MLP's ``up_proj`` is ``fc1``. ``embeddings.mask_token``
(training only) is ignored when read and written as zeros. Fused and split tensors are ``LazyTensor``s
over the source's (``vit_common.checkpoints.formats.tensors``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.dinov3_original import dinov3_fixed
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf import HfWriteOptions, HuggingFace
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Source
from vit_common.checkpoints.formats.provenance import (
    ASSUMED_KEY,
    Origin,
    build_config,
    carried_assumptions,
    common_float_dtype,
    declared,
)
from vit_common.checkpoints.formats.rules import check_canonical, refuse
from vit_common.checkpoints.formats.tensors import Tensor, TensorMap, concat_rows, dtype_of, row_slice
from vit_common.config import ViTConfig
from vit_common.data.images import IMAGENET_MEAN, IMAGENET_STD, Preprocess

MODEL_TYPE = "dinov3_vit"
_GELU = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "quick_gelu": "quick"}
# transformers 5.24 DINOv3ViTConfig defaults of the keys read
DEFAULTS: dict[str, Any] = dict(
    patch_size=16,
    hidden_size=384,
    intermediate_size=1536,
    num_hidden_layers=12,
    num_attention_heads=6,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    rope_theta=100.0,
    image_size=224,
    num_channels=3,
    query_bias=True,
    key_bias=False,
    value_bias=True,
    proj_bias=True,
    mlp_bias=True,
    use_gated_mlp=False,
    num_register_tokens=0,
)
# What the model type fixes: the ViTConfig fields no config.json key changes.
FIXED: dict[str, Any] = dinov3_fixed("rope_grid_indexing", {"rope_periods": "computed"})
_MASK = "embeddings.mask_token"


def _fields(config: Mapping[str, Any], context: str) -> tuple[dict[str, Any], dict[str, Origin]]:
    """ViTConfig fields of a ``dinov3_vit`` config.json and their origins (a missing key is transformers'
    default, declared too: that is what transformers builds)."""
    for key, v in config.items():
        kind = type(DEFAULTS.get(key, v))
        if isinstance(v, bool) != (kind is bool) or not isinstance(v, (int, float) if kind is float else kind):
            raise FormatError(f"{context}: config.json {key}={v!r} is not a {kind.__name__}")
    c = {**DEFAULTS, **config}

    def origin(*keys: str) -> Origin:
        given = [k for k in keys if k in config]
        return declared(f"config.json {', '.join(given)}") if given else declared(f"transformers' default {keys[0]}")

    if c["query_bias"] != c["value_bias"] or (c["key_bias"] and not c["query_bias"]):
        raise FormatError(
            f"{context}: config.json query_bias={c['query_bias']}, key_bias={c['key_bias']}, value_bias="
            f"{c['value_bias']}; the twins take q and v biases together, with or without a k bias"
        )
    act = c["hidden_act"]
    if c["use_gated_mlp"] and act != "silu" or not c["use_gated_mlp"] and act not in _GELU:
        raise FormatError(f"{context}: config.json hidden_act={act!r} with use_gated_mlp={c['use_gated_mlp']}")
    read = {  # field -> (value, config.json keys)
        "image_size": (c["image_size"], ("image_size",)),
        "patch_size": (c["patch_size"], ("patch_size",)),
        "in_chans": (c["num_channels"], ("num_channels",)),
        "width": (c["hidden_size"], ("hidden_size",)),
        "depth": (c["num_hidden_layers"], ("num_hidden_layers",)),
        "num_heads": (c["num_attention_heads"], ("num_attention_heads",)),
        "mlp_dim": (c["intermediate_size"], ("intermediate_size",)),
        "mlp_type": ("swiglu" if c["use_gated_mlp"] else "plain", ("use_gated_mlp",)),
        "gelu": (_GELU.get(act, "exact"), ("hidden_act",)),
        "qkv_bias": (bool(c["query_bias"]), ("query_bias", "value_bias")),
        "k_bias": (bool(c["key_bias"]) or not c["query_bias"], ("key_bias",)),
        "proj_bias": (bool(c["proj_bias"]), ("proj_bias",)),
        "mlp_bias": (bool(c["mlp_bias"]), ("mlp_bias",)),
        "ln_eps": (float(c["layer_norm_eps"]), ("layer_norm_eps",)),
        "reg_tokens": (c["num_register_tokens"], ("num_register_tokens",)),
        "rope_temperature": (float(c["rope_theta"]), ("rope_theta",)),
    }
    fields = {k: v for k, (v, _) in read.items()}
    prov = {k: origin(*keys) for k, (_, keys) in read.items()}
    fields |= FIXED | {"num_classes": 0, "layer_scale": 1.0, "dynamic_img_size": True}  # + run-time fields
    prov |= dict.fromkeys([*FIXED, "num_classes"], declared(f"model_type {MODEL_TYPE!r}"))
    return fields, prov


def dinov3_config(config: Mapping[str, Any], context: str = "dinov3_vit") -> ViTConfig:
    """The ViTConfig of a ``dinov3_vit`` config.json (a missing key is transformers' default).

    Raises:
        FormatError: a config.json value of the wrong type, a k bias without q/v biases, q and v biases
            that differ, a gated MLP whose activation is not SiLU, an invalid combination: each named.
    """
    fields, _ = _fields(config, context)
    try:
        return ViTConfig(**fields)
    except ValueError as e:
        raise FormatError(f"{context}: {e}") from e


def read_dinov3(
    tensors: TensorMap, config: Mapping[str, Any], *, overrides: Mapping[str, Any] = (), context: str = "dinov3_vit"
) -> Decoded:
    """Config, canonical state and provenance of a ``dinov3_vit`` folder's tensors (file or in-memory
    names) and config.json; ``overrides`` are config fields the caller gives.

    Raises:
        FormatError: what ``dinov3_config`` refuses; ``rope_periods='stored'`` (the folder stores none).
        StateMismatchError: tensors missing, unexpected or of the wrong shape for the declared config.
    """
    fields, prov = _fields(config, context)
    dt = common_float_dtype(tensors)
    if dt in ("float32", "float64", "bfloat16", "float16"):
        fields["param_dtype"] = dt
    carried_assumptions(config.get(ASSUMED_KEY), prov, context)
    if dict(overrides).get("rope_periods", "computed") != "computed":
        raise FormatError(
            f"{context}: rope_periods={overrides['rope_periods']!r}, but a dinov3_vit folder stores no periods "
            "(transformers recomputes them in float32): expected recomputed"
        )
    cfg = build_config(fields, prov, dict(overrides), context, tensors)
    dropped = [(k, "mask token of masked-image modelling; unused for images") for k in tensors if k == _MASK]
    state = to_canonical(cfg, tensors)
    check_canonical(cfg, state, context)
    spelling = "model.layer.{i}" if any(k.startswith("model.layer.") for k in tensors) else "layer.{i}"
    return Decoded(cfg, state, f"DINOv3ViTModel, {spelling} key names", prov, dropped, model_type=MODEL_TYPE)


def cannot_hold(cfg: ViTConfig) -> list[str]:
    """Why a ``dinov3_vit`` folder cannot hold ``cfg``'s function, one line per reason ([] if it can)."""
    inert = cfg.inert_fields()
    want = {k: v for k, v in FIXED.items() if k != "rope_periods" and k not in inert} | {"num_classes": 0}
    out = [f"{k}={getattr(cfg, k)!r} (dinov3_vit has {v!r})" for k, v in want.items() if getattr(cfg, k) != v]
    if cfg.rope == "dinov3" and cfg.rope_periods == "stored":
        out.append("rope_periods='stored' (dinov3_vit recomputes the periods: read with --rope-periods recomputed)")
    if cfg.mlp_type == "plain" and cfg.gelu != "exact":
        out.append(f"gelu={cfg.gelu!r} (written as hidden_act: only 'exact' is written)")
    if cfg.image_size[0] != cfg.image_size[1] or cfg.patch_size[0] != cfg.patch_size[1]:
        out.append(f"image_size={cfg.image_size}, patch_size={cfg.patch_size} (dinov3_vit holds square sizes)")
    return out


def to_canonical(cfg: ViTConfig, tensors: TensorMap) -> dict[str, Tensor]:
    """A ``dinov3_vit`` state (file or in-memory names) -> the canonical state of ``cfg``; the caller checks
    it against ``canonical_shapes``."""
    t = {re.sub(r"^model\.layer\.", "layer.", k): v for k, v in tensors.items() if k != "embeddings.mask_token"}
    out: dict[str, Tensor] = {"cls_token": t.pop("embeddings.cls_token")} if "embeddings.cls_token" in t else {}
    if cfg.reg_tokens and "embeddings.register_tokens" in t:
        out["reg_token"] = t.pop("embeddings.register_tokens")
    t.pop("embeddings.register_tokens", None)  # (1, 0, D) without registers
    for leaf in ("weight", "bias"):
        if f"embeddings.patch_embeddings.{leaf}" in t:
            out[f"patch_embed.proj.{leaf}"] = t.pop(f"embeddings.patch_embeddings.{leaf}")
    for i in range(cfg.depth):
        a, b = f"layer.{i}", f"blocks.{i}"
        qkv = [f"{a}.attention.{n}_proj" for n in "qkv"]
        if all(f"{p}.weight" in t for p in qkv):
            out[f"{b}.attn.qkv.weight"] = concat_rows([t.pop(f"{p}.weight") for p in qkv])
        if f"{a}.attention.k_proj.bias" in t and all(f"{p}.bias" in t for p in qkv):
            out[f"{b}.attn.qkv.bias"] = concat_rows([t.pop(f"{p}.bias") for p in qkv])
        for n in "qv":
            if f"{a}.attention.{n}_proj.bias" in t:
                out[f"{b}.attn.{n}_bias"] = t.pop(f"{a}.attention.{n}_proj.bias")
        gated = f"{a}.mlp.gate_proj.weight" in t
        for leaf in ("weight", "bias"):
            renames = {
                f"{a}.attention.o_proj.{leaf}": f"{b}.attn.proj.{leaf}",
                f"{a}.norm1.{leaf}": f"{b}.norm1.{leaf}",
                f"{a}.norm2.{leaf}": f"{b}.norm2.{leaf}",
                f"{a}.mlp.down_proj.{leaf}": f"{b}.mlp.fc2.{leaf}",
            }
            if gated and f"{a}.mlp.up_proj.{leaf}" in t:
                out[f"{b}.mlp.fc1.{leaf}"] = concat_rows(
                    [t.pop(f"{a}.mlp.gate_proj.{leaf}"), t.pop(f"{a}.mlp.up_proj.{leaf}")]
                )
            else:
                renames[f"{a}.mlp.up_proj.{leaf}"] = f"{b}.mlp.fc1.{leaf}"
            out |= {new: t.pop(old) for old, new in renames.items() if old in t}
        for j in (1, 2):
            if f"{a}.layer_scale{j}.lambda1" in t:
                out[f"{b}.ls{j}.gamma"] = t.pop(f"{a}.layer_scale{j}.lambda1")
    return out | t  # what is left is reported by the shape check


def from_canonical(cfg: ViTConfig, state: TensorMap) -> dict[str, Tensor]:
    """The canonical state of ``cfg`` (``cannot_hold`` empty) -> ``save_pretrained``'s tensor names."""
    d, f = cfg.width, cfg.mlp_dim
    dtype = dtype_of(state["cls_token"])
    out = {
        "embeddings.cls_token": state["cls_token"],
        "embeddings.mask_token": np.zeros((1, 1, d), dtype),
        "embeddings.register_tokens": state["reg_token"] if cfg.reg_tokens else np.zeros((1, 0, d), dtype),
        "embeddings.patch_embeddings.weight": state["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.bias": state["patch_embed.proj.bias"],
        "norm.weight": state["norm.weight"],
        "norm.bias": state["norm.bias"],
    }
    for i in range(cfg.depth):
        a, b = f"layer.{i}", f"blocks.{i}"
        w = state[f"{b}.attn.qkv.weight"]
        for j, n in enumerate("qkv"):
            out[f"{a}.attention.{n}_proj.weight"] = row_slice(w, j * d, (j + 1) * d)
            if f"{b}.attn.qkv.bias" in state:
                out[f"{a}.attention.{n}_proj.bias"] = row_slice(state[f"{b}.attn.qkv.bias"], j * d, (j + 1) * d)
            elif n != "k" and f"{b}.attn.{n}_bias" in state:
                out[f"{a}.attention.{n}_proj.bias"] = state[f"{b}.attn.{n}_bias"]
        for leaf in ("weight", "bias"):
            out[f"{a}.norm1.{leaf}"], out[f"{a}.norm2.{leaf}"] = state[f"{b}.norm1.{leaf}"], state[f"{b}.norm2.{leaf}"]
            if leaf == "weight" or cfg.proj_bias:
                out[f"{a}.attention.o_proj.{leaf}"] = state[f"{b}.attn.proj.{leaf}"]
            if leaf == "bias" and not cfg.mlp_bias:
                continue
            fc1 = state[f"{b}.mlp.fc1.{leaf}"]
            if cfg.mlp_type == "swiglu":
                out[f"{a}.mlp.gate_proj.{leaf}"] = row_slice(fc1, 0, f)
                out[f"{a}.mlp.up_proj.{leaf}"] = row_slice(fc1, f, 2 * f)
            else:
                out[f"{a}.mlp.up_proj.{leaf}"] = fc1
            out[f"{a}.mlp.down_proj.{leaf}"] = state[f"{b}.mlp.fc2.{leaf}"]
        for j in (1, 2):
            gamma = state.get(f"{b}.ls{j}.gamma")
            out[f"{a}.layer_scale{j}.lambda1"] = gamma if gamma is not None else np.ones((d,), dtype)
    return out


def config_json(cfg: ViTConfig) -> dict[str, Any]:
    """config.json of a ``DINOv3ViTModel`` holding ``cfg`` (``cannot_hold`` empty)."""
    (h, _), (ph, _) = cfg.image_size, cfg.patch_size
    return {
        "architectures": ["DINOv3ViTModel"],
        "model_type": MODEL_TYPE,
        "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "use_gated_mlp": cfg.mlp_type == "swiglu",
        "hidden_act": "silu" if cfg.mlp_type == "swiglu" else "gelu",
        "layer_norm_eps": cfg.ln_eps,
        "rope_theta": cfg.rope_temperature,
        "patch_size": ph,
        "image_size": h,
        "num_channels": cfg.in_chans,
        "query_bias": cfg.qkv_bias,
        "key_bias": cfg.qkv_bias and cfg.k_bias,
        "value_bias": cfg.qkv_bias,
        "proj_bias": cfg.proj_bias,
        "mlp_bias": cfg.mlp_bias,
        "num_register_tokens": cfg.reg_tokens,
        "layerscale_value": 1.0,
        "dtype": cfg.param_dtype,
    }


class HfDinov3(HuggingFace):
    """transformers ``dinov3_vit`` folders (``DINOv3ViTModel``): read, and written with HF ViT's folder
    layout, preprocessing and class names (``HuggingFace``'s ``write``, ``declared``, ``record_info``)."""

    name = "hf_dinov3"
    description = "Hugging Face transformers DINOv3 folder (model_type dinov3_vit)"
    signature = f"a folder whose config.json model_type is {MODEL_TYPE}"
    assumed_preprocess = Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bilinear", 1.0, "squash", rescale_before_resize=True)
    assumed_why = "no preprocessor_config.json; transformers DINOv3ViTImageProcessor defaults"

    def detect(self, src: Source) -> bool:
        return src.container == "hf_folder" and (src.config or {}).get("model_type") == MODEL_TYPE

    def read(self, src: Source, opts) -> Decoded:
        return read_dinov3(src.tensors, src.config, overrides=opts.overrides, context=src.context)

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        return cannot_hold(cfg)

    def encode(self, cfg: ViTConfig, state, path: Path, options: HfWriteOptions, assumed=()) -> Encoded:
        refuse("transformers dinov3_vit", self.cannot_hold(cfg))
        if options.model_type is not None:
            raise ValueError(f"model_type={options.model_type!r}: an hf_dinov3 folder is {MODEL_TYPE}")
        config = config_json(cfg) | ({ASSUMED_KEY: sorted(assumed)} if assumed else {})
        notes = ["embeddings.mask_token written as zeros (transformers' DINOv3 builds one; images never use it)"]
        if options.spelling != "v4":
            notes.append(f"{MODEL_TYPE} has one key spelling; written in it")
        return Encoded(cfg, state, from_canonical(cfg, state), config, None, notes, shard_size=options.shard_bytes)

    def decode(self, enc: Encoded) -> Decoded:
        return read_dinov3(enc.tensors, enc.config_json, context="hf_dinov3 read-back")

    def export_name(self, source=None) -> str:
        return "model_hf_dinov3"

    def load_call(self, path: Path, cfg: ViTConfig) -> str:
        return "\n".join(
            [
                "import transformers",
                f"model, info = transformers.DINOv3ViTModel.from_pretrained({str(path)!r}, output_loading_info=True)",
                "assert not any(info.values()), info  # no missing, unexpected or mismatched tensor",
            ]
        )


FORMAT = HfDinov3()
