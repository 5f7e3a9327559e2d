"""The two twins compute the same function: every intermediate, attention map and gradient.

Bounds come from the tolerance table (vit_common.tolerance). Each case initialises one twin, converts
its canonical state to the other, and compares both directions (jax -> torch, torch -> jax).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

import vit_jax
import vit_jax.runner
import vit_torch
import vit_torch.runner
from vit_common.config import ViTConfig
from vit_common.state import StateMismatchError, canonical_shapes
from vit_common.tolerance import Comparison, compare

TWINS = ("jax", "torch")


def init_state(twin: str, cfg: ViTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Initialise ``twin`` and return its canonical state with every tensor randomised.

    Fresh LayerNorm weights are 1 and biases 0, which would hide swapped or untransposed tensors, so
    every tensor is perturbed around its init (norm weights 1 + 0.1 N(0,1), the rest + 0.02 N(0,1)).
    """
    if twin == "jax":
        state = vit_jax.to_numpy(vit_jax.VisionTransformer(cfg, rngs=nnx.Rngs(seed)))
    else:
        torch.manual_seed(seed)
        state = vit_torch.to_numpy(vit_torch.VisionTransformer(cfg))
    rng = np.random.default_rng(seed + 1)
    return {
        k: (v + (0.1 if v.ndim == 1 and "norm" in k else 0.02) * rng.standard_normal(v.shape)).astype(v.dtype)
        for k, v in state.items()
    }


def convert(src: str, cfg: ViTConfig, state: dict[str, np.ndarray]):
    """Build twin ``src`` from ``state`` (cast to cfg.param_dtype), then the other twin from its to_numpy.

    Returns (jax model, torch model), both in eval mode.
    """
    if src == "jax":
        jm = vit_jax.from_numpy(cfg, state)
        tm = vit_torch.from_numpy(cfg, vit_jax.to_numpy(jm))
    else:
        tm = vit_torch.from_numpy(cfg, state)
        jm = vit_jax.from_numpy(cfg, vit_torch.to_numpy(tm))
    return jm, tm


def _images(cfg: ViTConfig, batch: int = 2, hw: tuple[int, int] | None = None, seed: int = 0) -> np.ndarray:
    """Deterministic standard-normal images [B, C, H, W] in cfg.dtype's float width (bf16 -> float32)."""
    h, w = hw or cfg.image_size
    dt = np.float64 if cfg.dtype == "float64" else np.float32
    return np.random.default_rng(seed).standard_normal((batch, cfg.in_chans, h, w)).astype(dt)


