"""How XLA computes the JAX twin on the platform at hand, chosen once when a model is built.

``vit_jax/model.py`` says what a ViT computes, in its torch twin's order; this module holds the
choices that depend on where it runs, so that no block asks again at every call:

- ``Platform``: the device kind a model is built for (``Platform.current()``), with the Linear layer
  class and the residual-stream function it uses.
- attention: ``choose_attention`` is a pure function of platform, dtype, head dim, requested backend
  and mode that names the kernel ('explicit', 'xla' or 'cudnn'); ``dot_product_attention`` runs the
  fused kernels and pads the sequence where cuDNN needs it.
- XLA:CPU workarounds: ``FlatLinear`` and ``residual_barrier``.
- ``gelu``: exact GELU written through erf, on every platform.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

KERNELS = ("explicit", "xla", "cudnn")
# cuDNN flash attention (jax.nn.dot_product_attention(implementation='cudnn')): bf16/fp16 q, k, v;
# head dim a multiple of 8, at most 128 (256 from compute capability 9.0); compute capability 8.0 or
# later (jax/_src/cudnn/fused_attention_stablehlo.py, check_layout and check_is_flash_attention).
CUDNN_DTYPES = ("bfloat16", "float16")
# Sequence lengths the differentiated cuDNN kernel accepts are multiples of this. JAX passes its
# custom call a placeholder bias even when there is none, so in training it applies the rule for
# "patterns with bias": query and key lengths even (check_is_flash_attention; an H200 with jax
# 0.11.2 refused L=197 and took 200, 208, 224, 256). The smallest legal padding is the cheapest
# one: cuDNN's forward + backward time grows with L (0.99, 1.04, 1.05, 1.10 ms at L=200, 208,
# 224, 256 for [256, L, 12, 64] bf16 on that H200) and padding to a multiple of 2 adds at most
# one token.
CUDNN_TRAIN_MULTIPLE = 2


@dataclass(frozen=True)
class Platform:
    """The device kind a model computes on.

    Fields:
        name: 'cpu', 'cuda' (NVIDIA GPU), 'rocm' (AMD GPU), 'tpu', or another JAX platform name.
        compute_capability: (major, minor) of an NVIDIA GPU, else None.
    """

    name: str
    compute_capability: tuple[int, int] | None = None

    @classmethod
    def current(cls) -> Platform:
        """The platform models are built for: JAX's default device (``jax.devices()[0]``), or the one
        ``building_for`` names."""
        if _BUILDING_FOR:
            return _BUILDING_FOR[-1]
        dev = jax.devices()[0]
        if dev.platform != "gpu":
            return cls(dev.platform)
        if "cuda" not in dev.client.platform_version.lower():
            return cls("rocm")
        cc = getattr(dev, "compute_capability", None)
        return cls("cuda", tuple(int(p) for p in cc.split(".")[:2]) if cc else None)

    @property
    def linear(self) -> type[nnx.Linear]:
        """The Linear layer class: ``FlatLinear`` on CPU, ``nnx.Linear`` elsewhere (same parameters)."""
        return FlatLinear if self.name == "cpu" else nnx.Linear

    @property
    def residual(self):
        """Applied to the residual stream before each block: ``residual_barrier`` on CPU, else identity.

        On a GPU the barrier's conditional would wait for its predicate on the host.
        """
        return residual_barrier if self.name == "cpu" else _identity


def _identity(x: jax.Array) -> jax.Array:
    return x


_BUILDING_FOR: list[Platform] = []


@contextlib.contextmanager
def building_for(platform: Platform) -> Iterator[Platform]:
    """Inside the block, models are built for ``platform`` instead of JAX's default device: to compile
    them for a device this machine does not have (JAX's deviceless ahead-of-time compilation)."""
    _BUILDING_FOR.append(platform)
    try:
        yield platform
    finally:
        _BUILDING_FOR.pop()


# ------------------------------------------------------------------------------------ attention


def choose_attention(
    platform: Platform,
    *,
    dtype: str,
    head_dim: int,
    backend: str | None = None,
    dropout: bool = False,
    probabilities: bool = False,
) -> str:
    """The attention kernel for one call: 'explicit', 'xla' or 'cudnn'.

    Args:
        platform: where it runs.
        dtype: compute dtype of q, k and v.
        head_dim: D/N.
        backend: ``ViTConfig.attn_backend``: None (choose), 'xla' or 'cudnn' (taken as asked).
        dropout: attention dropout is live (training mode with attn_dropout > 0).
        probabilities: the caller wants the attention probabilities.

    Rules, in order:
        1. probabilities, live dropout or float64 -> 'explicit' (softmax written out). The fused op
           returns no probabilities and has no dropout, and it rounds float64 logits to float32
           before its softmax (jax/_src/nn/functions.py).
        2. a requested backend -> that backend.
        3. an NVIDIA GPU of compute capability >= 8.0 with bf16/fp16 and a head dim cuDNN takes (a
           multiple of 8, <= 128, or <= 256 from capability 9.0) -> 'cudnn', flash attention: on an
           H200 at B/16 it ran forward + backward in 0.35x the time of 'xla' (any token count, see
           ``dot_product_attention``) and holds no [B, N, L, L] probabilities for the backward pass.
        4. CPU -> 'explicit': XLA:CPU has no fused kernel, and its 'xla' form (einsums over
           [B, L, N, D/N]) ran ~1.5x slower than the written-out softmax over [B, N, L, D/N].
        5. otherwise (TPU, AMD GPUs, float32 on NVIDIA GPUs) -> 'xla'.
    """
    if probabilities or dropout or dtype == "float64":
        return "explicit"
    if backend is not None:
        return backend
    if platform.name == "cuda" and dtype in CUDNN_DTYPES:
        cc = platform.compute_capability or (0, 0)
        max_head_dim = 256 if cc >= (9, 0) else 128
        if cc >= (8, 0) and head_dim % 8 == 0 and head_dim <= max_head_dim:
            return "cudnn"
    return "explicit" if platform.name == "cpu" else "xla"


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float, implementation: str, multiple: int
) -> jax.Array:
    """``jax.nn.dot_product_attention`` with the token axes padded to multiples of ``multiple``.

    q [B, T, N, D/N], k and v [B, S, N, D/N] -> [B, T, N, D/N]. Zero rows are appended to q, k and
    v; ``key_value_seq_lengths`` = S masks the padded keys out of every softmax, and the padded
    query rows are sliced off the output, so neither changes the result or the gradient (padded
    rows get a zero cotangent).
    """
    s = k.shape[1]
    lengths = jnp.full((q.shape[0],), s, jnp.int32) if _round_up(s, multiple) != s else None
    return _attention_padded(q, k, v, scale, implementation, multiple, lengths)


