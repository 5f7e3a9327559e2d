"""LoRA fine-tuning of the JAX twin (``vit_jax.lora``, ``TrainConfig.lora``): flax's adapters on the
target layers, only they and the head trained, the base weights bit for bit as loaded, the exports the
adapters merged into plain weights, a run resumable, and bad input refused before anything is written."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vit_cli.main import main
from vit_common.checkpoints import adapter
from vit_common.checkpoints.adapter import installed_transformers, spelling_warning
from vit_common.data.augment import Augment
from vit_common.tolerance import compare
from vit_common.training.train_config import TrainConfig
from vit_jax.lora import ADAPTER_LEAVES, add_lora, merge_lora
from vit_jax.model import VisionTransformer
from vit_jax.trainer import Trainer
from vit_jax.weights import from_numpy, to_numpy

LORA = TrainConfig(  # with adapter dropout, and layer-wise decay and an EMA as any fine-tuning takes them
    batch_size=8,
    epochs=3,
    augment=Augment(),
    init="ckpt",
    lora=2,
    lora_alpha=6.0,
    lora_dropout=0.25,
    warmup_steps=0,
    lr=3e-2,
    layer_decay=0.7,
    ema=0.6,
)
ADAPTED = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


@pytest.fixture(scope="module")
def trained(tiny_cfg, tiny_dataset):
    """(trainer, the loaded weights, the state after 3 LoRA steps) of a 1-block model."""
    cfg = tiny_cfg.replace(in_chans=1)
    weights = to_numpy(VisionTransformer(cfg, rngs=nnx.Rngs(7)))
    t = Trainer(cfg, LORA, tiny_dataset(6, 7), weights=weights)
    state = t.init_state()
    batch = next(iter(t.train_iterator()))
    for _ in range(3):
        state, _ = t.train_step(state, batch)
    return t, weights, state


def _named(tree) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(tree)}


@pytest.mark.slow
def test_only_adapters_and_head_train_and_base_weights_stay_bit_identical(trained):
    t, weights, state = trained
    params = _named(state["params"])
    adapters = sorted(k for k in params if k.rsplit(".", 1)[-1] in ADAPTER_LEAVES)
    assert adapters == sorted(f"blocks.{i}.{m}.lora.{n}" for i in range(1) for m in ADAPTED for n in ADAPTER_LEAVES)
    unmerged = to_numpy(nnx.merge(t.eval_graphdef, state["params"], state["rest"]))
    for name, w in weights.items():  # every base tensor as loaded, bit for bit; the head moved
        assert np.array_equal(unmerged[name], w) != name.startswith("head."), name
    assert all(np.abs(params[k]).max() > 0 for k in adapters)  # lora_b starts at zero: it moved
    streams = [".".join(map(str, p)) for p, _ in nnx.to_flat_state(state["rest"])]
    assert sum(".lora_dropout." in s for s in streams) == 4 * 2, streams  # each adapter's stream: key, count
    # the optimizer holds moments of the trainable tensors only: adapters and head, mu and nu
    trainable = sum(params[k].size for k in params if k in adapters or k.startswith("head."))
    moments = [x for x in jax.tree.leaves(state["opt_state"]) if np.ndim(x) > 0]
    assert sum(np.size(x) for x in moments) == 2 * trainable


@pytest.mark.slow
def test_the_merged_export_is_the_adapted_forward(trained):
    """W + (alpha / r) (A B)^T in plain weights gives the adapted model's logits within the float32 row."""
    t, weights, state = trained
    merged = t.weights(state)
    assert merged.keys() == weights.keys()
    for name in weights:  # the adapted layers' weights (alpha / r = 3) and the head changed, nothing else
        moved = name.endswith(ADAPTED_WEIGHTS) or name.startswith("head.")
        assert np.array_equal(merged[name], weights[name]) != moved, name
    images = jnp.asarray(np.random.default_rng(0).standard_normal((4, 8, 8, 1)), jnp.float32)
    adapted = nnx.merge(t.eval_graphdef, state["params"], state["rest"])(images)
    plain = from_numpy(t.cfg, merged)(images)
    c = compare("logits", plain, adapted, "tensor", "float32")
    assert c.ok, c
    assert np.abs(np.asarray(adapted) - np.asarray(from_numpy(t.cfg, weights)(images))).max() > 10 * c.max_abs
    ema = t.weights(state, ema=True)  # the moving average of the adapters, merged the same way
    assert ema.keys() == weights.keys()
    assert not np.array_equal(ema["blocks.0.attn.qkv.weight"], merged["blocks.0.attn.qkv.weight"])
    assert all(np.array_equal(ema[k], weights[k]) for k in weights if not k.endswith(ADAPTED_WEIGHTS + HEAD))


