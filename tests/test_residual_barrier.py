"""vit_jax.platforms.residual_barrier: an exact identity that stops XLA on CPU from fusing the backward
pass's residual-gradient chain into every block (quadratic in depth, see its docstring)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vit_common.config import ViTConfig
from vit_jax import model as vit_model
from vit_jax import platforms


def _loss(x):
    return jnp.sum(jnp.sin(x) ** 2 * x)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_value_and_vjp_are_the_identity_bit_for_bit(dtype):
    with jax.enable_x64(dtype == "float64"):
        x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 4)), dtype)
        np.testing.assert_array_equal(platforms.residual_barrier(x), x)
        out, vjp = jax.vjp(platforms.residual_barrier, x)
        g = jnp.asarray(np.random.default_rng(1).standard_normal((2, 5, 4)), dtype)
        np.testing.assert_array_equal(jax.jit(vjp)(g)[0], g)
        barred = lambda x: _loss(platforms.residual_barrier(x))  # noqa: E731
        np.testing.assert_array_equal(jax.jit(jax.grad(barred))(x), jax.jit(jax.grad(_loss))(x))


@pytest.mark.slow
def test_gradient_keeps_nan_and_inf():
    x = jnp.asarray([[[np.nan, np.inf, -np.inf, 1.0]]], jnp.float32)
    g = jax.grad(lambda x: jnp.sum(platforms.residual_barrier(x) * 3.0))(x)
    np.testing.assert_array_equal(g, np.full((1, 1, 4), 3.0, np.float32))
    g = jax.grad(lambda y: jnp.sum(platforms.residual_barrier(y) * x))(jnp.ones_like(x))
    np.testing.assert_array_equal(g, x)


@pytest.mark.slow
def test_grad_of_vmap_and_vmap_of_grad_equal_no_barrier():
    x = jnp.asarray(np.random.default_rng(2).standard_normal((3, 2, 4)), jnp.float32)
    barred = lambda x: _loss(platforms.residual_barrier(x))  # noqa: E731
    outer = [jax.grad(lambda x, f=f: jnp.sum(jax.vmap(f)(x)))(x) for f in (barred, _loss)]
    np.testing.assert_array_equal(outer[0], outer[1])
    np.testing.assert_array_equal(jax.vmap(jax.grad(barred))(x), jax.vmap(jax.grad(_loss))(x))


def test_empty_complex_and_forward_mode():
    empty = jnp.ones((0, 3), jnp.float32)
    assert jax.grad(lambda x: jnp.sum(platforms.residual_barrier(x)))(empty).shape == (0, 3)
    z = jnp.asarray([1 + 2j, 3 - 1j], jnp.complex64)  # passed through, not rounded
    np.testing.assert_array_equal(jax.vjp(platforms.residual_barrier, z)[1](z)[0], z)
    with pytest.raises(TypeError, match="forward-mode"):  # documented: reverse mode only
        jax.jvp(platforms.residual_barrier, (empty,), (empty,))


def _largest_fusion_operands(cfg: ViTConfig) -> tuple[int, bool]:
    """Operands of the largest fusion in the compiled gradient of the model ``cfg``, and whether the
    program has a conditional (the barrier)."""
    graphdef, params, rest = nnx.split(vit_model.VisionTransformer(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)

    def loss(p, x):
        return jnp.sum(nnx.merge(graphdef, p, rest)(x))

    text = jax.jit(jax.grad(loss)).lower(params, jnp.ones((2, 32, 32, 3))).compile().as_text()
    entry = text[text.index("ENTRY") :]
    fusions = [line.split(" fusion(", 1)[1].split(")", 1)[0] for line in entry.splitlines() if " fusion(" in line]
    return max(len(re.findall(r"%[\w.\-]+", f)) for f in fusions), " conditional(" in text


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the barrier is used on CPU only")
def test_backward_fusions_do_not_grow_with_depth(small_cfg):
    # Without the barrier the largest fusion took 48 operands at depth 2 and 159 at depth 8
    # (jax 0.10.2): every block's LayerNorm backward recomputed inside the next.
    shallow, has_cond = _largest_fusion_operands(small_cfg.replace(depth=2))
    deep, _ = _largest_fusion_operands(small_cfg.replace(depth=8))
    assert has_cond
    assert deep == shallow, f"largest backward fusion grew from {shallow} operands (depth 2) to {deep} (depth 8)"