def run_both(jm, tm, x_nchw: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """forward_intermediates of both twins on the same images (the twins' runners), as float64 numpy dicts."""
    x = x_nchw.transpose(0, 2, 3, 1)
    out_j, out_t = vit_jax.runner.intermediates(jm, x)[1], vit_torch.runner.intermediates(tm, x)[1]
    return {k: np.asarray(v, np.float64) for k, v in out_j.items()}, {
        k: np.asarray(v, np.float64) for k, v in out_t.items()
    }


def compare_outputs(out_a: dict, out_b: dict, dtype: str) -> list[Comparison]:
    """Compare every intermediate (attention maps with the attention bound) under the table."""
    assert out_a.keys() == out_b.keys(), (sorted(out_a), sorted(out_b))
    return [compare(k, out_a[k], out_b[k], "attention" if k.startswith("attn") else "tensor", dtype) for k in out_b]


# One entry per feature flag of ViTConfig (and a few combinations); (overrides, input (H, W) or None).
FEATURES = {
    "token": (dict(), None),
    "gap": (dict(pool="gap", class_token=False), None),
    "gap_fc_norm_with_cls": (dict(pool="gap", fc_norm=True), None),
    "max_with_prefix": (dict(pool="max", reg_tokens=2, pool_include_prefix=True), None),
    "avgmax": (dict(pool="avgmax", fc_norm=True, reg_tokens=1), None),
    "map": (dict(pool="map", class_token=False), None),
    "map_without_prefix_tokens": (dict(pool="map", reg_tokens=2), None),
    "map_over_prefix_tokens": (dict(pool="map", pool_include_prefix=True), None),
    "deit_distilled": (dict(dist_token=True, head_dist=True), None),
    "deit_distilled_backbone": (dict(dist_token=True, head_dist=True, num_classes=0), None),
    "deit_dist_token_cls_head": (dict(dist_token=True, posemb_prefix=False), None),
    "clip_style": (dict(norm_pre=True, patch_bias=False, gelu="quick"), None),
    "clip_projection_head": (dict(norm_pre=True, patch_bias=False, gelu="quick", head_bias=False), None),
    "swiglu": (dict(mlp_type="swiglu", mlp_dim=40), None),
    "dinov2_classifier": (dict(pool="token_gap", layer_scale=0.1), None),
    "dinov2_classifier_registers_swiglu": (
        dict(pool="token_gap", reg_tokens=2, posemb_prefix=False, mlp_type="swiglu", mlp_dim=24, layer_scale=0.1),
        None,
    ),
    "none": (dict(pool="none"), None),
    "registers": (dict(reg_tokens=4), None),
    "registers_no_embed_class": (dict(reg_tokens=4, posemb_prefix=False), None),
    "qk_norm": (dict(qk_norm=True), None),
    "layer_scale": (dict(layer_scale=0.1), None),
    "sincos2d": (dict(posemb="sincos2d", posemb_prefix=False), None),
    "sincos2d_no_class_token": (dict(posemb="sincos2d", posemb_prefix=False, class_token=False, pool="gap"), None),
    "no_posemb": (dict(posemb="none"), None),
    "pre_logits": (dict(rep_size=24), None),
    "gelu_tanh": (dict(gelu="tanh"), None),
    "no_qkv_bias": (dict(qkv_bias=False), None),
    "backbone_only": (dict(num_classes=0), None),
    "ln_eps_1e-12": (dict(ln_eps=1e-12), None),
    "non_square_224x320": (dict(image_size=(224, 320), patch_size=16), None),
    "dynamic_size": (dict(dynamic_img_size=True), (48, 40)),
    "dynamic_pad": (dict(dynamic_img_size=True, dynamic_img_pad=True), (30, 45)),
    "everything": (
        dict(
            pool="map",
            reg_tokens=2,
            qk_norm=True,
            layer_scale=0.5,
            rep_size=16,
            gelu="tanh",
            posemb_prefix=False,
            image_size=(32, 48),
            in_chans=1,
            ln_eps=1e-5,
            fc_norm=True,
            dropout=0.1,
            attn_dropout=0.1,
            drop_path=0.2,
        ),
        None,
    ),
}
DTYPES = ("float32", "float64")


def _dtype_ctx(dtype: str):
    return jax.enable_x64(dtype == "float64")


@functools.cache
def _state(src: str, cfg: ViTConfig) -> dict[str, np.ndarray]:
    """float32 init of twin ``src`` (randomised), shared by the float32 and float64 runs."""
    return init_state(src, cfg)


def _check_pair(src: str, cfg32: ViTConfig, dtype: str, hw=None) -> list:
    cfg = cfg32.replace(dtype=dtype, param_dtype=dtype)
    with _dtype_ctx(dtype):
        jm, tm = convert(src, cfg, _state(src, cfg32))
        out_j, out_t = run_both(jm, tm, _images(cfg, hw=hw))
    results = compare_outputs(out_j, out_t, dtype)
    bad = [str(c) for c in results if not c.ok]
    assert not bad, "\n".join(bad)
    for k, v in out_t.items():  # every attention row is a distribution
        if k.startswith("attn"):
            np.testing.assert_allclose(v.sum(-1), 1.0, atol=1e-6 if dtype == "float32" else 1e-12)
    return results


# Each feature in both directions in float32; float64 (the arithmetic path, not the weights' origin) from
# the JAX twin's weights only, which keeps the suite's time down.
SRC_DTYPES = [("jax", "float32"), ("torch", "float32"), ("jax", "float64")]


@pytest.mark.slow
@pytest.mark.parametrize(("src", "dtype"), SRC_DTYPES)
@pytest.mark.parametrize("feature", FEATURES)
def test_feature_parity(feature, src, dtype, small_cfg):
    overrides, hw = FEATURES[feature]
    results = _check_pair(src, small_cfg.replace(**overrides), dtype, hw)
    names = {c.name for c in results}
    assert {
        "patch_embed",
        "pos_embed",
        "block00",
        "block01",
        "attn00",
        "attn01",
        "norm",
        "pre_logits",
        "logits",
    } <= names
    assert ("attn_pool" in names) == (overrides.get("pool") == "map")


@pytest.mark.parametrize(
    ("variant", "src", "dtype"),
    [
        (v, src, dtype) if v == "Ti/16" else pytest.param(v, src, dtype, marks=pytest.mark.slow)
        for v in ("Ti/16", "S/16")
        for src in TWINS
        for dtype in DTYPES
    ]
    # B/16 in float64 too costs a minute: float64 is Ti and S's; the fast loop runs Ti alone
    + [pytest.param("B/16", src, "float32", marks=pytest.mark.slow) for src in TWINS],
)
def test_variant_parity_224(variant, src, dtype, record_property):
    results = _check_pair(src, ViTConfig.from_name(variant), dtype)
    logits = next(c for c in results if c.name == "logits")
    attn = max((c for c in results if c.name.startswith("attn")), key=lambda c: c.max_abs)
    worst = max((c for c in results if c.kind == "rel"), key=lambda c: c.rel)
    record_property("logits_rel", logits.rel)
    record_property("attn_max_abs", attn.max_abs)
    record_property("worst_tensor", f"{worst.name} {worst.rel:.3e}")
    print(
        f"{variant} {dtype} {src}->other: logits rel {logits.rel:.2e}, worst {worst.name} {worst.rel:.2e}, "
        f"attention max abs {attn.max_abs:.2e}"
    )


def _abstract_jax_count(cfg: ViTConfig) -> int:
    jm = nnx.eval_shape(lambda: vit_jax.VisionTransformer(cfg, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(jm, nnx.Param)))


@pytest.mark.slow
def test_canonical_names_and_golden_counts_in_both_twins(golden_params):
    # Built abstractly (meta device / nnx.eval_shape): names, shapes and counts without allocating. Tracing
    # the JAX twin's init costs about a second per block, so it is built with one and with two blocks: the
    # tensors outside the blocks, and one block's size, which the other blocks repeat.
    for name, count in golden_params.items():
        cfg = ViTConfig.from_name(name)
        with torch.device("meta"):
            tm = vit_torch.VisionTransformer(cfg)
        assert {k: tuple(v.shape) for k, v in tm.state_dict().items()} == canonical_shapes(cfg)
        assert sum(p.numel() for p in tm.parameters()) == count
        c1, c2 = (_abstract_jax_count(cfg.replace(depth=d)) for d in (1, 2))
        assert c1 + (cfg.depth - 1) * (c2 - c1) == count


@pytest.mark.slow
@pytest.mark.parametrize("feature", FEATURES)
def test_canonical_names_for_every_feature(feature, small_cfg):
    cfg = small_cfg.replace(**FEATURES[feature][0])
    expected = canonical_shapes(cfg)
    jm = vit_jax.VisionTransformer(cfg, rngs=nnx.Rngs(0))
    tm = vit_torch.VisionTransformer(cfg)
    for state in (vit_jax.to_numpy(jm), vit_torch.to_numpy(tm)):
        assert list(state) == list(expected)
        assert {k: v.shape for k, v in state.items()} == expected
        assert all(v.flags.c_contiguous for v in state.values())
    assert cfg.param_count() == sum(math.prod(s) for s in expected.values())


@pytest.mark.slow
@pytest.mark.parametrize("src", TWINS)
def test_conversion_round_trip_is_bit_exact(src, small_cfg):
    cfg = small_cfg.replace(**FEATURES["everything"][0])
    state = _state(src, cfg)
    jm, tm = convert(src, cfg, state)
    for back in (vit_jax.to_numpy(jm), vit_torch.to_numpy(tm)):
        assert back.keys() == state.keys()
        for k in state:
            assert back[k].dtype == state[k].dtype and np.array_equal(back[k], state[k]), k


# ----------------------------------------------------------------------------------- attention


@pytest.mark.slow
@pytest.mark.parametrize("feature", ["token", "map", "registers"])
def test_fused_equals_explicit_within_each_twin(feature, small_cfg):
    cfg = small_cfg.replace(**FEATURES[feature][0])
    state = _state("torch", cfg)
    x = _images(cfg)
    fused_j = vit_jax.from_numpy(cfg.replace(attn_impl="fused"), state)
    expl_j = vit_jax.from_numpy(cfg.replace(attn_impl="explicit"), state)
    fused_t = vit_torch.from_numpy(cfg.replace(attn_impl="fused"), state)
    expl_t = vit_torch.from_numpy(cfg.replace(attn_impl="explicit"), state)
    xj = jnp.asarray(x.transpose(0, 2, 3, 1))
    with torch.no_grad():
        pairs = {"jax": (fused_j(xj), expl_j(xj)), "torch": (fused_t(torch.from_numpy(x)), expl_t(torch.from_numpy(x)))}
    for twin, (a, b) in pairs.items():
        c = compare(f"{twin} fused vs explicit", np.asarray(a), np.asarray(b), "tensor", "float32")
        assert c.ok, c


@pytest.mark.slow
@pytest.mark.parametrize("twin", TWINS)
def test_maps_from_a_fused_model_are_never_empty(twin):
    """Ti/16 with the fused path on, attention maps requested -> [B, N, L, L], rows sum to 1."""
    cfg = ViTConfig.from_name("Ti/16", attn_impl="fused")
    state = _state("torch", cfg.replace(attn_impl="fused"))
    x = _images(cfg)
    if twin == "jax":
        _, out = vit_jax.from_numpy(cfg, state).forward_intermediates(jnp.asarray(x.transpose(0, 2, 3, 1)))
        maps = {k: np.asarray(v) for k, v in out.items() if k.startswith("attn")}
    else:
        with torch.no_grad():
            _, out = vit_torch.from_numpy(cfg, state).forward_intermediates(torch.from_numpy(x))
        maps = {k: v.numpy() for k, v in out.items() if k.startswith("attn")}
    assert sorted(maps) == [f"attn{i:02d}" for i in range(12)]
    for v in maps.values():
        assert v.shape == (2, 3, 197, 197)
        np.testing.assert_allclose(v.sum(-1), 1.0, atol=1e-6)
        assert v.min() >= 0


# ----------------------------------------------------------------------------------- gradients


def _grads(cfg: ViTConfig, state, x: np.ndarray, labels: np.ndarray, checkpointing: bool = False):
    """Cross-entropy (mean over the batch) gradients w.r.t. every parameter, canonical names, both twins
    (each block recomputed in the backward pass with ``checkpointing``)."""
    jm = vit_jax.from_numpy(cfg, state)
    jm.set_grad_checkpointing(checkpointing)

    def loss_fn(model):
        logits = model(jnp.asarray(x.transpose(0, 2, 3, 1)))
        return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(labels)).mean()

    loss_j, g = nnx.jit(nnx.value_and_grad(loss_fn))(jm)
    tm = vit_torch.from_numpy(cfg, state)
    tm.set_grad_checkpointing(checkpointing)
    loss_t = torch.nn.functional.cross_entropy(tm(torch.from_numpy(x)), torch.from_numpy(labels))
    loss_t.backward()
    loss_t = loss_t.detach()
    grads_t = {k: p.grad.detach().numpy() for k, p in tm.named_parameters()}
    return (float(loss_j), vit_jax.weights.params_to_numpy(cfg, g)), (float(loss_t), grads_t)


