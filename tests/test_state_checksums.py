"""Training checkpoints' checksums (vit_jax.state_checksums): golden values (a checkpoint written now checks in a
later version), every small change of a leaf changes its value, a Checkpoints save records them and its restore
checks them, and a checkpoint without them (of an earlier version) restores as before. Their equality across
meshes is tests/test_multidevice.py's; refused --resume runs are tests/hostile/test_train.py's."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.checkpointing import Checkpoints
from vit_jax.state_checksums import RECORD_KEY, ChecksumError, check, checksums, leaf_checksum


def _state():
    rng = np.random.default_rng(0)
    return {
        "step": jnp.int32(7),
        "params": {"kernel": jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)},
        "ema": {"kernel": jnp.asarray(rng.standard_normal((4, 6)), jnp.bfloat16)},
        "rest": {"key": jax.random.key(3), "mask": jnp.asarray([True, False, True])},
    }


def _reference(x: np.ndarray) -> int:
    """The module's definition in numpy, on the host: words, xor 0x9E3779B9 * position, fmix32, sum."""
    words = x.astype(np.uint32) if x.dtype == bool else x.view(f"<u{x.dtype.itemsize}").astype(np.uint32)
    h = words.reshape(-1) ^ (np.arange(words.size, dtype=np.uint32) * np.uint32(0x9E3779B9))
    for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h = (h ^ (h >> np.uint32(shift))) * np.uint32(factor)
    return int(np.sum(h ^ (h >> np.uint32(16)), dtype=np.uint32))


def test_golden_values_keyed_by_path_as_the_definition_gives_them():
    state = _state()
    assert checksums(state) == {
        "ema.kernel": 2280953286,
        "params.kernel": 4054448276,
        "rest.key": 2527132011,
        "rest.mask": 4141144917,
        "step": 415870660,
    }
    host = {k: np.asarray(v) for k, v in [("ema.kernel", state["ema"]["kernel"]), ("step", state["step"])]}
    host |= {"params.kernel": np.asarray(state["params"]["kernel"]), "rest.mask": np.asarray(state["rest"]["mask"])}
    host["rest.key"] = np.asarray(jax.random.key_data(state["rest"]["key"]))
    assert {k: _reference(v) for k, v in host.items()} == checksums(state)


def _value(x) -> int:
    return int(jax.jit(leaf_checksum)(x))


def test_zeros_a_flipped_bit_swapped_and_shifted_elements_change_the_value():
    x = np.asarray(_state()["params"]["kernel"])
    flipped = x.view(np.uint32).copy()
    flipped[1, 2] ^= 1 << 31  # the sign of one element
    twice = flipped.copy()
    twice[3, 0] ^= 1 << 31  # and of another: the two top bits do not cancel
    swapped = x.copy()
    swapped[0, [1, 4]] = swapped[0, [4, 1]]
    shifted = np.roll(x, 1, axis=1)
    variants = [np.zeros_like(x), flipped.view(np.float32), twice.view(np.float32), swapped, shifted]
    values = [_value(x), *map(_value, variants), _value(x.reshape(6, 4))]
    assert len(set(values[:-1])) == len(values) - 1  # (the same bytes in another shape: the same value)
    assert values[-1] == values[0]
    assert _value(jnp.zeros((), jnp.float32)) != _value(jnp.zeros((2,), jnp.float32))


def test_check_names_the_first_leaf_that_differs_and_refuses_a_bad_record():
    state = _state()
    recorded = checksums(state)
    check(recorded, state, "ck/7")
    changed = {**state, "ema": {"kernel": state["ema"]["kernel"].at[0, 0].add(1)}}
    with pytest.raises(ChecksumError, match=r"^ck/7: the state's ema\.kernel does not match the checksum recorded "):
        check(recorded, changed, "ck/7")
    with pytest.raises(ChecksumError, match=r"^ck/7: the state's gone does not match"):
        check({**recorded, "gone": 1}, state, "ck/7")
    with pytest.raises(ChecksumError, match=rf"^ck/7: the metadata's {RECORD_KEY} entry is not a mapping of leaf"):
        check({"step": "7"}, state, "ck/7")


def _abstract(state):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def test_a_checkpoint_records_them_and_checks_them_and_one_without_restores_unchecked(tmp_path):
    state = _state()
    ckpts = Checkpoints(tmp_path / "ck")
    ckpts.save(7, state, {"step": 7})
    ckpts.close()
    meta_file = tmp_path / "ck" / "7" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    assert meta[RECORD_KEY] == checksums(state)
    restored, back = Checkpoints(tmp_path / "ck").restore(_abstract(state))
    assert back == {"step": 7, "key_impl": "threefry2x32"}
    assert checksums(restored) == meta[RECORD_KEY]
    meta[RECORD_KEY]["params.kernel"] ^= 1  # as if the data had changed
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ChecksumError, match=rf"^{tmp_path}/ck/7: the state's params\.kernel does not match"):
        Checkpoints(tmp_path / "ck").restore(_abstract(state))
    del meta[RECORD_KEY]  # a checkpoint of an earlier version
    meta_file.write_text(json.dumps(meta))
    restored, _ = Checkpoints(tmp_path / "ck").restore(_abstract(state))
    assert np.array_equal(restored["params"]["kernel"], state["params"]["kernel"])
