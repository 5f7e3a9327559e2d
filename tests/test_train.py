"""The training loop of the JAX twin: compile-once steps, exact masking, accumulation, remat, bf16
with large inputs, orbax round trips with dropout RNG state."""

from __future__ import annotations

import dataclasses
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vit_common.config import ViTConfig
from vit_common.data.augment import Augment
from vit_common.data.datasets import ArraySource, Dataset
from vit_common.tolerance import compare
from vit_common.training.recipes import get_recipe
from vit_common.training.train_config import TrainConfig
from vit_jax.checkpointing import Checkpoints
from vit_jax.data import iterate, train_batches
from vit_jax.model import VisionTransformer
from vit_jax.optim import decay_mask, layer_ids, make_optimizer
from vit_jax.trainer import Trainer, loss_and_grads
from vit_jax.weights import to_numpy


def first_batch(t: Trainer) -> dict:
    tc = t.tcfg
    batches = train_batches(t.data.train, 3, batch_size=tc.batch_size, epochs=1, seed=0, transform=t.train_transform)
    return next(iterate(batches))


def grads_of(t: Trainer, batch: dict):
    """(flat gradient state, loss sum, correct count) of one batch, from fresh parameters."""
    state = t.init_state()
    grads, _, loss, correct = jax.jit(lambda p, r, b: loss_and_grads(t, p, r, b))(
        state["params"], state["rest"], t.device_batch(batch)
    )
    return nnx.to_flat_state(grads), float(loss), float(correct)


BASE = TrainConfig(batch_size=8, epochs=1, augment=Augment())


@pytest.fixture(scope="module")
def tiny(tiny_cfg):
    """The model of these tests: 2 blocks on ``tiny_dataset``'s one-channel 8x8 images, 3 classes."""
    return tiny_cfg.replace(in_chans=1, depth=2)


@pytest.fixture(scope="module")
def reference(tiny_dataset, tiny):
    """Gradients of one batch of 8 (6 real examples + 2 padding rows), accumulated in one pass."""
    t = Trainer(tiny, BASE, tiny_dataset(6, 7))
    batch = first_batch(t)
    assert batch["mask"].tolist() == [1] * 6 + [0] * 2
    return t, batch, grads_of(t, batch)


@pytest.mark.slow
def test_steps_compile_once_and_count_every_example_once(caplog, tiny_dataset, tiny):
    """Two epochs of 10 examples in batches of 4: the last batch of each epoch is partial (2 real rows)."""
    data = tiny_dataset(10, 7)
    t = Trainer(tiny, TrainConfig(batch_size=4, epochs=2, warmup_steps=1, augment=Augment(shift=1)), data)
    state = t.init_state()
    counts, evals = [], []
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        it = iterate(train_batches(data.train, 3, batch_size=4, epochs=2, seed=0, transform=t.train_transform))
        for _ in range(t.total_steps):
            state, m = t.train_step(state, next(it))
            counts.append(float(m["count"]))
            if len(counts) % t.steps_per_epoch == 0:
                evals.append(t.evaluate(state, data.test))
    compiled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling")]
    assert len([m for m in compiled if re.search(r"\btrain_step\b", m)]) == 1, compiled
    assert len([m for m in compiled if re.search(r"\beval_step\b", m)]) == 1, compiled
    assert counts == [4, 4, 2, 4, 4, 2]
    assert [e["count"] for e in evals] == [7, 7]
    assert int(state["step"]) == 6


@pytest.mark.slow
@pytest.mark.parametrize("mixup", [0.0, 0.4], ids=["plain", "mixup"])
def test_compile_ahead_of_the_first_batch_is_the_program_the_steps_run(caplog, mixup, tiny_dataset, tiny):
    """``compile()`` from shapes alone (``batch_spec``) gives the program the real batches run: no step
    compiles again, with or without mixed targets, and its values are the jitted step's."""
    data = tiny_dataset(10, 7)
    tcfg = TrainConfig(batch_size=4, epochs=1, warmup_steps=1, augment=Augment(mixup=mixup))
    t = Trainer(tiny, tcfg, data)
    state = t.init_state()
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        t.compile()
        it = t.train_iterator()
        it.start_prefetch()
        batches = [next(it) for _ in range(t.total_steps)]
        for batch in batches:
            state, m = t.train_step(state, batch)
    compiled = [r.getMessage() for r in caplog.records if re.search(r"\btrain_step\b", r.getMessage())]
    assert len([m for m in compiled if m.startswith("Compiling")]) == 1, compiled
    assert {k: (v.shape, v.dtype) for k, v in batches[0].items()} == {
        k: (s.shape, s.dtype) for k, s in t.batch_spec().items()
    }
    fresh = Trainer(tiny, tcfg, data)  # the same steps without compile(): the same state, bit for bit
    again = fresh.init_state()
    for batch in batches:
        again, _ = fresh.train_step(again, batch)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(a, b), state["params"], again["params"])))


