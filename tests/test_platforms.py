"""vit_jax.platforms: the attention-kernel choice for every platform, dtype, head dim and mode (a pure
function, tested without a GPU), and cuDNN's sequence padding proven on CPU through JAX's XLA kernel
against the written-out softmax, forward and gradients, at the tolerance table's float32 bounds."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from vit_common.tolerance import compare
from vit_jax import model as vit_model
from vit_jax import platforms
from vit_jax.platforms import Platform, choose_attention

H100, A100, T4 = Platform("cuda", (9, 0)), Platform("cuda", (8, 0)), Platform("cuda", (7, 5))
CPU, TPU, ROCM = Platform("cpu"), Platform("tpu"), Platform("rocm")


@pytest.mark.parametrize(
    "platform, kwargs, expected",
    [
        # NVIDIA GPUs: cuDNN flash attention for bf16/fp16 and head dims it takes
        (H100, dict(dtype="bfloat16", head_dim=64), "cudnn"),
        (H100, dict(dtype="float16", head_dim=64), "cudnn"),
        (A100, dict(dtype="bfloat16", head_dim=128), "cudnn"),
        (A100, dict(dtype="bfloat16", head_dim=136), "xla"),  # > 128 before compute capability 9.0
        (H100, dict(dtype="bfloat16", head_dim=136), "cudnn"),
        (H100, dict(dtype="bfloat16", head_dim=264), "xla"),  # > 256
        (H100, dict(dtype="bfloat16", head_dim=60), "xla"),  # not a multiple of 8
        (T4, dict(dtype="bfloat16", head_dim=64), "xla"),  # compute capability < 8.0
        (Platform("cuda"), dict(dtype="bfloat16", head_dim=64), "xla"),  # capability unknown
        (H100, dict(dtype="float32", head_dim=64), "xla"),
        (H100, dict(dtype="float64", head_dim=64), "explicit"),
        # modes: probabilities or live attention dropout take the written-out softmax everywhere
        (H100, dict(dtype="bfloat16", head_dim=64, dropout=True), "explicit"),
        (H100, dict(dtype="bfloat16", head_dim=64, probabilities=True), "explicit"),
        (H100, dict(dtype="bfloat16", head_dim=64, backend="cudnn", dropout=True), "explicit"),
        # a requested backend is taken as asked
        (H100, dict(dtype="bfloat16", head_dim=64, backend="xla"), "xla"),
        (CPU, dict(dtype="float32", head_dim=64, backend="xla"), "xla"),
        (CPU, dict(dtype="float32", head_dim=64, backend="cudnn"), "cudnn"),
        (CPU, dict(dtype="float64", head_dim=64, backend="xla"), "explicit"),
        # elsewhere: XLA's fused op; on CPU the written-out softmax
        (CPU, dict(dtype="float32", head_dim=64), "explicit"),
        (CPU, dict(dtype="bfloat16", head_dim=64), "explicit"),
        (TPU, dict(dtype="bfloat16", head_dim=64), "xla"),
        (TPU, dict(dtype="float32", head_dim=64), "xla"),
        (ROCM, dict(dtype="bfloat16", head_dim=64), "xla"),
    ],
)
def test_choose_attention(platform, kwargs, expected):
    assert choose_attention(platform, **kwargs) == expected


@pytest.mark.slow
def test_this_machine_is_cpu_with_its_workarounds(small_cfg):
    p = Platform.current()
    assert p == Platform("cpu") and p.linear is platforms.FlatLinear and p.residual is platforms.residual_barrier
    assert Platform("cuda", (9, 0)).linear is nnx.Linear
    x = jnp.ones((2, 3))
    assert Platform("tpu").residual(x) is x
    cfg = small_cfg.replace(depth=1)
    m = vit_model.VisionTransformer(cfg, rngs=nnx.Rngs(0))
    assert m.platform == p and m.blocks[0].attn.kernel == "explicit" and type(m.head) is platforms.FlatLinear
    m = vit_model.VisionTransformer(cfg.replace(attn_backend="xla"), rngs=nnx.Rngs(0))
    assert m.blocks[0].attn.kernel == "xla"


def _qkv(t: int, s: int, seed: int = 0):
    """q [2, t, 3, 16], k and v [2, s, 3, 16], float32, and an output cotangent [2, t, 3, 16]."""
    rng = np.random.default_rng(seed)
    q, k, v, g = (rng.standard_normal((2, n, 3, 16), np.float32) for n in (t, s, s, t))
    return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(g)


def _explicit(q, k, v):
    return vit_model._attend(q, k, v, 16**-0.5)[0]


def _check_against_explicit(fn, t: int, s: int):
    """fn(q, k, v) equals the written-out softmax: output, and the q, k, v gradients of <out, g>."""
    q, k, v, g = _qkv(t, s)
    out, grads = jax.jit(lambda q, k, v: jax.value_and_grad(lambda *a: jnp.sum(fn(*a) * g), (0, 1, 2))(q, k, v))(
        q, k, v
    )
    ref, ref_grads = jax.value_and_grad(lambda *a: jnp.sum(_explicit(*a) * g), (0, 1, 2))(q, k, v)
    c = compare("output", jax.jit(fn)(q, k, v), _explicit(q, k, v), "tensor", "float32")
    assert c.ok, c
    for name, a, b in zip("qkv", grads, ref_grads, strict=True):
        c = compare(f"d{name}", a, b, "gradient", "float32")
        assert c.ok, c


@pytest.mark.slow
@pytest.mark.parametrize("t, s", [(197, 197), (1, 197), (5, 8), (8, 5)], ids=["self", "map-probe", "odd-q", "odd-kv"])
@pytest.mark.parametrize("multiple", [2, 8, 64])
def test_padded_attention_equals_explicit(t, s, multiple):
    fn = functools.partial(platforms.padded_attention, scale=16**-0.5, implementation="xla", multiple=multiple)
    _check_against_explicit(fn, t, s)


@pytest.mark.slow
@pytest.mark.parametrize("t, s", [(197, 197), (1, 197)])
def test_any_length_route_pads_only_when_differentiated(t, s):
    """dot_product_attention with a multiple that t or s misses: the primal is JAX's unpadded kernel,
    its gradient goes through padded_attention (the padded length shows in the program)."""
    fn = functools.partial(platforms.dot_product_attention, scale=16**-0.5, implementation="xla", multiple=2)
    _check_against_explicit(fn, t, s)
    q, k, v, g = _qkv(t, s)
    primal = str(jax.make_jaxpr(fn)(q, k, v))
    grad = str(jax.make_jaxpr(jax.grad(lambda q: jnp.sum(fn(q, k, v) * g)))(q))
    assert "198," not in primal and "2,198,3,16" in grad.replace(" ", "")
    unpadded = functools.partial(jax.nn.dot_product_attention, scale=16**-0.5, implementation="xla")
    np.testing.assert_array_equal(jax.jit(fn)(q, k, v), jax.jit(unpadded)(q, k, v))


@pytest.mark.slow
def test_masked_attention_pads_to_the_multiple_and_equals_the_written_out_softmax():
    """NaFlex keys masked (rows of 7 and 3 real tokens), the token axes padded to multiples of 8 as cuDNN's
    differentiated kernel needs (XLA's kernel on CPU): the output and the q, k, v gradients of the real
    queries equal the written-out softmax over the real keys, and the padding shows in the program."""
    mask = jnp.arange(7)[None, :] < jnp.array([[7], [3]])  # [2, 7]
    fn = functools.partial(platforms.dot_product_attention, scale=16**-0.5, implementation="xla", multiple=8)
    q, k, v, g = _qkv(7, 7)
    g = g * mask[:, :, None, None]  # the padding queries' outputs reach no loss (the model masks them out)

    def loss(attend, q, k, v):
        return jnp.sum(attend(q, k, v, token_mask=mask) * g)

    ref = lambda q, k, v, token_mask: vit_model._attend(q, k, v, 16**-0.5, token_mask=token_mask)[0]  # noqa: E731
    got, want = (jax.jit(jax.value_and_grad(loss, (1, 2, 3)), static_argnums=0)(f, q, k, v) for f in (fn, ref))
    for name, a, b in zip(("loss", "dq", "dk", "dv"), (got[0], *got[1]), (want[0], *want[1]), strict=True):
        c = compare(name, a, b, "gradient", "float32")
        assert c.ok, c
    assert "2,8,3,16" in str(jax.make_jaxpr(lambda q: fn(q, k, v, token_mask=mask))(q)).replace(" ", "")


@pytest.mark.slow
def test_any_length_route_under_remat_and_vmap():
    fn = functools.partial(platforms.dot_product_attention, scale=16**-0.5, implementation="xla", multiple=2)
    q, k, v, g = _qkv(7, 7)
    loss = lambda q: jnp.sum(fn(q, k, v) * g)  # noqa: E731
    ref = jax.grad(lambda q: jnp.sum(_explicit(q, k, v) * g))(q)
    c = compare("remat", jax.jit(jax.grad(jax.checkpoint(loss)))(q), ref, "gradient", "float32")
    assert c.ok, c
    per_example = jax.vmap(jax.grad(lambda q, k, v, g: jnp.sum(fn(q[None], k[None], v[None])[0] * g)))(q, k, v, g)
    c = compare("vmap", per_example, ref, "gradient", "float32")
    assert c.ok, c


@pytest.mark.slow
def test_model_with_padded_fused_attention_trains_like_explicit(monkeypatch, small_cfg):
    """A whole training gradient with the fused kernel padded as cuDNN's is (XLA kernel on CPU, L=17,
    MAP head probe T=1) against the written-out softmax, every parameter at the float32 bound."""
    cfg = small_cfg.replace(pool="map")
    padded = functools.partial(platforms.dot_product_attention, multiple=8)
    calls = []
    monkeypatch.setattr(vit_model, "dot_product_attention", lambda *a, **kw: calls.append(1) or padded(*a, **kw))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 32, 32, 3)), jnp.float32)
    y = jnp.asarray([3, 7])

    def grads(impl: str, backend: str | None):
        model = vit_model.VisionTransformer(cfg.replace(attn_impl=impl, attn_backend=backend), rngs=nnx.Rngs(0))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def loss(p):
            logits = nnx.merge(graphdef, p, rest)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        return jax.jit(jax.value_and_grad(loss))(params)

    (loss_f, g_f), (loss_e, g_e) = grads("fused", "xla"), grads("explicit", None)
    assert len(calls) == 3  # two blocks and the MAP head
    assert abs(float(loss_f) - float(loss_e)) <= 1e-5 * abs(float(loss_e))
    leaves = jax.tree_util.tree_leaves_with_path
    for (path, a), (_, b) in zip(leaves(g_f), leaves(g_e), strict=True):
        c = compare(jax.tree_util.keystr(path), a, b, "gradient", "float32")
        assert c.ok, c


def test_building_for_another_platform(small_cfg):
    cfg = small_cfg.replace(depth=1, dtype="bfloat16")
    with platforms.building_for(H100):
        m = vit_model.VisionTransformer(cfg, rngs=nnx.Rngs(0))
    assert m.platform == H100 and m.blocks[0].attn.kernel == "cudnn" and type(m.head) is nnx.Linear
    assert Platform.current() == CPU
