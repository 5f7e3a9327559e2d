"""Typed PRNG keys in checkpoints: the one place the JAX twin turns them into plain integers and back.

A model with dropout or drop path holds its RNG streams as typed key arrays (``jax.random.key``, dtype
``key<impl>``). Orbax stores, and restores into abstract targets, plain uint32 arrays in every version,
typed key dtypes not always; so a checkpoint holds each key's ``jax.random.key_data`` (uint32
[..., 2] for threefry2x32) and the implementation's name, and a restore wraps the data again
(``jax.random.wrap_key_data``). Used by the orbax model folders (``vit_jax.formats``) and the training
checkpoints (``vit_jax.checkpointing.Checkpoints``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def is_key(x) -> bool:
    """True for a typed PRNG key array or an abstract one (``jax.ShapeDtypeStruct`` of a key dtype)."""
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def keys_to_data(tree):
    """``tree`` with each typed key array replaced by its uint32 key data; abstract keys by the abstract
    key data (``jax.ShapeDtypeStruct`` uint32, keeping the leaf's sharding), a restore target."""

    def data(x):
        if not is_key(x):
            return x
        if isinstance(x, jax.Array):
            return jax.random.key_data(x)
        shape = jax.eval_shape(jax.random.key_data, x).shape
        return jax.ShapeDtypeStruct(shape, jnp.uint32, sharding=getattr(x, "sharding", None))

    return jax.tree.map(data, tree)


def data_to_keys(tree, template, impl: str | None):
    """Inverse of ``keys_to_data``: the uint32 data wrapped back into keys of implementation ``impl``
    (``key_impl_name``'s; None for the default) wherever ``template`` (same structure) has keys."""
    return jax.tree.map(lambda x, t: jax.random.wrap_key_data(x, impl=impl) if is_key(t) else x, tree, template)


def key_impl_name(tree=None) -> str:
    """Name of the PRNG implementation of the first key in ``tree`` (default: of the default one, which
    ``nnx.Rngs`` uses), e.g. 'threefry2x32'; '' when ``tree`` holds no key."""
    keys = [x for x in jax.tree.leaves(tree if tree is not None else jax.random.key(0)) if is_key(x)]
    return str(jax.random.key_impl(keys[0])) if keys else ""