@pytest.mark.slow
def test_padding_rows_do_not_reach_the_gradient(reference):
    """Whatever the padding rows hold, loss and gradients are those of the real rows, bit for bit."""
    t, batch, (grads, loss, correct) = reference
    rng = np.random.default_rng(1)
    garbage = {**batch, "image": batch["image"].copy(), "label": batch["label"].copy()}
    garbage["image"][6:] = rng.standard_normal(garbage["image"][6:].shape) * 50
    garbage["label"][6:] = 2
    g2, loss2, correct2 = grads_of(t, garbage)
    assert (loss2, correct2) == (loss, correct) and correct <= 6
    for (path, a), (_, b) in zip(g2, grads, strict=True):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(path))


@pytest.mark.slow
@pytest.mark.parametrize("option", [dict(accum_steps=2), dict(remat=True)])
def test_accumulation_and_remat_give_the_same_gradients(reference, option, tiny_dataset, tiny):
    _, batch, (grads, loss, correct) = reference
    t = Trainer(tiny, dataclasses.replace(BASE, **option), tiny_dataset(6, 7))
    got, got_loss, got_correct = grads_of(t, batch)
    assert got_loss == pytest.approx(loss, rel=1e-6) and got_correct == correct
    for (path, a), (_, b) in zip(got, grads, strict=True):
        c = compare(str(path), a[...], b[...], "gradient", "float32")
        assert c.ok, c


def test_weight_decay_mask_skips_biases_norms_tokens_and_posemb(tiny):
    model = VisionTransformer(tiny, rngs=nnx.Rngs(0))
    _, params, _ = nnx.split(model, nnx.Param, ...)
    masked = decay_mask(params, get_recipe("twins"), model.no_weight_decay())
    mask = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(masked)}
    decayed = sorted(k for k, v in mask.items() if v)
    assert decayed == sorted(
        [f"blocks.{i}.{m}.kernel" for i in range(2) for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]
        + ["head.kernel", "patch_embed.proj.kernel"]
    )
    assert not mask["pos_embed"] and not mask["cls_token"] and not mask["norm.scale"]


def test_bad_batch_or_model_for_the_dataset(tiny_dataset, tiny):
    data = tiny_dataset(10, 7)
    with pytest.raises(ValueError, match="accum_steps"):
        TrainConfig(batch_size=6, accum_steps=4)
    with pytest.raises(ValueError, match="num_classes=5"):
        Trainer(tiny.replace(num_classes=5), TrainConfig(batch_size=4), data)
    with pytest.raises(ValueError, match="channels"):
        Trainer(tiny.replace(in_chans=3), TrainConfig(batch_size=4), data)


@pytest.mark.slow
def test_bf16_training_with_large_inputs_stays_finite():
    """Ti/16 in bfloat16 with inputs x100, a few steps: loss and gradients finite.

    Ti/16's width, heads and MLP at 64 px with 2 of its 12 blocks: the overflow happens inside a block,
    and 12 blocks would only multiply the compile time.
    """
    cfg = ViTConfig.from_name("Ti/16", image_size=64, depth=2, num_classes=3, in_chans=1, dtype="bfloat16")
    rng = np.random.default_rng(0)
    src = ArraySource(rng.integers(0, 256, (4, 64, 64, 1), dtype=np.uint8), np.arange(4) % 3)
    t = Trainer(
        cfg,
        TrainConfig(batch_size=4, epochs=3, warmup_steps=0, augment=Augment()),
        Dataset("x", src, src, ("a", "b", "c"), (64, 64), 1),
    )
    state = t.init_state()
    batch = first_batch(t)
    batch = {**batch, "image": batch["image"] * 100.0}
    for _ in range(3):
        state, m = t.train_step(state, batch)
        assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["grad_norm"])), m
        assert float(m["grad_norm"]) > 0
    assert state["params"]["head"]["kernel"][...].dtype == jnp.float32  # parameters stay float32
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state["params"]))