def _attention_padded(q, k, v, scale: float, implementation: str, multiple: int, lengths) -> jax.Array:
    """``jax.nn.dot_product_attention`` of q, k, v with zero rows appended to the token axes up to
    multiples of ``multiple``, ``key_value_seq_lengths`` = ``lengths`` [B] (None: all keys), the padded
    query rows sliced off."""
    t, s = q.shape[1], k.shape[1]
    tp, sp = _round_up(t, multiple), _round_up(s, multiple)

    def pad(x: jax.Array, n: int) -> jax.Array:
        return jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, 0)))

    out = jax.nn.dot_product_attention(
        pad(q, tp), pad(k, sp), pad(v, sp), scale=scale, key_value_seq_lengths=lengths, implementation=implementation
    )
    return out[:, :t]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _padded_when_differentiated(q, k, v, scale: float, implementation: str, multiple: int) -> jax.Array:
    """Unpadded when only evaluated; ``padded_attention`` (forward and backward) when differentiated."""
    return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation=implementation)


def _padded_fwd(q, k, v, scale, implementation, multiple):
    # jax.vjp's function is a pytree of the residuals: it is what the backward pass needs.
    return jax.vjp(
        lambda q, k, v: padded_attention(q, k, v, scale=scale, implementation=implementation, multiple=multiple),
        q,
        k,
        v,
    )


def _padded_bwd(scale, implementation, multiple, vjp, g):
    return vjp(g)


