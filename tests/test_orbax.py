"""Orbax checkpoints of the JAX twin (vit_jax.formats), dropout RNG state included."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vit_jax
from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.errors import FormatError
from vit_jax.formats import READERS, WRITERS, load_orbax, save_orbax


def _flat(model) -> dict:
    return _flat_state(nnx.state(model))


def _flat_state(state) -> dict:
    out = {}
    for path, v in nnx.to_flat_state(state):
        x = v[...]
        out[path] = np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
    return out


def test_abstract_model_is_the_traced_constructor(small_cfg, random_state):
    """vit_jax.weights.abstract_model (the RNG counters in numpy while tracing) gives the graphdef, shapes
    and dtypes of nnx.eval_shape of the constructor itself, RNG streams of a model with dropout included."""
    from vit_jax.model import VisionTransformer
    from vit_jax.weights import abstract_model

    cfg = small_cfg.replace(dropout=0.1, drop_path=0.1)
    graphdef, state = nnx.split(abstract_model(cfg))
    want_graphdef, want = nnx.split(nnx.eval_shape(lambda: VisionTransformer(cfg, rngs=nnx.Rngs(0))))
    flat = jax.tree_util.tree_flatten_with_path
    shapes = lambda st: [(jax.tree_util.keystr(p), x.shape, x.dtype) for p, x in flat(nnx.to_pure_dict(st))[0]]  # noqa: E731
    assert graphdef == want_graphdef and shapes(state) == shapes(want)
    assert any("rngs" in p for p, *_ in shapes(state))
    # from_numpy's RNG state (built under jit the same way) holds the keys and counts of the constructor's
    rest = nnx.state(vit_jax.from_numpy(cfg, random_state(cfg), seed=3), nnx.Not(nnx.Param))
    want_rest = nnx.state(VisionTransformer(cfg, rngs=nnx.Rngs(3)), nnx.Not(nnx.Param))
    assert {p: v.tobytes() for p, v in _flat_state(rest).items()} == {
        p: v.tobytes() for p, v in _flat_state(want_rest).items()
    }


@pytest.mark.slow
def test_model_with_dropout_restores_into_an_abstract_model(tmp_path, small_cfg, random_state):
    """Dropout and drop path give the model RNG state (typed PRNG keys); save, restore into a model
    built with nnx.eval_shape: parameters and RNG state (keys and counts) bit-equal, logits identical."""
    cfg = small_cfg.replace(dropout=0.1, attn_dropout=0.1, drop_path=0.1)
    model = vit_jax.from_numpy(cfg, random_state(cfg), seed=3)
    save_orbax(tmp_path / "ck", model)
    restored = load_orbax(tmp_path / "ck")
    before, after = _flat(model), _flat(restored)
    assert before.keys() == after.keys() and sum("rngs" in map(str, p) for p in before) >= 2 * cfg.depth
    for p in before:
        assert before[p].dtype == after[p].dtype and before[p].tobytes() == after[p].tobytes(), p
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 32, 32, 3)), jnp.float32)
    forward = nnx.jit(lambda m, images: m(images))
    assert np.asarray(forward(model, x)).tobytes() == np.asarray(forward(restored, x)).tobytes()


@pytest.mark.slow
def test_orbax_through_convert_round_trips_bit_exact(tmp_path, small_cfg, random_state, assert_same_state):
    cfg = small_cfg.replace(param_dtype="bfloat16", reg_tokens=2, posemb_prefix=False)
    state = random_state(cfg, dtype=jnp.bfloat16)
    save_checkpoint(tmp_path / "o", cfg, state, "orbax", writers=WRITERS)
    ckpt = load_checkpoint(tmp_path / "o", readers=READERS)
    assert ckpt.report.format == "orbax" and ckpt.cfg == cfg
    assert_same_state(ckpt.state, state)
    model = vit_jax.load_model(tmp_path / "o", image_size=48)  # resampled at load time
    assert model.pos_embed[...].shape == (1, 36, cfg.width)


def test_an_orbax_folder_reads_back_the_preprocessing_and_classes_it_declares(tmp_path, small_cfg, random_state):
    """The preprocessing and class names an orbax folder stores (JSON text in vit_config.json, as a
    safetensors header holds them) are read back as declared, equal to what was written (before: every
    command refused the folder, parsing the text as a mapping)."""
    from vit_common.data.images import PRESETS

    cfg = small_cfg.replace(num_classes=3)
    pre = PRESETS["imagenet"].replace(crop_pct=0.9, crop_mode="center")
    save_checkpoint(
        tmp_path / "o", cfg, random_state(cfg), "orbax", writers=WRITERS, preprocess=pre, classes=["a", "b", "c"]
    )
    info = load_checkpoint(tmp_path / "o", readers=READERS).info
    assert info.preprocess == pre and info.preprocess_source.startswith("declared")
    assert info.classes == ("a", "b", "c") and info.classes_source.startswith("declared")


@pytest.mark.slow
def test_an_orbax_folder_records_what_its_source_assumed(tmp_path, small_cfg, random_state):
    """A timm file states no GELU or eps: the orbax folder converted from it keeps them assumed (no warning
    that readers take them as fact), and strict reading refuses them."""
    from safetensors.numpy import save_file

    from vit_common.checkpoints.convert import convert

    save_file(random_state(small_cfg), str(tmp_path / "bare.safetensors"))
    report = convert(tmp_path / "bare.safetensors", tmp_path / "o", to_fmt="orbax", writers=WRITERS, readers=READERS)
    assert "gelu" in report.assumed and not [w for w in report.warnings if "cannot record" in w]
    back = load_checkpoint(tmp_path / "o", readers=READERS).report
    assert back.assumed == report.assumed and "assumed when this file was converted" in back.provenance["gelu"].source
    with pytest.raises(FormatError, match="strict reading refuses"):
        load_checkpoint(tmp_path / "o", readers=READERS, strict=True)


def test_damaged_orbax_folder_is_named(tmp_path, small_cfg, random_state):
    save_checkpoint(tmp_path / "o", small_cfg, random_state(small_cfg), "orbax", writers=WRITERS)
    meta = json.loads((tmp_path / "o" / "vit_config.json").read_text())
    meta["vit_config"] = small_cfg.replace(depth=3).to_json()  # one block more than the state holds
    (tmp_path / "o" / "vit_config.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="orbax could not restore"):
        load_checkpoint(tmp_path / "o", readers=READERS)
    (tmp_path / "o" / "vit_config.json").write_text("not json")
    with pytest.raises(FormatError, match="vit_config.json"):
        load_checkpoint(tmp_path / "o", readers=READERS)


def test_an_orbax_folder_records_each_arrays_crc32_and_one_without_them_still_reads(
    tmp_path, small_cfg, random_state, assert_same_state
):
    """vit_config.json records the CRC-32 of every array's bytes as written (the restored arrays' bytes, by
    zlib.crc32), the state reads back bit-exact through the check, and with the record removed (a folder of
    an older vit) it reads back the same."""
    import zlib

    from vit_common.checkpoints.formats.state_crc import RECORD_KEY

    state = random_state(small_cfg)
    save_checkpoint(tmp_path / "o", small_cfg, state, "orbax", writers=WRITERS)
    config = tmp_path / "o" / "vit_config.json"
    meta = json.loads(config.read_text())
    restored = {
        ".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(load_orbax(tmp_path / "o")))
    }
    assert meta[RECORD_KEY] == {
        p: {"dtype": a.dtype.name, "shape": list(a.shape), "crc32": zlib.crc32(a.tobytes())}
        for p, a in restored.items()
    }
    assert_same_state(load_checkpoint(tmp_path / "o", readers=READERS).state, state)
    del meta[RECORD_KEY]
    config.write_text(json.dumps(meta))
    assert_same_state(load_checkpoint(tmp_path / "o", readers=READERS).state, state)


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(24, dtype=np.float32).reshape(4, 6).T,  # a transposed view, copied a chunk at a time
        np.arange(24, dtype=">f4").reshape(2, 3, 4),  # big-endian: its little-endian bytes
        np.arange(6, dtype=np.float32).reshape(2, 3).astype(jnp.bfloat16),
        np.float32(3.5),
        np.zeros((0, 3), np.uint32),
    ],
    ids=["transposed", "big-endian", "bfloat16", "0-d", "empty"],
)
def test_array_crc32_is_that_of_the_little_endian_c_order_bytes(arr, monkeypatch):
    import zlib

    from vit_common.checkpoints.formats import state_crc

    monkeypatch.setattr(state_crc, "CHUNK_BYTES", 8)  # chunks of a row or less
    expected = zlib.crc32(np.asarray(arr, np.asarray(arr).dtype.newbyteorder("<")).tobytes())
    assert state_crc.array_crc32(np.asarray(arr)) == expected


def test_a_malformed_checksum_entry_is_named_as_the_json_file_s_not_as_damaged_data():
    """Each malformed value of an entry is refused as vit_config.json's entry, before any array is compared."""
    from vit_common.checkpoints.formats.errors import FormatError
    from vit_common.checkpoints.formats.state_crc import check_record, record

    tree = {"a": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}
    good = record(tree)["a.kernel"]
    for field, value in [("crc32", v) for v in (-1, 2**40, True, "abc", 1.5, None)] + [
        ("dtype", "object"),
        ("shape", "64"),
    ]:
        with pytest.raises(FormatError, match=r"^F: vit_config.json's state_crc32 entry is malformed: a.kernel has "):
            check_record({"a.kernel": good | {field: value}}, tree, "F", "vit_config.json")
    check_record({"a.kernel": good}, tree, "F", "vit_config.json")
