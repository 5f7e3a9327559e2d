"""What the two Hugging Face transformers formats share (``hf``: ViT and DeiT; ``hf_family``: SigLIP,
CLIP, DINOv2, ViT-MAE, ViT-MSN, I-JEPA): the table of block key spellings, the ``hidden_act`` names, the
model types the hf_family format reads and config.json's image and patch sizes. A helper module of those
formats; it holds no ``FORMAT``.
"""

from __future__ import annotations

from typing import Any

from vit_common.checkpoints.formats.errors import FormatError

ACT_TO_GELU = {
    "gelu": "exact",
    "gelu_python": "exact",
    "gelu_pytorch_tanh": "tanh",
    "gelu_new": "tanh",
    "quick_gelu": "quick",
}
GELU_TO_ACT = {"exact": "gelu", "tanh": "gelu_pytorch_tanh", "quick": "quick_gelu"}
# The one table of block key spellings of the HF ViT-family model types (the hf format's ViT and DeiT, and
# hf_families'): style -> spelling -> (layer prefix, norm1, q, k, v, o, norm2, fc1, fc2). 'vit' is
# ViT, DeiT, ViT-MAE, ViT-MSN and I-JEPA; 'dinov2' both DINOv2 types; 'clip' SigLIP and CLIP and 'aimv2'
# both AIMv2 types (one spelling each). v4 is what save_pretrained writes, v5 the transformers 5 module
# names, as transformers' conversion_mapping.py renames them (ViTModel, Dinov2Model, ViTMAEForPreTraining
# entries).
BLOCK_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "vit": {
        "v4": (
            "encoder.layer.{i}.",
            "layernorm_before",
            "attention.attention.query",
            "attention.attention.key",
            "attention.attention.value",
            "attention.output.dense",
            "layernorm_after",
            "intermediate.dense",
            "output.dense",
        ),
        "v5": (
            "layers.{i}.",
            "layernorm_before",
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.o_proj",
            "layernorm_after",
            "mlp.fc1",
            "mlp.fc2",
        ),
    },
    "dinov2": {
        "v4": (
            "encoder.layer.{i}.",
            "norm1",
            "attention.attention.query",
            "attention.attention.key",
            "attention.attention.value",
            "attention.output.dense",
            "norm2",
            "mlp.fc1",
            "mlp.fc2",
        ),
        "v5": (
            "encoder.layer.{i}.",
            "norm1",
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.o_proj",
            "norm2",
            "mlp.fc1",
            "mlp.fc2",
        ),
    },
    "clip": {
        "v4": (
            "encoder.layers.{i}.",
            "layer_norm1",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.out_proj",
            "layer_norm2",
            "mlp.fc1",
            "mlp.fc2",
        ),
    },
    "aimv2": {  # AIMv2: fc1 is gate_proj then up_proj (hf_families.aimv2 holds its rules)
        "v4": (
            "encoder.layers.{i}.",
            "rms_norm1",
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.out_proj",
            "rms_norm2",
            "ffn.gate_proj",
            "ffn.down_proj",
        ),
    },
    "radio": {  # RADIO: NVIDIA's timm-style names, qkv fused (hf_families.radio holds its rules)
        "v4": (
            "model.blocks.{i}.",
            "norm1",
            "attn.qkv",
            "attn.qkv",
            "attn.qkv",
            "attn.proj",
            "norm2",
            "mlp.fc1",
            "mlp.fc2",
        ),
    },
}
# Model types the hf_family format reads (``hf_families.FAMILIES``, which imports this module), for the hf
# format's refusal and its write options.
FAMILY_MODEL_TYPES = (
    "aimv2_vision_model",
    "aimv2",
    "siglip_vision_model",
    "siglip",
    "siglip2_vision_model",
    "siglip2",
    "clip_vision_model",
    "clip",
    "dinov2",
    "dinov2_with_registers",
    "vit_mae",
    "vit_msn",
    "ijepa",
    "radio",
)


def size_pair(v: Any, name: str, context: str) -> tuple[int, int]:
    """(H, W) of a config.json size ``v`` (an int or [H, W]) named ``name``.

    Raises:
        FormatError: ``v`` is not a positive int or a pair of them.
    """
    pair = [v, v] if not isinstance(v, (list, tuple)) else list(v)
    if len(pair) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in pair):
        return pair[0], pair[1]
    raise FormatError(f"{context}: config.json {name}={v!r} is not a positive int or [H, W]")
