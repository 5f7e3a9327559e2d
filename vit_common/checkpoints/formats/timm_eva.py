"""timm ``Eva`` state dicts (EVA-02, DINOv3, Perception Encoder, RoPE-ViT; ``timm/models/eva.py``) <->
the canonical state, by rules on the key names (numpy only).

An Eva file spells some canonical tensors its own way; ``EvaLayout`` records which spelling a file uses
so that a write reproduces it:

- LayerScale ``blocks.{i}.gamma_1`` / ``gamma_2`` [D] -> ``ls1.gamma`` / ``ls2.gamma``;
- attention ``qkv`` fused (``qkv.weight`` [3D, D], with ``q_bias``/``v_bias`` [D] (``EvaAttention``) or
  ``qkv.bias`` [3D] (``AttentionRope``)) or split (``q_proj``, ``k_proj``, ``v_proj``; EvaAttention has
  no ``k_proj.bias``) -> ``attn.qkv.weight`` rows [q; k; v] and ``attn.qkv.bias`` or ``attn.q_bias`` /
  ``attn.v_bias``;
- gated MLP packed (``GluMlp``: ``fc1`` [2F, D], gate rows first) or split (``SwiGLU``: ``fc1_g``,
  ``fc1_x`` [F, D]) -> ``mlp.fc1`` [2F, D] packed, gate first.

Every other key (``attn.norm``, ``mlp.norm``, ``rope.freqs``, ``attn_pool.*``...) is canonical as it is.
timm keeps its RoPE periods, bands and tables in non-persistent buffers: an Eva file holds no RoPE
tensor but ``rope.freqs`` (``mixed``); the RoPE settings come from the architecture. Gathered and split
tensors are ``LazyTensor``s over the file's (``vit_common.checkpoints.formats.tensors``): nothing loads
until a writer or a twin asks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from vit_common.checkpoints.formats.tensors import Tensor, TensorMap, concat_rows, row_slice
from vit_common.config import ViTConfig


@dataclass(frozen=True)
class EvaLayout:
    """How an Eva file spells attention and the gated MLP: ``qkv`` 'fused' | 'split', ``mlp`` 'packed' |
    'split' (a plain MLP is 'packed': its fc1 is canonical)."""

    qkv: str = "fused"
    mlp: str = "packed"


def layout_of(state: Mapping[str, object]) -> EvaLayout:
    """The layout of an Eva state dict, from its block 0 keys."""
    return EvaLayout(
        qkv="split" if "blocks.0.attn.q_proj.weight" in state else "fused",
        mlp="split" if "blocks.0.mlp.fc1_g.weight" in state else "packed",
    )


def default_layout(cfg: ViTConfig) -> EvaLayout:
    """timm's own layout for a config written without a source layout: SwiGLU with an inner norm is timm's
    split ``SwiGLU`` (``scale_mlp``), everything else fused and packed."""
    return EvaLayout(mlp="split" if cfg.mlp_type == "swiglu" and cfg.mlp_inner_norm else "packed")


_LS = re.compile(r"^(blocks\.\d+)\.gamma_([12])$")


def _partner(key: str) -> str | None:
    """For a split q/k/v or SwiGLU key, the key that gathers its group (``q_proj.weight``, ``fc1_g``)."""
    if m := re.match(r"^(.*\.attn)\.[kv]_proj\.(weight|bias)$", key):
        return f"{m[1]}.q_proj.weight"
    if m := re.match(r"^(.*\.mlp)\.fc1_x\.(weight|bias)$", key):
        return f"{m[1]}.fc1_g.{m[2]}"
    if m := re.match(r"^(.*\.attn)\.q_proj\.bias$", key):
        return f"{m[1]}.q_proj.weight"
    return None


def eva_to_canonical(state: TensorMap) -> dict[str, Tensor]:
    """An Eva state dict -> canonical names and layouts. A key of a split group whose gathering key is
    absent stays as it is, for the caller's check against ``canonical_shapes`` to report."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if (p := _partner(key)) is not None and p in state:
            continue  # gathered with its group below
        if m := _LS.match(key):
            out[f"{m[1]}.ls{m[2]}.gamma"] = value
        elif key.endswith(".attn.q_proj.weight"):
            b = key[: -len(".q_proj.weight")]
            out[f"{b}.qkv.weight"] = concat_rows([state[f"{b}.{n}_proj.weight"] for n in "qkv"])
            if f"{b}.k_proj.bias" in state:  # AttentionRope: three biases
                out[f"{b}.qkv.bias"] = concat_rows([state[f"{b}.{n}_proj.bias"] for n in "qkv"])
            elif f"{b}.q_proj.bias" in state:  # EvaAttention: no key bias
                out[f"{b}.q_bias"], out[f"{b}.v_bias"] = state[f"{b}.q_proj.bias"], state[f"{b}.v_proj.bias"]
        elif (m := re.match(r"^(.*\.mlp)\.fc1_g\.(weight|bias)$", key)) and f"{m[1]}.fc1_x.{m[2]}" in state:
            out[f"{m[1]}.fc1.{m[2]}"] = concat_rows([value, state[f"{m[1]}.fc1_x.{m[2]}"]])  # gate rows first
        else:
            out[key] = value
    return out


def canonical_to_eva(cfg: ViTConfig, state: TensorMap, layout: EvaLayout) -> dict[str, Tensor]:
    """The canonical state -> an Eva state dict in ``layout`` (the inverse of ``eva_to_canonical``)."""
    d, f = cfg.width, cfg.mlp_dim
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        m = re.match(r"^(blocks\.\d+)\.ls([12])\.gamma$", key)
        b, _, leaf = key.rpartition(".")
        if m:
            out[f"{m[1]}.gamma_{m[2]}"] = value
        elif layout.qkv == "split" and b.endswith(".attn.qkv"):
            a = b[: -len(".qkv")]
            for i, n in enumerate("qkv"):
                out[f"{a}.{n}_proj.{leaf}"] = row_slice(value, i * d, (i + 1) * d)
        elif layout.qkv == "split" and key.endswith((".attn.q_bias", ".attn.v_bias")):
            out[f"{b}.{leaf[0]}_proj.bias"] = value
        elif layout.mlp == "split" and cfg.mlp_type == "swiglu" and re.match(r"^blocks\.\d+\.mlp\.fc1$", b):
            out[f"{b}_g.{leaf}"] = row_slice(value, 0, f)
            out[f"{b}_x.{leaf}"] = row_slice(value, f, 2 * f)
        else:
            out[key] = value
    return out