@pytest.mark.slow
@pytest.mark.parametrize("feature", ["token", "everything", "gap", "none_pre_logits", "swiglu"])
def test_gradients_equal_in_float64(feature, x64, small_cfg):
    overrides = FEATURES[feature][0] if feature in FEATURES else dict(pool="gap", class_token=False, rep_size=8)
    cfg = small_cfg.replace(**overrides, dtype="float64", param_dtype="float64")
    state = _state("torch", cfg.replace(dtype="float32", param_dtype="float32"))
    x = _images(cfg)
    labels = np.array([3, 7])
    (loss_j, gj), (loss_t, gt) = _grads(cfg, state, x, labels)
    assert abs(loss_j - loss_t) <= 1e-12 * abs(loss_t)
    assert gj.keys() == gt.keys() == canonical_shapes(cfg).keys()
    # k_norm's bias shifts every key's logit for a query by the same amount, which softmax ignores:
    # its true gradient is zero and both twins must give rounding noise only. Every other parameter
    # has a real gradient, compared relative to its own largest entry.
    gmax = max(np.abs(v).max() for v in gt.values())
    zero = {k for k in gt if np.abs(gt[k]).max() <= 1e-12 * gmax}
    assert zero == {k for k in gt if k.endswith("attn.k_norm.bias")}
    assert all(np.abs(gj[k]).max() <= 1e-12 * gmax for k in zero)
    bad = [str(c) for k in gt if k not in zero and not (c := compare(k, gj[k], gt[k], "gradient", "float64")).ok]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_grad_checkpointing_recomputes_each_block_and_keeps_the_gradients(x64, small_cfg, monkeypatch):
    """set_grad_checkpointing (timm's name; big_vision's remat) in both twins: the backward pass runs each
    block again (JAX: a checkpoint around each block in the program; torch: each block's forward twice)
    and every gradient is the one without it, and the other twin's, within the float64 bound."""
    cfg = small_cfg.replace(dtype="float64", param_dtype="float64")
    state = _state("torch", cfg.replace(dtype="float32", param_dtype="float32"))
    x, labels = _images(cfg), np.array([3, 7])
    (_, plain), _ = _grads(cfg, state, x, labels)
    calls, forward = [], vit_torch.model.Block.forward

    def counted(block, *args, **kwargs):
        calls.append(block)
        return forward(block, *args, **kwargs)

    monkeypatch.setattr(vit_torch.model.Block, "forward", counted)  # module hooks skip the recomputation
    (_, gj), (_, gt) = _grads(cfg, state, x, labels, checkpointing=True)
    assert len(calls) == 2 * cfg.depth  # forward, then again in backward
    jm = vit_jax.from_numpy(cfg, state)
    jm.set_grad_checkpointing()
    program = str(jax.make_jaxpr(nnx.grad(lambda m: m(jnp.asarray(x.transpose(0, 2, 3, 1))).sum()))(jm))
    assert program.count("checkpoint[") + program.count("remat") >= cfg.depth, program[:2000]
    bad = [
        str(c)
        for k in gt
        for c in (
            compare(k, gj[k], plain[k], "gradient", "float64"),
            compare(k, gt[k], plain[k], "gradient", "float64"),
        )
        if np.abs(plain[k]).max() > 0 and not c.ok
    ]
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------ mixed precision


