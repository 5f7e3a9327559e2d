"""NaFlex batches (``vit_common.naflex``): the checks a batch passes before a twin runs it, the patch order,
and the per-image position-table weights against big_vision naflex_vit's ``_pos_emb_resize``."""

from __future__ import annotations

import numpy as np
import pytest

from vit_common.config import ViTConfig
from vit_common.naflex import check_batch, pad_batch, patchify, position_weights

CFG = ViTConfig(image_size=32, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64, class_token=False, pool="map")


def _batch():
    rng = np.random.default_rng(0)
    return pad_batch([rng.standard_normal((h, w, 3)).astype(np.float32) for h, w in ((16, 40), (8, 8))], (8, 8), 12)


def test_patches_are_row_major_and_flattened_p_p_c():
    image = np.arange(16 * 24 * 3, dtype=np.float32).reshape(16, 24, 3)
    p = patchify(image, (8, 8))
    assert p.shape == (6, 192)
    assert np.array_equal(p[4].reshape(8, 8, 3), image[8:16, 8:16])  # row 1, column 1 of a 2x3 grid
    patches, mask, shapes = _batch()
    assert patches.shape == (2, 12, 192) and shapes.tolist() == [[2, 5], [1, 1]]
    assert mask.sum(axis=1).tolist() == [10, 1] and not patches[1, 1:].any()
    got_mask, got_shapes = check_batch(CFG, patches.shape, mask.astype(np.int32), shapes.astype(np.int32))
    assert np.array_equal(got_mask, mask) and got_shapes.dtype == np.int64


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda p, m, s: (p, m, np.array([[4, 4], [1, 1]])),
            r"image 0 needs 4x4 = 16 patches, more than the maximum N=12",
        ),
        (lambda p, m, s: (p, m[:, :11], s), r"patch_mask of shape \(2, 11\): expected \[B=2, N=12\]"),
        (lambda p, m, s: (p, np.roll(m, 1, axis=1), s), r"patch_mask row 0 marks 10 patches; its spatial shape 2x5"),
        (lambda p, m, s: (p, m, np.array([[2, 5], [0, 1]])), r"spatial_shapes of shape \(2, 2\): expected"),
        (
            lambda p, m, s: (p[..., :96], m, s),
            r"NaFlex patches of shape \(2, 12, 96\): expected \[B, N, P\*P\*C = 192\]",
        ),
    ],
)
def test_a_bad_batch_is_one_line_naming_the_value(change, message):
    patches, mask, shapes = change(*_batch())
    with pytest.raises(ValueError, match=message) as e:
        check_batch(CFG, patches.shape, mask, shapes)
    assert "\n" not in str(e.value)


def test_models_without_a_resizable_table_refuse_naflex():
    cfg = CFG.replace(posemb="sincos2d", posemb_prefix=False)
    patches, mask, shapes = _batch()
    with pytest.raises(ValueError, match="posemb='sincos2d'"):
        check_batch(cfg, patches.shape, mask, shapes)


@pytest.mark.slow
def test_position_weights_equal_big_vision_pos_emb_resize():
    """bilinear_aa equals big_vision's ``jax.image.scale_and_translate(method="bilinear", antialias=True)``
    with scale = image grid / table grid (``naflex_vit._pos_emb_resize``), shrinking and growing each axis;
    the padding rows are zero."""
    import jax
    import jax.numpy as jnp

    table = np.random.default_rng(1).standard_normal((4, 4, 8)).astype(np.float32)
    shapes = np.array([[2, 5], [7, 3], [4, 4]])
    w = position_weights((4, 4), shapes, 24, "bilinear_aa")
    ours = np.einsum("bng,gd->bnd", w, table.reshape(16, 8))
    resize = jax.jit(  # big_vision's call, one compile a shape
        lambda t, hw: jax.image.scale_and_translate(
            t, (*hw, 8), (0, 1), jnp.asarray(hw, jnp.float32) / 4, jnp.zeros(2), method="bilinear", antialias=True
        ),
        static_argnums=1,
    )
    for i, (h, ww) in enumerate(shapes):
        ref = resize(jnp.asarray(table), (int(h), int(ww)))
        np.testing.assert_allclose(ours[i, : h * ww], np.asarray(ref).reshape(h * ww, 8), rtol=1e-5, atol=1e-6)
        assert not ours[i, h * ww :].any()
    with pytest.raises(ValueError, match="resample method 'nearest'"):
        position_weights((4, 4), shapes, 24, "nearest")


