"""PEFT adapter folders (``vit_common.checkpoints.adapter``): the transformers model's module names per
family and spelling, a fused qkv adapter split exactly by rows (A shared, B's rows), the head as peft's
``modules_to_save``, and what cannot be written refused."""

from __future__ import annotations

import numpy as np
import pytest

from vit_common.checkpoints.adapter import peft_adapter, transformers_rules

P = "base_model.model."


def _adapted(cfg, random_state, layers: tuple[str, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    state = random_state(cfg)
    for layer in layers:
        d_out, d_in = state[f"{layer}.weight"].shape
        state[f"{layer}.lora.lora_a"] = rng.standard_normal((d_in, 2)).astype(np.float32)
        state[f"{layer}.lora.lora_b"] = rng.standard_normal((2, d_out)).astype(np.float32)
    return state


V4 = ("vit.encoder.layer.0.attention.attention.query", "vit.encoder.layer.0.attention.output.dense")


@pytest.mark.parametrize(
    "spelling, q, proj", [("v5", "vit.layers.0.attention.q_proj", "vit.layers.0.attention.o_proj"), ("v4", *V4)]
)
def test_a_vit_adapter_splits_qkv_by_rows_under_the_transformers_names(tiny_cfg, random_state, spelling, q, proj):
    state = _adapted(tiny_cfg, random_state, ("blocks.0.attn.qkv", "blocks.0.attn.proj"))
    model_type, rules = transformers_rules(tiny_cfg, "timm", spelling)
    config, tensors = peft_adapter(state, rules, rank=2, alpha=6.0)
    assert model_type == "vit" and config["r"] == 2 and config["lora_alpha"] == 6.0
    assert config["target_modules"][0] == proj and q in config["target_modules"]
    assert config["modules_to_save"] == ["classifier"]
    a, b = state["blocks.0.attn.qkv.lora.lora_a"], state["blocks.0.attn.qkv.lora.lora_b"]  # (16, 2), (2, 48)
    names = [
        q,
        q.replace("q_proj", "k_proj").replace("query", "key"),
        q.replace("q_proj", "v_proj").replace("query", "value"),
    ]
    for i, module in enumerate(names):
        np.testing.assert_array_equal(tensors[f"{P}{module}.lora_A.weight"], a.T)
        np.testing.assert_array_equal(tensors[f"{P}{module}.lora_B.weight"], b.T[16 * i : 16 * (i + 1)])
    # the rows put back together are the fused layer's update, exactly
    delta = np.concatenate([tensors[f"{P}{m}.lora_B.weight"] @ tensors[f"{P}{m}.lora_A.weight"] for m in names])
    np.testing.assert_array_equal(delta, b.T @ a.T)
    np.testing.assert_array_equal(tensors[P + "classifier.weight"], state["head.weight"])


def test_a_siglip_adapter_takes_siglips_names_and_refuses_its_attention_pool(tiny_cfg, random_state):
    cfg = tiny_cfg.replace(class_token=False, pool="map", num_classes=0)
    model_type, rules = transformers_rules(cfg, "hf_family", "v5", "siglip_vision_model")
    config, tensors = peft_adapter(
        _adapted(cfg, random_state, ("blocks.0.attn.qkv", "attn_pool.mlp.fc1")), rules, rank=2, alpha=2
    )
    assert model_type == "siglip_vision_model" and config["modules_to_save"] is None
    assert sorted(config["target_modules"]) == sorted(
        ["head.mlp.fc1", *(f"encoder.layers.0.self_attn.{n}_proj" for n in "qkv")]
    )
    with pytest.raises(ValueError, match="attn_pool.proj: transformers computes it inside nn.MultiheadAttention"):
        peft_adapter(_adapted(cfg, random_state, ("attn_pool.proj",)), rules, rank=2, alpha=2)
    with pytest.raises(ValueError, match="no LoRA adapters in the state"):
        peft_adapter(random_state(cfg), rules, rank=2, alpha=2)