@pytest.mark.slow
def test_bf16_compute_against_float64_reference(x64, record_property):
    """bfloat16 compute, float32 parameters, vs the float64 twin: reported, and <= 2e-2 relative."""
    cfg32 = ViTConfig.from_name("Ti/16")
    state = _state("torch", cfg32)
    x = _images(cfg32)
    ref = vit_torch.from_numpy(cfg32.replace(dtype="float64", param_dtype="float64"), state)
    with torch.no_grad():
        ref_logits = ref(torch.from_numpy(x.astype(np.float64))).numpy()
    bf = cfg32.replace(dtype="bfloat16")
    with torch.no_grad():
        lt = vit_torch.from_numpy(bf, state)(torch.from_numpy(x)).float().numpy()
    lj = np.asarray(vit_jax.from_numpy(bf, state)(jnp.asarray(x.transpose(0, 2, 3, 1))).astype(jnp.float32))
    for twin, logits in (("jax", lj), ("torch", lt)):
        c = compare(f"{twin} bf16 logits vs float64", logits, ref_logits, "tensor", "bfloat16")
        record_property(f"{twin}_bf16_rel", c.rel)
        print(c)
        assert c.ok, c
        assert c.rel > 1e-4  # really computed in bf16, not silently in float32


@pytest.mark.slow
@pytest.mark.parametrize("twin", TWINS)
def test_bf16_training_steps_stay_finite_with_large_inputs(twin, small_cfg):
    """A few bf16 training steps with inputs x100: loss and gradients finite."""
    cfg = small_cfg.replace(dtype="bfloat16")
    state = _state("torch", cfg.replace(dtype="float32"))
    x = _images(cfg) * 100.0
    labels = np.array([1, 2])
    losses, finite = [], []
    if twin == "jax":
        model = vit_jax.from_numpy(cfg, state)
        model.train()
        opt = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

        def loss_fn(m):
            logits = m(jnp.asarray(x.transpose(0, 2, 3, 1))).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(labels)).mean()

        @nnx.jit
        def step(m, o):
            loss, g = nnx.value_and_grad(loss_fn)(m)
            o.update(m, g)
            return loss, all_finite(g)

        all_finite = lambda t: jnp.all(jnp.array([jnp.isfinite(v).all() for v in jax.tree.leaves(t)]))  # noqa: E731
        for _ in range(3):
            loss, ok = step(model, opt)
            losses.append(float(loss))
            finite.append(bool(ok))
    else:
        model = vit_torch.from_numpy(cfg, state).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)).float(), torch.from_numpy(labels))
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            finite.append(all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()))
    assert all(np.isfinite(losses)) and all(finite), (losses, finite)
    assert losses[-1] != losses[0]  # the steps changed the model