def test_strict_reading_refuses_a_bare_naflexvit_s_assumed_resize(tmp_path):
    """A timm NaFlexVit state dict stores no resize: ``posemb_resample`` (which decides the function at
    every grid but the table's own) is assumed as the other fields a state dict lacks are, so strict
    reading refuses it by name until it is given; a file written from it keeps it assumed."""
    from safetensors.numpy import save_file

    from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
    from vit_common.checkpoints.formats.errors import FormatError
    from vit_common.checkpoints.formats.timm_naflex import canonical_to_naflex
    from vit_common.state import random_state

    cfg = ViTConfig(image_size=32, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=0,
                    class_token=False, pool="gap", posemb_prefix=False, dynamic_img_size=True)  # fmt: skip
    tensors = {k: np.ascontiguousarray(v) for k, v in canonical_to_naflex(cfg, random_state(cfg)).items()}
    save_file(tensors, str(tmp_path / "n.safetensors"))
    given = dict(in_chans=3, num_heads=2, ln_eps=1e-6, gelu="exact", pool="gap")
    with pytest.raises(FormatError, match=r"does not say posemb_resample \(assumed 'bicubic_aa': pass --set"):
        load_checkpoint(tmp_path / "n.safetensors", strict=True, **given)
    bare = load_checkpoint(tmp_path / "n.safetensors", **given)
    assert bare.report.assumed == ["posemb_resample"]
    save_checkpoint(tmp_path / "ours.safetensors", bare.cfg, bare.state, assumed=bare.report.assumed)
    assert load_checkpoint(tmp_path / "ours.safetensors").report.assumed == ["posemb_resample"]
    ok = load_checkpoint(tmp_path / "n.safetensors", strict=True, posemb_resample="bilinear_aa", **given)
    assert ok.cfg.posemb_resample == "bilinear_aa" and ok.report.assumed == []


def test_big_vision_naflex_npz_is_written_and_read_back_bit_for_bit(tmp_path):
    """A NaFlex model written as big_vision naflex_vit's ``.npz`` (``NpzWriteOptions(naflex=True)``) holds
    ``embedding/kernel`` [P*P*C, D] and ``pos_embedding`` [G, G, D]; it reads back as naflex_vit (the
    bilinear resize derived) with every tensor bit for bit, and written again from that read gives the same
    file tensors. A model whose table naflex_vit cannot resize as it does is refused by name."""
    from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
    from vit_common.checkpoints.formats.npz import NpzWriteOptions
    from vit_common.state import random_state

    cfg = ViTConfig(image_size=(16, 32), patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=0,
                    class_token=False, pool="map", gelu="tanh", posemb_resample="bilinear_aa")  # fmt: skip
    state, options = random_state(cfg, seed=1), NpzWriteOptions(prefix="params/img/", naflex=True)
    save_checkpoint(tmp_path / "a.npz", cfg, state, "big_vision", options=options)
    with np.load(tmp_path / "a.npz") as z:
        first = {k: z[k] for k in z.files}
    assert first["params/img/embedding/kernel"].shape == (8 * 8 * 3, 32)
    assert first["params/img/pos_embedding"].shape == (2, 4, 32)
    back = load_checkpoint(tmp_path / "a.npz", gelu="tanh", ln_eps=1e-6, in_chans=3)
    assert back.report.layout.endswith("naflex_vit") and back.cfg == cfg.replace(dynamic_img_size=True)
    assert all(np.array_equal(back.state[k], v) for k, v in state.items())
    save_checkpoint(tmp_path / "b.npz", back.cfg, back.state, "big_vision", options=options)
    with np.load(tmp_path / "b.npz") as z:
        assert z.files == list(first) and all(np.array_equal(z[k], v) for k, v in first.items())
    bicubic = cfg.replace(posemb_resample="bicubic_aa")
    with pytest.raises(ValueError, match=r"naflex_vit format cannot hold this model: posemb_resample='bicubic_aa'"):
        save_checkpoint(tmp_path / "c.npz", bicubic, state, "big_vision", options=options)
    assert not (tmp_path / "c.npz").exists()
