"""Checksums of a training checkpoint's state, computed on the devices: orbax stores none, so a data file
zero-filled, with a byte flipped or overwritten by other data of its size reads back as other values without
an error.

``checksums(state)`` is one uint32 per leaf of the state (PRNG keys as their key data, as a checkpoint holds
them), keyed by the leaf's path, its keys joined by dots (``params.blocks.0.attn.qkv.kernel``,
``opt_state.0.mu.head.bias``, ``step``): each element's bits as uint32 words (8- and 16-bit types widened,
64-bit types as two words), each word xor-ed with a multiple of its flat position in the leaf and mixed by
murmur3's 32-bit finaliser (a bijection, so any change of one word changes the sum; a swapped or shifted
block changes its positions), the mixed words summed modulo 2**32. A modular sum of integers is exact in any
order, so the value does not depend on the mesh, the sharding or XLA's reduction order: a checkpoint written
on a 2x4 mesh checks on 8x1 or one device. One jitted pass over the state on its devices, one uint32 per leaf
to the host; with several processes each runs it over the global arrays and gets the same values.

``check`` compares a restored state with the values recorded when it was saved
(``vit_jax.checkpointing.Checkpoints`` keeps them in each step's metadata, under ``RECORD_KEY``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vit_jax.keys import keys_to_data

RECORD_KEY = "state_checksums"  # the metadata entry holding them

_GOLDEN = 0x9E3779B9  # odd: distinct positions give distinct multiples (mod 2**32)


class ChecksumError(ValueError):
    """A restored state that differs from the checksums recorded when it was saved (the message names the
    checkpoint and the leaf)."""


def _path(path) -> str:
    """A leaf's key path as its keys joined by dots."""
    parts = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey | jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            parts.append(k.name)
    return ".".join(parts)


def _mix(h: jax.Array) -> jax.Array:
    """murmur3's 32-bit finaliser (fmix32), elementwise on uint32."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def leaf_checksum(x: jax.Array) -> jax.Array:
    """The uint32 checksum of one array (any shape; bool, 8-, 16-, 32- or 64-bit elements), as a scalar."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        words = x.astype(jnp.uint32)
    elif x.dtype.itemsize == 8:
        words = lax.bitcast_convert_type(x, jnp.uint32)  # x.shape + (2,)
    else:
        words = lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}")).astype(jnp.uint32)
    pos = jnp.zeros(words.shape, jnp.uint32)  # the flat (C-order) position, in x's own shape and sharding
    for d, n in enumerate(words.shape):
        pos = pos * jnp.uint32(n) + lax.broadcasted_iota(jnp.uint32, words.shape, d)
    return jnp.sum(_mix(words ^ (pos * jnp.uint32(_GOLDEN))), dtype=jnp.uint32)


@functools.lru_cache(maxsize=8)
def _summed(out_sharding):
    return jax.jit(lambda leaves: jnp.stack([leaf_checksum(x) for x in leaves]), out_shardings=out_sharding)


def checksums(state) -> dict[str, int]:
    """{leaf path: uint32 checksum} of a pytree of arrays (typed PRNG keys as their key data), in the tree's
    leaf order. Every process of a multi-process run calls it alike (a collective over the global arrays)."""
    flat = jax.tree_util.tree_flatten_with_path(keys_to_data(state))[0]
    if not flat:
        return {}
    meshes = [x.sharding.mesh for _, x in flat if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)]
    replicated = jax.sharding.NamedSharding(meshes[0], jax.sharding.PartitionSpec()) if meshes else None
    sums = _summed(replicated)(tuple(x for _, x in flat))
    values = np.asarray(sums.addressable_data(0))  # replicated: every process holds all of it
    return {_path(p): int(v) for (p, _), v in zip(flat, values, strict=True)}


def check(recorded, state, where: str) -> None:
    """Compare ``state`` (as restored) with ``recorded`` (``checksums`` of it when it was saved).

    Raises:
        ChecksumError: ``recorded`` is not a mapping of paths to integers, or a leaf's checksum differs from
            its entry, or the leaf or its entry is missing: one line naming ``where`` and the leaf's path.
    """
    if not isinstance(recorded, Mapping) or not all(isinstance(v, int) for v in recorded.values()):
        raise ChecksumError(f"{where}: the metadata's {RECORD_KEY} entry is not a mapping of leaf paths to integers")
    found = checksums(state)
    for path in [*found, *(p for p in recorded if p not in found)]:
        if found.get(path) != recorded.get(path):
            raise ChecksumError(
                f"{where}: the state's {path} does not match the checksum recorded when the checkpoint was "
                "written: its data files were changed or damaged"
            )