# ---------------------------------------------------------------------------------- known faults


@pytest.mark.slow
@pytest.mark.parametrize("gelu", ["exact", "tanh"])
def test_gelu_variant_comes_from_the_config(gelu):
    """Ti/16, 2 images 224x224: with either GELU both twins agree to 1e-5; mixing them does not."""
    cfg = ViTConfig.from_name("Ti/16", gelu=gelu)
    state = _state("torch", ViTConfig.from_name("Ti/16"))
    x = _images(cfg)
    lj = np.asarray(vit_jax.from_numpy(cfg, state)(jnp.asarray(x.transpose(0, 2, 3, 1))))
    with torch.no_grad():
        lt = vit_torch.from_numpy(cfg, state)(torch.from_numpy(x)).numpy()
        other = vit_torch.from_numpy(cfg.replace(gelu="tanh" if gelu == "exact" else "exact"), state)
        lo = other(torch.from_numpy(x)).numpy()
    assert compare("logits", lj, lt, "tensor", "float32").ok
    assert not compare("logits, other GELU", lj, lo, "tensor", "float32").ok  # the choice is visible


@pytest.mark.slow
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 1e-12, 1e-2])
def test_every_layer_norm_uses_cfg_ln_eps(eps, small_cfg):
    cfg = small_cfg.replace(**FEATURES["everything"][0]).replace(ln_eps=eps)
    state = _state("torch", cfg.replace(ln_eps=1e-6))
    jm, tm = vit_jax.from_numpy(cfg, state), vit_torch.from_numpy(cfg, state)
    t_norms = [m for m in tm.modules() if isinstance(m, torch.nn.LayerNorm)]
    j_norms = (
        [m for _, m in nnx.iter_modules(jm) if isinstance(m, nnx.LayerNorm)]
        if hasattr(nnx, "iter_modules")
        else [m for _, m in jm.iter_modules() if isinstance(m, nnx.LayerNorm)]
    )
    # 2 per block + 2 qk_norm per block + MAP head norm + fc_norm
    assert len(t_norms) == len(j_norms) == 4 * cfg.depth + 2
    assert all(m.eps == eps for m in t_norms) and all(m.epsilon == eps for m in j_norms)
    assert all(m.use_fast_variance is False for m in j_norms)
    out_j, out_t = run_both(jm, tm, _images(cfg))
    assert all(c.ok for c in compare_outputs(out_j, out_t, "float32"))


