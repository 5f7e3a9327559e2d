"""LoRA in both twins: flax's adapters (``vit_jax.lora``) and peft's (``vit_torch.lora``) from the same draws
take the same K steps (float64, the tolerance table's "train" row), the frozen base weights bit for bit as
loaded in both twins; ``vit train-parity --lora`` reports it."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest
from flax import nnx

from vit_common.data.augment import Augment
from vit_common.tolerance import tolerance
from vit_common.training.train_config import TrainConfig
from vit_compare.training import compare_training, format_table

# adapters on qkv and fc2 with alpha / r = 3 and layer-wise decay (the EMA and the clip are the full-training
# tests' own: LoRA changes which tensors they see, not how)
LORA = TrainConfig(
    batch_size=8, epochs=2, warmup_steps=0, lr=3e-2, layer_decay=0.7, augment=Augment(),
    init="weights", lora=2, lora_alpha=6.0, lora_targets="qkv,fc2",
)  # fmt: skip


@pytest.mark.slow
def test_lora_steps_of_both_twins_agree_and_the_base_weights_stay(x64, tiny_cfg, tiny_dataset):
    """2 steps of a 1-block float64 model from seeded weights: parameters (adapters and head) and both Adam
    moments within 1e-10 of each other; every frozen tensor bit for bit the
    start's in both twins; the torch twin started from flax's draws of A (He-uniform) and B = 0."""
    from vit_jax.model import VisionTransformer
    from vit_jax.trainer import Trainer
    from vit_jax.weights import to_numpy

    cfg = tiny_cfg.replace(in_chans=1, dtype="float64", param_dtype="float64")
    weights = to_numpy(VisionTransformer(cfg, rngs=nnx.Rngs(3)))
    data = tiny_dataset()
    result = compare_training(cfg, LORA, data, 2, weights=weights)
    assert result.ok, format_table(result)
    assert result.bound == tolerance("train", "float64") and result.frozen == []
    for r in result.rows:
        assert max(r.params, r.mu, r.nu) <= 1e-10 and r.update <= tolerance("train_update", "float64")[1]
    assert {r.params_worst.rsplit(".", 1)[-1] for r in result.rows} <= {"lora_a", "lora_b", "weight", "bias"}
    assert "frozen base weights: bit for bit as at step 0 in both twins" in format_table(result)
    t = Trainer(cfg, LORA, data, weights=weights)  # the draws the torch twin took: flax's, B zero
    start = t.weights(t.init_state(), merged=False)
    adapters = sorted(k for k in start if k.endswith((".lora_a", ".lora_b")))
    assert adapters == [f"blocks.0.{m}.lora.lora_{x}" for m in ("attn.qkv", "mlp.fc2") for x in "ab"]
    a = start["blocks.0.attn.qkv.lora.lora_a"]
    assert a.shape == (16, 2) and 0 < np.abs(a).max() <= np.sqrt(6 / 16)  # He-uniform: |A| <= sqrt(6 / fan_in)
    assert not np.abs(start["blocks.0.attn.qkv.lora.lora_b"]).any()


@pytest.mark.slow
def test_bf16_lora_steps_of_both_twins_stay_near_a_float64_run(x64, tiny_cfg, tiny_dataset):
    """bfloat16 compute (float32 parameters), 3 steps at lr 1e-2 (the tolerance row's measurement): both
    twins within the "train_vs_float64" row of a float64 run of the torch twin from the same draws
    (flax computes the adapters in bfloat16, peft in their float32; measured 3.2e-3 and 3.3e-3 after 3
    steps), the frozen weights bit for bit as loaded."""
    from vit_jax.model import VisionTransformer
    from vit_jax.weights import to_numpy

    cfg = tiny_cfg.replace(in_chans=1, dtype="bfloat16")
    weights = to_numpy(VisionTransformer(cfg, rngs=nnx.Rngs(3)))
    result = compare_training(cfg, dataclasses.replace(LORA, lr=1e-2), tiny_dataset(), 3, weights=weights)
    assert result.ok and result.frozen == [], format_table(result)
    assert result.bound == tolerance("train_vs_float64", "bfloat16")
    assert all(max(r.ref) <= result.bound[1] for r in result.rows)


def test_the_torch_twin_alone_takes_peft_adapters_with_canonical_names(tiny_cfg, tiny_dataset):
    """Without given adapters the torch twin draws peft's (B zero); its state and moments carry the JAX
    twin's names and layouts; only the adapters and the head hold moments."""
    import torch

    from vit_torch.model import VisionTransformer
    from vit_torch.train import Trainer
    from vit_torch.weights import to_numpy

    cfg = tiny_cfg.replace(in_chans=1)
    torch.manual_seed(0)
    weights = to_numpy(VisionTransformer(cfg))
    t = Trainer(cfg, LORA, tiny_dataset(), weights=weights)
    state = t.weights()
    assert state["blocks.0.attn.qkv.lora.lora_a"].shape == (16, 2) and state["blocks.0.mlp.fc2.lora.lora_b"].shape == (
        2,
        16,
    )
    assert not state["blocks.0.attn.qkv.lora.lora_b"].any()
    assert set(weights) == {k for k in state if ".lora." not in k}
    rng = np.random.default_rng(0)
    label = np.arange(8, dtype=np.int32) % 3
    image = rng.standard_normal((8, 8, 8, 1)).astype(np.float32)
    t.train_step(
        {"image": image, "label": label, "target": np.eye(3, dtype=np.float32)[label], "mask": np.ones(8, np.float32)}
    )
    moments = t.adam_state()["mu"]
    assert sorted(moments) == sorted(
        [f"blocks.0.{m}.lora.lora_{x}" for m in ("attn.qkv", "mlp.fc2") for x in "ab"] + ["head.bias", "head.weight"]
    )
    assert moments["blocks.0.attn.qkv.lora.lora_b"].shape == (2, 48)
    after = t.weights()
    assert all(np.array_equal(after[k], weights[k]) for k in weights if not k.startswith("head."))


@pytest.mark.slow
def test_train_parity_lora_command_reports_the_frozen_weights(tmp_path, tiny_cfg, random_state, capsys):
    """`vit train-parity --init FILE --lora 2`: exit 0, the verdict and the frozen-weights line; the JSON
    report names the LoRA settings of both twins."""
    from vit_cli.main import main
    from vit_common.checkpoints.convert import save_checkpoint

    save_checkpoint(tmp_path / "src.safetensors", tiny_cfg, random_state(tiny_cfg), "timm")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (12, 8, 8, 3), np.uint8), y=np.arange(12) % 2)
    argv = ["train-parity", "--steps", "2", "--dataset", f"npz:{tmp_path / 'd.npz'}", "--init"]
    argv += [str(tmp_path / "src.safetensors"), "--batch-size", "4", "--warmup-steps", "0", "--lora", "2"]
    assert main([*argv, "--lora-alpha", "4", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "frozen base weights: bit for bit as at step 0 in both twins" in out and "verdict: ok" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] and report["frozen_changed"] == []
    lora = {"lora": 2, "lora_alpha": 4.0, "lora_dropout": 0.0, "lora_targets": "qkv,proj,fc1,fc2"}
    assert report["compared"]["optimizer"]["torch"]["lora"] == lora == report["compared"]["optimizer"]["jax"]["lora"]


@pytest.mark.slow
def test_the_peft_adapter_folder_loads_onto_transformers_with_the_jax_models_outputs(tmp_path, tiny_cfg, random_state):
    """`vit train --init HF_FOLDER --lora 2 --export-adapter v5`: RUN/adapter_peft, loaded by peft onto the
    transformers model of the source folder (``PeftModel.from_pretrained``), gives the JAX model's logits
    within the float32 row; q, k and v share A and split B by rows; the source's weights are its base."""
    import jax.numpy as jnp
    import torch
    import transformers
    from peft import PeftModel
    from safetensors.numpy import load_file

    from vit_cli.main import main
    from vit_common.checkpoints.convert import save_checkpoint
    from vit_common.tolerance import compare
    from vit_jax.pretrained import load_model

    cfg = tiny_cfg.replace(num_classes=2)
    save_checkpoint(tmp_path / "src", cfg, random_state(cfg, scale=0.3), "hf")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (8, 8, 8, 3), np.uint8), y=np.arange(8) % 2)
    out = tmp_path / "run"
    argv = ["train", "--init", str(tmp_path / "src"), "--dataset", f"npz:{tmp_path / 'd.npz'}", "--out", str(out)]
    argv += ["--batch-size", "4", "--epochs", "1", "--lr", "0.05", "--no-progress", "--no-parity"]
    argv += ["--compile-cache", "off", "--lora", "2", "--lora-alpha", "6", "--export-adapter", "v5"]
    assert main(argv) == 0
    adapter = out / "adapter_peft"
    files = sorted(p.name for p in adapter.iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors", "vit_twins.json"]
    tensors = load_file(adapter / "adapter_model.safetensors")
    q, k = (f"base_model.model.vit.layers.0.attention.{n}_proj" for n in "qk")
    assert np.array_equal(tensors[f"{q}.lora_A.weight"], tensors[f"{k}.lora_A.weight"])
    assert tensors[f"{q}.lora_B.weight"].shape == (16, 2) and tensors["base_model.model.classifier.weight"].shape == (
        2,
        16,
    )
    images = rng.standard_normal((3, 8, 8, 3)).astype(np.float32)
    jax_model = load_model(out / "model.safetensors")  # the adapters merged: the adapted function
    expected = np.asarray(jax_model(jnp.asarray(images)))
    base = transformers.ViTForImageClassification.from_pretrained(tmp_path / "src")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="peft")  # peft reads every setting as its own
        peft_model = PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        logits = peft_model(pixel_values=torch.from_numpy(images).permute(0, 3, 1, 2)).logits.numpy()
    c = compare("logits", logits, expected, "tensor", "float32")
    assert c.ok, c
    plain = transformers.ViTForImageClassification.from_pretrained(tmp_path / "src").eval()  # peft wrapped base
    with torch.no_grad():  # without the adapters and the trained head the logits are elsewhere
        before = plain(pixel_values=torch.from_numpy(images).permute(0, 3, 1, 2)).logits.numpy()
    assert np.abs(before - expected).max() > 10 * c.max_abs