@pytest.mark.slow
def test_model_with_dropout_round_trips_through_orbax_into_an_abstract_model(tmp_path, tiny):
    cfg = tiny.replace(dropout=0.2, drop_path=0.1)
    model = VisionTransformer(cfg, rngs=nnx.Rngs(3))
    _, state = nnx.split(model)
    assert any(jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) for x in jax.tree.leaves(state))
    ckpts = Checkpoints(tmp_path / "ckpt")
    ckpts.save(1, state, {"step": 1})
    ckpts.wait()
    abstract = nnx.eval_shape(lambda: VisionTransformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    restored, meta = Checkpoints(tmp_path / "ckpt").restore(abstract_state)
    assert meta["step"] == 1
    for (p, a), (_, b) in zip(nnx.to_flat_state(state), nnx.to_flat_state(restored), strict=True):
        a, b = a[...], b[...]
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(p))
    twin = nnx.merge(graphdef, restored)
    forward = nnx.jit(lambda m, x: m(x))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 8, 8, 1)), jnp.float32)
    train_logits = np.asarray(forward(model, x))
    np.testing.assert_array_equal(np.asarray(forward(twin, x)), train_logits)  # the same dropout draws
    model.eval()
    twin.eval()
    eval_logits = np.asarray(forward(model, x))
    np.testing.assert_array_equal(np.asarray(forward(twin, x)), eval_logits)
    assert not np.array_equal(train_logits, eval_logits)  # dropout was live in training mode


def _flat(params) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(params)}


@pytest.mark.slow
def test_fine_tuning_starts_from_the_given_weights_and_freeze_trains_the_head_only(reference, tiny_dataset, tiny):
    """--init: the first state holds the checkpoint's tensors; --freeze: after steps only head.* moved,
    and the frozen parameters get exactly zero gradient (stop_gradient: no backward pass through them)."""
    _, batch, _ = reference
    weights = to_numpy(VisionTransformer(tiny, rngs=nnx.Rngs(7)))
    tcfg = dataclasses.replace(BASE, init="ckpt", freeze=True, warmup_steps=0, epochs=3)
    t = Trainer(tiny, tcfg, tiny_dataset(6, 7), weights=weights)
    state = t.init_state()
    assert to_numpy(nnx.merge(t.eval_graphdef, state["params"], state["rest"])).keys() == weights.keys()
    start = t.weights(state)
    assert all(np.array_equal(start[k], weights[k]) for k in weights)
    grads, _, _, _ = jax.jit(lambda p, r, b: loss_and_grads(t, p, r, b))(
        state["params"], state["rest"], t.device_batch(batch)
    )
    for name, g in _flat(grads).items():
        assert (np.abs(g).max() > 0) == name.startswith("head."), name
    for _ in range(3):
        state, m = t.train_step(state, batch)
    end = t.weights(state)
    moved = sorted(k for k in end if not np.array_equal(end[k], weights[k]))
    assert moved == ["head.bias", "head.weight"]


@pytest.mark.slow
def test_layer_decay_scales_each_layer_s_update(tiny):
    """The update of a parameter in layer l is the plain AdamW update times r^(depth + 1 - l): the
    embeddings r^3 (depth 2), block 0 r^2, block 1 and the final norm r (timm groups them), the head 1."""
    model = VisionTransformer(tiny, rngs=nnx.Rngs(0))
    _, params, _ = nnx.split(model, nnx.Param, ...)
    ids = {".".join(map(str, p)): int(v.get_value()) for p, v in nnx.to_flat_state(layer_ids(params, 2))}
    assert ids["pos_embed"] == ids["patch_embed.proj.kernel"] == 0 and ids["blocks.1.mlp.fc1.kernel"] == 2
    assert ids["norm.scale"] == 2 and ids["head.kernel"] == 3
    grads = jax.tree.map(lambda x: jnp.full_like(x, 0.01), params)
    nwd = model.no_weight_decay()
    plain, _ = make_optimizer(dataclasses.replace(BASE, warmup_steps=0), 10, 2, no_weight_decay=nwd)
    decayed, _ = make_optimizer(dataclasses.replace(BASE, warmup_steps=0, layer_decay=0.5), 10, 2, no_weight_decay=nwd)
    up_plain = _flat(plain.update(grads, plain.init(params), params)[0])
    up_decay = _flat(decayed.update(grads, decayed.init(params), params)[0])
    for name, u in up_plain.items():
        np.testing.assert_allclose(up_decay[name], u * 0.5 ** (3 - ids[name]), rtol=1e-6, err_msg=name)
    assert np.abs(up_plain["blocks.0.attn.qkv.kernel"]).max() > 0