ADAPTED_WEIGHTS = tuple(f"{m}.weight" for m in ADAPTED)
HEAD = ("head.weight", "head.bias")


def test_merge_lora_is_w_plus_scaled_ab_transposed():
    rng = np.random.default_rng(0)
    w, a, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 2)), rng.standard_normal((2, 5))
    state = {"l.weight": w.astype(np.float32), "l.lora.lora_a": a, "l.lora.lora_b": b, "l.bias": np.ones(5)}
    out = merge_lora(state, 1.5)
    assert list(out) == ["l.weight", "l.bias"] and out["l.weight"].dtype == np.float32
    np.testing.assert_array_equal(out["l.weight"], (w.astype(np.float32) + 1.5 * (a @ b).T).astype(np.float32))


@pytest.mark.slow
def test_targets_are_canonical_module_names(tiny_cfg):
    model = VisionTransformer(tiny_cfg.replace(depth=2), rngs=nnx.Rngs(0))
    assert add_lora(model, dataclasses.replace(LORA, lora_targets="qkv,blocks.1.mlp.fc2"), nnx.Rngs(0)) == [
        "blocks.0.attn.qkv",
        "blocks.1.attn.qkv",
        "blocks.1.mlp.fc2",
    ]
    model = VisionTransformer(tiny_cfg, rngs=nnx.Rngs(0))
    with pytest.raises(
        ValueError, match="lora_targets='qkv,query,head': no linear layer of the model matches query, head"
    ):
        add_lora(model, dataclasses.replace(LORA, lora_targets="qkv,query,head"), nnx.Rngs(0))
    with pytest.raises(ValueError, match="lora=17: expected a rank from 1 to the model's width 16"):
        add_lora(model, dataclasses.replace(LORA, lora=17), nnx.Rngs(0))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(lora=2), "lora=2: expected --init too"),
        (dict(lora=2, init="x", freeze=True), "lora=2: expected no --freeze"),
        (dict(lora=2, init="x", init_optimizer=True), "lora=2: expected no --init-optimizer"),
        (dict(init="x", lora_alpha=4.0), "lora=None: expected a rank"),
        (dict(lora=0, init="x"), "lora=0"),
        (dict(lora=2, init="x", lora_targets="qkv,"), "lora_targets='qkv,': expected comma-separated"),
    ],
)
def test_train_config_refuses_lora_without_what_it_needs(fields, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**fields)


