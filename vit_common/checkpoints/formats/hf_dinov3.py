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
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.tensors import Tensor, TensorMap, concat_rows, dtype_of, row_slice
from vit_common.config import ViTConfig

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


def dinov3_config(config: Mapping[str, Any], context: str = "dinov3_vit") -> ViTConfig:
    """The ViTConfig of a ``dinov3_vit`` config.json (a missing key is transformers' default).

    Raises:
        FormatError: a bias-free output projection or MLP, a k bias without q/v biases, q and v biases
            that differ, or a gated MLP whose activation is not SiLU: each named.
    """
    c = {**DEFAULTS, **config}
    for key in ("proj_bias", "mlp_bias"):
        if not c[key]:
            raise FormatError(f"{context}: config.json {key}=False; the twins' projections have biases")
    if c["query_bias"] != c["value_bias"] or (c["key_bias"] and not c["query_bias"]):
        raise FormatError(
            f"{context}: config.json query_bias={c['query_bias']}, key_bias={c['key_bias']}, value_bias="
            f"{c['value_bias']}; the twins take q and v biases together, with or without a k bias"
        )
    act = c["hidden_act"]
    if c["use_gated_mlp"] and act != "silu" or not c["use_gated_mlp"] and act not in _GELU:
        raise FormatError(f"{context}: config.json hidden_act={act!r} with use_gated_mlp={c['use_gated_mlp']}")
    try:
        return ViTConfig(
            image_size=c["image_size"],
            patch_size=c["patch_size"],
            in_chans=c["num_channels"],
            num_classes=0,
            width=c["hidden_size"],
            depth=c["num_hidden_layers"],
            num_heads=c["num_attention_heads"],
            mlp_dim=c["intermediate_size"],
            mlp_type="swiglu" if c["use_gated_mlp"] else "plain",
            gelu=_GELU.get(act, "exact"),
            qkv_bias=bool(c["query_bias"]),
            k_bias=bool(c["key_bias"]) or not c["query_bias"],
            ln_eps=float(c["layer_norm_eps"]),
            pool="token",
            reg_tokens=c["num_register_tokens"],
            posemb="none",
            rope="dinov3",
            rope_temperature=float(c["rope_theta"]),
            rope_layout="half",
            layer_scale=1.0,
            dynamic_img_size=True,
        )
    except ValueError as e:
        raise FormatError(f"{context}: {e}") from e


def cannot_hold(cfg: ViTConfig) -> list[str]:
    """Why a ``dinov3_vit`` folder cannot hold ``cfg``'s function, one line per reason ([] if it can)."""
    want = dict(
        rope="dinov3",
        rope_layout="half",
        rope_normalize="separate",
        rope_grid_offset=0.0,
        rope_grid_indexing="ij",
        rope_periods="computed",
        class_token=True,
        posemb="none",
        norm_pre=False,
        patch_bias=True,
        final_norm=True,
        fc_norm=False,
        pool="token",
        num_classes=0,
        qk_norm=False,
        attn_inner_norm=False,
        mlp_inner_norm=False,
        dist_token=False,
        rep_size=0,
        norm="layernorm",
        patch_norm=False,
        proj_bias=True,
        mlp_bias=True,
    )
    out = [f"{k}={getattr(cfg, k)!r} (dinov3_vit has {v!r})" for k, v in want.items() if getattr(cfg, k) != v]
    if cfg.mlp_type == "plain" and cfg.gelu != "exact":
        out.append(f"gelu={cfg.gelu!r} (written as hidden_act: only 'exact' is written)")
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
            out[f"{a}.attention.o_proj.{leaf}"] = state[f"{b}.attn.proj.{leaf}"]
            out[f"{a}.norm1.{leaf}"], out[f"{a}.norm2.{leaf}"] = state[f"{b}.norm1.{leaf}"], state[f"{b}.norm2.{leaf}"]
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
    h, w = cfg.image_size
    ph, pw = cfg.patch_size
    if h != w or ph != pw:
        raise FormatError(
            f"dinov3_vit writes square sizes; got image_size={cfg.image_size}, patch_size={cfg.patch_size}"
        )
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
        "num_register_tokens": cfg.reg_tokens,
        "layerscale_value": 1.0,
    }