@pytest.mark.slow
@pytest.mark.parametrize("twin", TWINS)
def test_valid_patch_embedding_and_clear_size_errors(twin, small_cfg):
    """Patch-14 model + 384x384, patch-16 model + 225x230: ValueError; dynamic: 27x27=729 tokens."""

    def run(cfg, hw):
        x = np.zeros((1, 3, *hw), np.float32)
        state = _state("torch", cfg.replace(dynamic_img_size=False))
        if twin == "jax":
            return vit_jax.from_numpy(cfg, state).forward_intermediates(jnp.asarray(x.transpose(0, 2, 3, 1)))[1]
        with torch.no_grad():
            return vit_torch.from_numpy(cfg, state).forward_intermediates(torch.from_numpy(x))[1]

    p14 = small_cfg.replace(patch_size=14, image_size=224)
    with pytest.raises(ValueError, match=r"\(384, 384\).*patch_size \(14, 14\)"):
        run(p14, (384, 384))
    p16 = small_cfg.replace(patch_size=16, image_size=224)
    with pytest.raises(ValueError, match=r"\(225, 230\)"):
        run(p16, (225, 230))
    out = run(p14.replace(dynamic_img_size=True), (384, 384))
    assert tuple(out["patch_embed"].shape) == (1, 729, 32)
    assert tuple(out["block00"].shape) == (1, 730, 32)