@pytest.fixture
def lora_run(tmp_path, random_state, tiny_cfg):
    """(the arguments of a LoRA fine-tuning of a timm file on 16 RGB 8x8 images, its run folder, the file)."""
    from vit_common.checkpoints.convert import save_checkpoint

    save_checkpoint(tmp_path / "src.safetensors", tiny_cfg, random_state(tiny_cfg), "timm")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (16, 8, 8, 3), np.uint8), y=np.arange(16) % 2)
    out = tmp_path / "run"
    args = [
        *["train", "--init", str(tmp_path / "src.safetensors"), "--dataset", f"npz:{tmp_path / 'd.npz'}"],
        *["--out", str(out), "--batch-size", "4", "--no-progress", "--no-parity", "--compile-cache", "off"],
    ]
    return args, out, tmp_path / "src.safetensors"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--lora", "0"], "argument --lora"),
        (["--lora", "17"], "lora=17: expected a rank from 1 to the model's width 16"),
        (["--lora", "2", "--lora-targets", "query"], "no linear layer of the model matches query"),
        (["--lora", "2", "--freeze"], "lora=2: expected no --freeze"),
        (["--export-adapter", "v5"], "--export-adapter v5: expected --lora RANK too"),
        (["--lora", "2", "--export-adapter", "v6"], "argument --export-adapter: invalid choice"),
    ],
)
def test_bad_lora_input_exits_2_with_one_line_writing_nothing(lora_run, capsys, extra, message):
    args, out, _ = lora_run
    try:
        code = main([*args, "--epochs", "1", *extra])
    except SystemExit as e:  # argparse's refusal of a flag's value
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("vit train: error: ") and message in err[-1], err[-1]
    assert not any("fine-tuning" in line for line in err)  # refused before the checkpoint's report
    assert not out.exists()


@pytest.mark.slow
def test_a_lora_run_resumes_and_exports_plain_weights(lora_run, capsys):
    """One epoch with checkpoints, then --resume to two: the exports are plain timm tensors, the layers
    without adapters (norms, embeddings) bit for bit the source's; the summary names the adapter folder,
    and a v4 folder written where transformers 5 is installed is warned of."""
    from safetensors.numpy import load_file

    args, out, src = lora_run
    args = [*args, "--lora", "2", "--lora-targets", "qkv,fc2", "--lora-dropout", "0.1"]
    args += ["--ckpt-every", "1", "--lr", "0.05", "--export-adapter", "v4"]
    assert main([*args, "--epochs", "1"]) == 0  # 12 training images in batches of 4: 3 steps
    printed = capsys.readouterr()
    # adapters: qkv 16 x 2 + 2 x 48, fc2 32 x 2 + 2 x 16; the 2-class head 16 x 2 + 2
    assert "LoRA rank 2 on qkv,fc2: 258 of 3,394 parameters trained" in printed.err
    assert f"PEFT adapter folder: {out / 'adapter_peft'}\n" in printed.out
    warned = "vit train: warning: --export-adapter v4: the installed transformers" in printed.err
    assert warned == (int((installed_transformers() or "4").split(".")[0]) >= 5)
    assert main([*args, "--epochs", "2", "--resume", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["start"], summary["steps"]) == (3, 6)
    source, back = load_file(src), load_file(out / "model_timm.safetensors")
    assert back.keys() == source.keys()
    changed = sorted(k for k in source if not np.array_equal(back[k], source[k]))
    assert changed == ["blocks.0.attn.qkv.weight", "blocks.0.mlp.fc2.weight", "head.bias", "head.weight"]


@pytest.mark.parametrize(
    "installed, spelling, warns",
    [("5.24.0", "v4", "the installed transformers 5.24.0 names this model's modules in its v5 spelling"),
     ("4.57.1", "v5", "where transformers 5 or later is installed, or pass --export-adapter v4"),
     ("5.0.0", "v5", None), ("4.57.1", "v4", None), (None, "v4", None)],
)  # fmt: skip
def test_an_adapter_the_installed_transformers_cannot_load_is_warned_of(
    tiny_cfg, monkeypatch, installed, spelling, warns
):
    """peft with transformers 5 finds no module of a v4 folder (NoMatchingPeftModuleError) and with 4 none
    of a v5 folder: the run says so in one line."""
    monkeypatch.setattr(adapter, "installed_transformers", lambda: installed)
    warning = spelling_warning(tiny_cfg, "timm", spelling)
    assert warning is None if warns is None else warns in warning and "NoMatchingPeftModuleError" in warning