def test_freeze_and_layer_decay_together_are_refused():
    with pytest.raises(ValueError, match="freeze=True with layer_decay=0.75"):
        TrainConfig(init="x", freeze=True, layer_decay=0.75)
    with pytest.raises(ValueError, match="freeze=True: expected --init"):
        TrainConfig(freeze=True)
    with pytest.raises(ValueError, match="layer_decay=1.5"):
        TrainConfig(layer_decay=1.5)


def numpy_ema_decay(step: int, decay: float, warmup: bool, gamma: float, power: float, floor: float) -> float:
    """timm's ``ModelEmaV3.get_decay`` written out in numpy (``timm/utils/model_ema.py``): 0 at step 1."""
    k = step - 1
    if k <= 0:
        return 0.0
    return float(np.clip(1 - (1 + k / gamma) ** -power, floor, decay)) if warmup else decay


@pytest.mark.slow
def test_ema_after_k_steps_is_the_numpy_formula_over_the_weights_of_every_step(tiny_dataset, tiny):
    """6 steps with a warm-up that meets its floor (step 2), its curve (3-5) and its cap (6): the jitted
    step's EMA equals ema x decay + weights x (1 - decay) in float64 over each step's weights, within the
    float32 bound; step 1's update is a copy; the decays are the formula's."""
    from vit_jax.optim import ema_decay

    knobs = dict(ema=0.6, ema_warmup=True, ema_warmup_gamma=2.0, ema_warmup_power=0.8, ema_min_decay=0.3)
    tcfg = TrainConfig(batch_size=4, epochs=2, warmup_steps=1, lr=1e-2, augment=Augment(), **knobs)
    formula = [numpy_ema_decay(s, 0.6, True, 2.0, 0.8, 0.3) for s in range(1, 7)]
    assert formula[:2] == [0.0, 0.3] and 0.3 < formula[2] < formula[4] < 0.6 == formula[5]
    assert [tcfg.ema_decay(s) for s in range(1, 7)] == formula
    np.testing.assert_allclose([float(ema_decay(tcfg, jnp.int32(s))) for s in range(1, 7)], formula, rtol=1e-6)
    plain = dataclasses.replace(tcfg, ema_warmup=False)
    assert [plain.ema_decay(s) for s in range(1, 4)] == [0.0, 0.6, 0.6]
    t = Trainer(tiny, tcfg, tiny_dataset(10, 7))
    state = t.init_state()
    assert set(state) == {"step", "params", "rest", "opt_state", "ema"}
    it = t.train_iterator()
    ema = {k: v.astype(np.float64) for k, v in t.weights(state).items()}
    for step in range(1, t.total_steps + 1):
        state, _ = t.train_step(state, next(it))
        weights, d = t.weights(state), formula[step - 1]
        ema = {k: ema[k] * d + weights[k] * (1 - d) for k in ema}
        got = t.weights(state, ema=True)
        if step == 1:
            assert all(np.array_equal(got[k], weights[k]) for k in weights)
        for k in ema:
            c = compare(k, got[k], ema[k], "tensor", "float32")
            assert c.ok, (step, c)
    it.close()
    assert t.total_steps == 6 and max(compare(k, got[k], weights[k], "tensor", "float32").rel for k in got) > 1e-3
    test, test_ema = t.evaluate(state, t.data.test), t.evaluate(state, t.data.test, ema=True)
    assert test["count"] == test_ema["count"] == 7 and test["loss"] != test_ema["loss"]