_padded_when_differentiated.defvjp(_padded_fwd, _padded_bwd)


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float,
    implementation: str,
    multiple: int | None = None,
    token_mask: jax.Array | None = None,
) -> jax.Array:
    """Fused attention: q [B, T, N, D/N], k and v [B, S, N, D/N] -> [B, T, N, D/N] in q's dtype.

    ``token_mask`` [B, S] bool, True on each row's first keys only (NaFlex padding last:
    ``vit_common.naflex.check_batch``): the keys after them are left out, given to the kernel as
    ``key_value_seq_lengths``, the padding mask that both XLA and cuDNN (``MaskType.PADDING``) take; the
    token axes are then padded to multiples of ``multiple`` always (``_attention_padded``: the padded keys
    lie past every row's length), so that a NaFlex training step differentiates cuDNN's kernel too.

    ``implementation`` 'xla' or 'cudnn' (``jax.nn.dot_product_attention``). cuDNN's forward-only
    kernel takes any T and S; its differentiated form needs multiples of ``multiple`` (default
    ``CUDNN_TRAIN_MULTIPLE`` for cuDNN, 1 for XLA). When T or S is not one, evaluation stays
    unpadded and differentiation goes through ``padded_attention`` (a ``custom_vjp``; so, like
    cuDNN's own kernel, reverse mode only).
    """
    if multiple is None:
        multiple = CUDNN_TRAIN_MULTIPLE if implementation == "cudnn" else 1
    if token_mask is not None:
        lengths = token_mask.sum(axis=-1, dtype=jnp.int32)  # [B]
        return _attention_padded(q, k, v, scale, implementation, multiple, lengths)
    if q.shape[1] % multiple == 0 and k.shape[1] % multiple == 0:
        return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation=implementation)
    return _padded_when_differentiated(q, k, v, scale, implementation, multiple)


# ------------------------------------------------------------------------------------- GELU


def gelu(x: jax.Array, approximate: bool) -> jax.Array:
    """GELU; exact is x/2 (1 + erf(x / sqrt 2)), torch's formula; approximate is the tanh form.

    jax.nn.gelu's exact form goes through erfc, which XLA expands into a polynomial plus an exp
    (about 60 FLOPs per element on CPU); erf is one HLO op on every backend.
    """
    if approximate:
        return jax.nn.gelu(x, approximate=True)
    return x * 0.5 * (1.0 + jax.lax.erf(x * np.sqrt(0.5).astype(x.dtype)))


# ---------------------------------------------------------------------------- XLA:CPU workarounds


class FlatLinear(nnx.Linear):
    """nnx.Linear that multiplies [..., D_in] as one [M, D_in] @ [D_in, D_out] matrix product.

    Same parameters and math as nnx.Linear. Flattening the leading dims first gives the weight
    gradient a single contracting dim, which XLA on CPU computes as one dot; with [B, L, D] inputs it
    transposes the activations first (a Ti/16 training step on CPU took 1.45x as long).
    """

    def __call__(self, x: jax.Array) -> jax.Array:
        return super().__call__(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], self.out_features)


_BARRIER_DTYPES = tuple(jnp.dtype(d) for d in ("float16", "bfloat16", "float32", "float64"))


def _same_bits(x: jax.Array) -> jax.Array:
    """Identity written as a rounding to x's own float format (so XLA cannot tell it from a real op).

    Exact for IEEE formats with infinities (those in ``_BARRIER_DTYPES``), not for e.g. float8_e4m3fn.
    """
    fi = jnp.finfo(x.dtype)
    return jax.lax.reduce_precision(x, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)


def _materialize(g: jax.Array) -> jax.Array:
    """g, through a ``lax.cond`` whose two branches are both the identity (XLA never fuses across one)."""
    if g.size == 0 or g.dtype not in _BARRIER_DTYPES:
        return g
    return jax.lax.cond(jnp.isnan(g.reshape(-1)[0]), lambda g: g, _same_bits, g)


@jax.custom_vjp
def residual_barrier(x: jax.Array) -> jax.Array:
    """Identity on the residual stream [B, L, D] whose gradient XLA must write to memory once.

    Without it XLA on CPU fuses the backward pass's chain of residual-gradient sums (one per
    LayerNorm) into every consumer, recomputing all later blocks' LayerNorm backward in each
    block: quadratic in depth (fusions of up to 170 operands in a Ti/16 training step). The
    cotangent goes through ``_materialize``; an ``optimization_barrier`` would not do, XLA:CPU
    removes it before fusion. The barrier's value and its vjp are the identity bit for bit; the
    rest of a jitted backward pass may round differently (1 ulp) because XLA fuses it differently.
    With the batch sharded the predicate costs one scalar all-reduce; under ``jax.vmap`` the cond
    becomes a select and the barrier has no effect. Reverse mode only: ``jax.jvp`` through it
    raises TypeError (a custom_jvp form cannot be transposed once vmap turns its cond into a
    select, which breaks ``grad`` of a vmapped model).
    """
    return x


residual_barrier.defvjp(lambda x: (x, None), lambda _, g: (_materialize(g),))