def test_dynamic_size_is_equal_across_twins(small_cfg):
    cfg = small_cfg.replace(patch_size=14, image_size=224, dynamic_img_size=True)
    state = _state("torch", cfg.replace(dynamic_img_size=False))
    jm, tm = convert("torch", cfg, state)
    out_j, out_t = run_both(jm, tm, _images(cfg, batch=1, hw=(384, 384)))
    assert out_t["patch_embed"].shape == (1, 729, 32)
    assert all(c.ok for c in compare_outputs(out_j, out_t, "float32"))


@pytest.mark.parametrize("twin", TWINS)
def test_a_tensor_never_copied_is_an_error(twin, small_cfg):
    cfg = small_cfg
    state = dict(_state("torch", cfg))
    from_numpy = vit_jax.from_numpy if twin == "jax" else vit_torch.from_numpy
    partial = {k: v for k, v in state.items() if k != "blocks.1.attn.proj.bias"}
    with pytest.raises(StateMismatchError, match="missing: blocks.1.attn.proj.bias") as e:
        from_numpy(cfg, partial)
    assert e.value.missing == ["blocks.1.attn.proj.bias"] and not e.value.unexpected and not e.value.shape
    bad = {
        **partial,
        "blocks.1.attn.proj.bias_extra": state["blocks.1.attn.proj.bias"],
        "head.weight": np.zeros((11, 32), np.float32),
    }
    with pytest.raises(StateMismatchError) as e:
        from_numpy(cfg, bad)
    assert e.value.missing == ["blocks.1.attn.proj.bias"]
    assert e.value.unexpected == ["blocks.1.attn.proj.bias_extra"]
    assert e.value.shape == ["head.weight has (11, 32), expected (10, 32)"]


# ---------------------------------------------------------------------------- train-only noise


@pytest.mark.slow
@pytest.mark.parametrize("twin", TWINS)
def test_drop_path_and_dropout_only_in_training(twin, small_cfg):
    noisy = small_cfg.replace(dropout=0.2, attn_dropout=0.2, drop_path=0.5)
    state = _state("torch", small_cfg)
    x = _images(noisy, batch=4)
    if twin == "jax":
        clean = np.asarray(vit_jax.from_numpy(small_cfg, state)(jnp.asarray(x.transpose(0, 2, 3, 1))))
        model = vit_jax.from_numpy(noisy, state)
        evals = np.asarray(model(jnp.asarray(x.transpose(0, 2, 3, 1))))
        model.train()
        trains = [np.asarray(model(jnp.asarray(x.transpose(0, 2, 3, 1)))) for _ in range(2)]
    else:
        with torch.no_grad():
            clean = vit_torch.from_numpy(small_cfg, state)(torch.from_numpy(x)).numpy()
            model = vit_torch.from_numpy(noisy, state)
            evals = model(torch.from_numpy(x)).numpy()
            model.train()
            trains = [model(torch.from_numpy(x)).numpy() for _ in range(2)]
    np.testing.assert_array_equal(evals, clean)  # eval mode: the rates change nothing, bit for bit
    assert not np.allclose(trains[0], clean) and not np.allclose(trains[0], trains[1])


def test_float64_without_x64_is_an_error(small_cfg):
    cfg = small_cfg.replace(dtype="float64", param_dtype="float64")
    with jax.enable_x64(False), pytest.raises(ValueError, match="jax_enable_x64"):
        vit_jax.from_numpy(cfg, _state("torch", small_cfg))
