"""Format readers and writers without any framework: round trips, layouts, missing and
unused tensors, non-contiguous tensors, provenance, errors, atomicity."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from vit_common.checkpoints.convert import (
    FORMATS,
    convert,
    load_checkpoint,
    needs,
    output_format,
    read_checkpoint,
    save_checkpoint,
)
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf import HfWriteOptions
from vit_common.checkpoints.formats.npz import NpzWriteOptions
from vit_common.config import ViTConfig
from vit_common.state import StateMismatchError
from vit_common.system import io, tensor_files

# (format, file name, write options): every container vit_common writes without a framework.
NUMPY_TARGETS = [
    ("canonical", "a.safetensors", {}),
    ("timm", "b.safetensors", {}),
    ("hf", "c_hf", {"options": HfWriteOptions("v4")}),
    ("hf", "d_hf5", {"options": HfWriteOptions("v5")}),
    ("original_vit", "e.npz", {}),
    ("original_vit", "f.npz", {"options": NpzWriteOptions("opt/target/")}),
    ("big_vision", "g.npz", {}),
    ("big_vision", "h.npz", {"options": NpzWriteOptions("params/img/", scan=True)}),
]


@pytest.mark.slow
def test_every_pair_of_formats_round_trips_bit_exact(tmp_path, small_cfg, random_state, assert_same_state):
    """canonical -> A -> B -> read: the same bytes for every ordered pair of containers."""
    cfg, state = small_cfg, random_state(small_cfg)
    for fa, name_a, opt_a in NUMPY_TARGETS:
        pa = tmp_path / name_a
        save_checkpoint(pa, cfg, state, fa, **opt_a)
        first = load_checkpoint(pa)
        assert first.report.format == fa
        assert_same_state(first.state, state)
        for fb, name_b, opt_b in NUMPY_TARGETS:
            pb = tmp_path / f"{name_a}-{name_b}"
            save_checkpoint(pb, first.cfg, first.state, fb, **opt_b)
            assert_same_state(load_checkpoint(pb).state, state)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_dtypes_round_trip_exactly(tmp_path, dtype, small_cfg, random_state, assert_same_state):
    import ml_dtypes

    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    state = random_state(small_cfg, dtype=np_dtype)
    for fmt, name in (("canonical", "a.safetensors"), ("timm", "b.safetensors"), ("hf", "c")):
        save_checkpoint(tmp_path / name, small_cfg.replace(param_dtype=dtype), state, fmt)
        ckpt = load_checkpoint(tmp_path / name)
        assert ckpt.cfg.param_dtype == dtype
        assert_same_state(ckpt.state, state)
    save_checkpoint(tmp_path / "d.npz", small_cfg, state, "big_vision")
    back = load_checkpoint(tmp_path / "d.npz").state  # .npz has no bfloat16: written as float32, exactly
    assert all(np.array_equal(back[k].astype(np.float64), np.asarray(state[k], np.float64)) for k in state)


@pytest.mark.parametrize(
    "kw",
    [
        dict(reg_tokens=4, posemb_prefix=False, layer_scale=1e-5),
        dict(pool="map", class_token=False, qk_norm=True),
        dict(pool="gap", fc_norm=True, qkv_bias=False, num_classes=0),
        dict(posemb="none", image_size=(32, 64)),
        dict(gelu="tanh", ln_eps=1e-12, rep_size=16),
        dict(image_size=(24, 40), num_heads=4),
    ],
)
def test_canonical_file_keeps_every_config_field(tmp_path, kw, small_cfg, random_state, assert_same_state):
    cfg = small_cfg.replace(**kw)
    state = random_state(cfg)
    save_checkpoint(tmp_path / "m.safetensors", cfg, state)
    ckpt = load_checkpoint(tmp_path / "m.safetensors")
    assert ckpt.cfg == cfg
    assert_same_state(ckpt.state, state)


@pytest.mark.parametrize(
    "kw, timm_needs",
    [
        (dict(reg_tokens=4, posemb_prefix=False, layer_scale=1e-5), {}),
        (dict(pool="map", class_token=False, qk_norm=True), {}),
        (dict(pool="gap", fc_norm=True, qkv_bias=False, num_classes=0), {}),
        (dict(image_size=(24, 40)), {"source_image_size": (24, 40)}),
    ],
)
def test_timm_file_infers_the_config_from_shapes(tmp_path, kw, timm_needs, small_cfg, random_state, assert_same_state):
    cfg = small_cfg.replace(**kw)
    state = random_state(cfg)
    save_checkpoint(tmp_path / "t.safetensors", cfg, state, "timm")
    ckpt = load_checkpoint(tmp_path / "t.safetensors", **timm_needs)
    assert ckpt.cfg.replace(layer_scale=cfg.layer_scale) == cfg
    assert_same_state(ckpt.state, state)


def test_deit3_layer_scale_spelling_and_ddp_prefix(tmp_path, small_cfg, random_state, assert_same_state):
    from vit_common.system.io import save_safetensors

    cfg = small_cfg.replace(layer_scale=1e-6)
    state = random_state(cfg)
    renamed = {
        "module." + k.replace(".ls1.gamma", ".gamma_1").replace(".ls2.gamma", ".gamma_2"): v for k, v in state.items()
    }
    assert "module.blocks.0.gamma_1" in renamed
    save_safetensors(tmp_path / "deit3.safetensors", renamed)
    ckpt = load_checkpoint(tmp_path / "deit3.safetensors")
    assert_same_state(ckpt.state, state)
    assert any("gamma_1" in n for n in ckpt.report.notes) and any("module." in n for n in ckpt.report.notes)


def test_hf_config_json_brings_eps_gelu_heads_and_size(tmp_path, small_cfg, random_state):
    cfg = small_cfg.replace(ln_eps=1e-12, gelu="tanh", num_heads=8, image_size=(24, 40))
    save_checkpoint(tmp_path / "hf", cfg, random_state(cfg), "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["hidden_act"] == "gelu_pytorch_tanh" and config["image_size"] == [24, 40]
    got = load_checkpoint(tmp_path / "hf").cfg
    assert (got.ln_eps, got.gelu, got.num_heads, got.image_size) == (1e-12, "tanh", 8, (24, 40))
    config["hidden_act"] = "gelu"
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(tmp_path / "hf").cfg.gelu == "exact"


def test_hf_vitmodel_pooler_is_pre_logits(tmp_path, small_cfg, random_state, assert_same_state):
    cfg = small_cfg.replace(num_classes=0, rep_size=32)
    state = random_state(cfg)
    save_checkpoint(tmp_path / "hf", cfg, state, "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["ViTModel"] and config["pooler_output_size"] == 32
    ckpt = load_checkpoint(tmp_path / "hf")
    assert ckpt.cfg.rep_size == 32 and ckpt.cfg.num_classes == 0
    assert_same_state(ckpt.state, state)


def test_writers_refuse_what_a_format_cannot_hold(tmp_path, small_cfg, random_state):
    with pytest.raises(ValueError, match="reg_tokens=4.*LayerScale"):
        save_checkpoint(
            tmp_path / "x",
            small_cfg.replace(reg_tokens=4, layer_scale=1e-5),
            random_state(small_cfg.replace(reg_tokens=4, layer_scale=1e-5)),
            "hf",
        )
    with pytest.raises(ValueError, match="rep_size=16"):
        save_checkpoint(
            tmp_path / "x.pth", small_cfg.replace(rep_size=16), random_state(small_cfg.replace(rep_size=16)), "timm"
        )
    with pytest.raises(ValueError, match="qk_norm"):
        save_checkpoint(
            tmp_path / "x.npz", small_cfg.replace(qk_norm=True), random_state(small_cfg.replace(qk_norm=True))
        )
    assert not list(tmp_path.iterdir())


def test_writer_reports_fields_a_format_does_not_record(tmp_path, small_cfg, random_state):
    """A big_vision .npz stores neither GELU nor eps: the writer says which flag reads the file back."""
    cfg = small_cfg.replace(gelu="exact", ln_eps=1e-5, posemb_resample="bilinear_corners")
    report = save_checkpoint(tmp_path / "b.npz", cfg, random_state(cfg), "big_vision")
    text = "\n".join(report.warnings)
    assert "gelu='exact'" in text and "--set gelu=exact" in text and "--set ln_eps=1e-05" in text
    assert load_checkpoint(tmp_path / "b.npz", gelu="exact", ln_eps=1e-5).cfg == cfg


@pytest.mark.parametrize("family", ["original_vit", "big_vision"])
def test_writing_a_zero_head_to_npz_says_readers_drop_it(tmp_path, small_cfg, random_state, family):
    """Both .npz families note an all-zero head (the original ViT's used to lose the note to the
    position-embedding notes), and a reader drops that head as said."""
    state = random_state(small_cfg)
    state = {
        **state,
        "head.weight": np.zeros_like(state["head.weight"]),
        "head.bias": np.zeros_like(state["head.bias"]),
    }
    report = save_checkpoint(tmp_path / "z.npz", small_cfg, state, family)
    assert "the head is all zeros: readers drop it unless given num_classes (--num-classes)" in report.notes
    assert load_checkpoint(tmp_path / "z.npz").cfg.num_classes == 0


def test_the_timm_call_names_the_model_s_own_timm_architecture():
    """A variant is built by its registered timm name (not vit_base_patch16_224 for every model)."""
    from vit_common.checkpoints.formats.timm_state import timm_load_call, timm_model_name

    names = {v: timm_model_name(ViTConfig.from_name(v)) for v in ("Ti/16", "S/32", "B/8", "L/16", "H/14", "G/14")}
    assert names == {
        "Ti/16": "vit_tiny_patch16_224",
        "S/32": "vit_small_patch32_224",
        "B/8": "vit_base_patch8_224",
        "L/16": "vit_large_patch16_224",
        "H/14": "vit_huge_patch14_224",
        "G/14": "vit_gigantic_patch14_224",
    }
    deit = ViTConfig.from_name("S/16", dist_token=True, head_dist=True)
    assert "timm.create_model('deit_small_distilled_patch16_224', pretrained=False" in timm_load_call("d.pth", deit)
    assert (
        timm_model_name(ViTConfig.from_name("mu/16")) is None and timm_model_name(ViTConfig.from_name("M/16")) is None
    )


def test_timm_safetensors_we_write_carry_the_config(tmp_path, small_cfg, random_state):
    """timm files we write as .safetensors store the config in the header (timm ignores it): they read
    back with every field declared, no warning, and say how timm loads them strictly."""
    cfg = small_cfg.replace(gelu="quick", num_heads=8, ln_eps=1e-5, pool="avgmax", fc_norm=False, reg_tokens=2)
    report = save_checkpoint(tmp_path / "t.safetensors", cfg, random_state(cfg), "timm")
    assert report.warnings == []
    assert "from timm.models.vision_transformer import VisionTransformer" in report.load_call  # no timm name
    assert "model = VisionTransformer(" in report.load_call and "create_model" not in report.load_call
    assert "global_pool='avgmax'" in report.load_call and "fc_norm=False" in report.load_call
    assert "norm_layer=partial(LayerNorm, eps=1e-05)" in report.load_call
    ckpt = load_checkpoint(tmp_path / "t.safetensors")
    assert ckpt.report.format == "timm" and ckpt.cfg == cfg and ckpt.report.assumed == []
    assert {o.kind for o in ckpt.report.provenance.values()} == {"declared"}


def test_sincos2d_and_no_class_row_are_materialised_exactly(tmp_path, small_cfg, random_state):
    """big_vision-style models (no pos_embed class row; sincos2d) written where only a learned table with
    a class row exists: the table and zero rows make the same sums."""
    from vit_common.posemb import sincos2d

    cfg = small_cfg.replace(posemb="sincos2d", posemb_prefix=False)
    state = random_state(cfg)
    save_checkpoint(tmp_path / "bv.npz", cfg, state, "big_vision")
    assert load_checkpoint(tmp_path / "bv.npz").cfg.posemb == "sincos2d"
    report = save_checkpoint(tmp_path / "hf", cfg, state, "hf")
    assert any("sincos2d" in n for n in report.notes) and any("zero row" in n for n in report.notes)
    pe = load_checkpoint(tmp_path / "hf").state["pos_embed"]
    assert np.array_equal(pe[0, 0], np.zeros(cfg.width, np.float32))
    assert np.array_equal(pe[0, 1:], sincos2d(cfg.grid, cfg.width).astype(np.float32))


# ------------------------------------------------------------------------------ real .npz layouts


@pytest.fixture
def npz_case(tmp_path, random_state, npz_layouts):
    """``npz_case(cfg, read=None, **layout)``: write a random state in an .npz layout, read it back."""

    def case(cfg, read=None, **kw):
        state = random_state(cfg)
        npz_layouts.write(tmp_path / "x.npz", cfg, state, **kw)
        return state, load_checkpoint(tmp_path / "x.npz", **(read or {}))

    return case


def test_original_vit_layout_old_counters_pre_logits(npz_case, small_cfg, assert_same_state):
    cfg = small_cfg.replace(gelu="tanh", rep_size=24, posemb_resample="bilinear_corners")
    state, ckpt = npz_case(cfg, layout="vit")
    assert ckpt.report.format == "original_vit" and "MultiHeadDotProductAttention_1" in ckpt.report.layout
    assert ckpt.cfg == cfg
    assert_same_state(ckpt.state, state)


def test_original_vit_opt_target_prefix_drops_optimizer_state(
    tmp_path, small_cfg, random_state, assert_same_state, npz_layouts
):
    cfg = small_cfg.replace(gelu="tanh", posemb_resample="bilinear_corners")
    state = random_state(cfg)
    extra = {"opt/state/step": np.array(7), "opt/state/param_states/cls/grad_ema": np.ones((1, 1, 32))}
    npz_layouts.write(tmp_path / "x.npz", cfg, state, layout="vit", prefix="opt/target/", extra=extra)
    ckpt = load_checkpoint(tmp_path / "x.npz")
    assert ckpt.cfg == cfg
    assert_same_state(ckpt.state, state)
    assert sorted(k for k, _ in ckpt.report.dropped) == sorted(extra)


def test_original_vit_imagenet21k_zero_head_is_dropped(tmp_path, small_cfg, random_state, npz_layouts):
    cfg = small_cfg.replace(num_classes=21843, rep_size=32, gelu="tanh")
    state = random_state(cfg)
    state["head.weight"][:] = 0
    state["head.bias"][:] = 0
    npz_layouts.write(tmp_path / "x.npz", cfg, state, layout="vit")
    ckpt = load_checkpoint(tmp_path / "x.npz")
    assert ckpt.cfg.num_classes == 0 and ckpt.cfg.rep_size == 32 and "head.weight" not in ckpt.state
    assert [k for k, _ in ckpt.report.dropped] == ["head/kernel", "head/bias"]
    assert "21843-class head" in ckpt.report.dropped[0][1]
    fresh = load_checkpoint(tmp_path / "x.npz", num_classes=10)
    assert fresh.state["head.weight"].shape == (10, 32) and not fresh.state["head.weight"].any()


@pytest.mark.parametrize(
    "prefix, scan, pool",
    [
        ("params/", False, "token"),
        ("params/img/", True, "map"),
        ("", True, "gap"),
        ("params/", True, "token"),
    ],
)
def test_big_vision_layouts(tmp_path, prefix, scan, pool, small_cfg, random_state, assert_same_state, npz_layouts):
    cfg = small_cfg.replace(
        gelu="tanh",
        posemb_prefix=pool != "token",
        pool=pool,
        class_token=pool == "token",
        posemb_resample="bilinear_corners",
    )  # (posemb_prefix means nothing without a cls)
    state = random_state(cfg)
    extra = {"params/txt/Embed_0/embedding": np.ones((5, 4), np.float32)} if prefix == "params/img/" else {}
    npz_layouts.write(tmp_path / "x.npz", cfg, state, layout="big_vision", prefix=prefix, scan=scan, extra=extra)
    ckpt = load_checkpoint(tmp_path / "x.npz")
    assert ckpt.report.format == "big_vision" and ("scan-stacked" in ckpt.report.layout) == scan
    assert ckpt.cfg == cfg
    assert_same_state(ckpt.state, state)
    assert [k for k, _ in ckpt.report.dropped] == list(extra)


def test_big_vision_old_combined_cls_posemb_and_sincos(npz_case, small_cfg):
    cfg = small_cfg.replace(gelu="tanh", posemb_resample="bilinear_corners")  # pos_embedding with a class row
    state, ckpt = npz_case(cfg, layout="big_vision", prefix="params/")
    assert ckpt.cfg.posemb_prefix and ckpt.cfg == cfg
    cfg = small_cfg.replace(
        gelu="tanh",
        posemb="sincos2d",
        posemb_prefix=False,
        pool="gap",
        class_token=False,
        posemb_resample="bilinear_corners",
    )
    state, ckpt = npz_case(cfg, layout="big_vision", prefix="params/")
    assert ckpt.cfg == cfg.replace(image_size=224) and "pos_embed" not in ckpt.state  # size not stored
    assert "224 assumed" in ckpt.report.provenance["image_size"].source
    assert ckpt.report.provenance["image_size"].kind == "assumed" and "image_size" in ckpt.report.assumed
    state, ckpt = npz_case(cfg, read=dict(source_image_size=32), layout="big_vision", prefix="params/")
    assert ckpt.cfg == cfg
    cfg = small_cfg.replace(gelu="tanh", posemb_prefix=False, posemb_resample="bilinear_corners")
    state, ckpt = npz_case(cfg, layout="big_vision", posemb_key="Transformer/pos_embedding")
    assert ckpt.cfg == cfg


def test_writer_layouts_equal_the_helper(tmp_path, small_cfg, random_state, assert_same_state, npz_layouts):
    """Our writer produces exactly the arrays the independent helper spells for the same layout."""
    from vit_common.checkpoints.formats import npz

    cfg = small_cfg.replace(pool="map", class_token=False, posemb_prefix=False, rep_size=16)
    state = random_state(cfg)
    for fam, layout, prefix, scan in [
        ("big_vision", "big_vision", "params/", True),
        ("original_vit", "vit", "opt/target/", False),
    ]:
        mine = npz.write(cfg, state, fam, prefix=prefix, scan=scan)
        helper = npz_layouts.arrays(cfg, state, layout=layout, prefix=prefix, scan=scan)
        assert_same_state(mine, helper)


# ----------------------------------------------------------------------- resampling at load time


def test_load_time_resampling_keeps_prefix_rows_and_reports(tmp_path, small_cfg, random_state):
    from vit_common.posemb import resample_pos_embed

    cfg = small_cfg.replace(image_size=(16, 64), reg_tokens=2)  # grid 2x8
    state = random_state(cfg)
    save_checkpoint(tmp_path / "m.safetensors", cfg, state)
    ckpt = load_checkpoint(tmp_path / "m.safetensors", image_size=32)  # grid 4x4: same 16 patches
    pe = ckpt.state["pos_embed"]
    assert pe.shape == state["pos_embed"].shape and not np.array_equal(pe, state["pos_embed"])
    assert np.array_equal(pe[:, :3], state["pos_embed"][:, :3])
    assert np.array_equal(pe, resample_pos_embed(state["pos_embed"], (2, 8), (4, 4), 3, "bicubic_aa"))
    assert ckpt.cfg.image_size == (32, 32) and "2x8 -> 4x4" in ckpt.report.resampled[0]
    assert (
        load_checkpoint(tmp_path / "m.safetensors", image_size=32, posemb_resample="bilinear").cfg.posemb_resample
        == "bilinear"
    )


def test_npz_files_resample_with_corner_aligned_bilinear(tmp_path, small_cfg, random_state, npz_layouts):
    import scipy.ndimage

    cfg = small_cfg.replace(gelu="tanh", posemb_prefix=False, posemb_resample="bilinear_corners")
    state = random_state(cfg)
    npz_layouts.write(tmp_path / "x.npz", cfg, state, layout="big_vision", prefix="params/")
    pe = load_checkpoint(tmp_path / "x.npz", image_size=56).state["pos_embed"]  # 4x4 -> 7x7
    ref = scipy.ndimage.zoom(state["pos_embed"][0].astype(np.float64).reshape(4, 4, -1), (7 / 4, 7 / 4, 1), order=1)
    np.testing.assert_allclose(pe[0], ref.reshape(49, -1), rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------ errors


def test_missing_unexpected_and_shape_reported_together(tmp_path, small_cfg, random_state, npz_layouts):
    """A file where one tensor was never written, one is extra and one has the wrong shape: one error
    names all three (in the file's own key names)."""
    cfg = small_cfg.replace(gelu="tanh", posemb_prefix=False)
    npz_layouts.write(tmp_path / "bv.npz", cfg, random_state(cfg), layout="big_vision", prefix="params/")
    arrays = dict(np.load(tmp_path / "bv.npz", allow_pickle=False))
    del arrays["params/Transformer/encoderblock_1/MlpBlock_0/Dense_1/bias"]
    arrays["params/Transformer/encoderblock_0/extra/kernel"] = np.zeros(3, np.float32)
    arrays["params/Transformer/encoder_norm/scale"] = np.zeros(31, np.float32)
    with open(tmp_path / "bad.npz", "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(StateMismatchError) as err:
        load_checkpoint(tmp_path / "bad.npz")
    e = err.value
    assert e.missing == ["params/Transformer/encoderblock_1/MlpBlock_0/Dense_1/bias"]
    assert e.unexpected == ["params/Transformer/encoderblock_0/extra/kernel"]
    assert e.shape == ["params/Transformer/encoder_norm/scale has (31,), expected (32,)"]
    assert "missing" in str(e) and "unexpected" in str(e) and "shape" in str(e)


def test_every_canonical_tensor_filled_by_writers(tmp_path, small_cfg, random_state):
    state = random_state(small_cfg)
    del state["blocks.1.attn.proj.bias"]
    for fmt, name in (("canonical", "a.safetensors"), ("hf", "b"), ("big_vision", "c.npz")):
        with pytest.raises(StateMismatchError, match="missing: blocks.1.attn.proj.bias"):
            save_checkpoint(tmp_path / name, small_cfg, state, fmt)
    assert not list(tmp_path.iterdir())


def test_non_contiguous_tensors_are_written(tmp_path, small_cfg, random_state, assert_same_state):
    """Tensors that are views after a transpose (what a careless converter hands over) write and load back."""
    state = random_state(small_cfg)
    state["blocks.0.mlp.fc1.weight"] = np.ascontiguousarray(state["blocks.0.mlp.fc1.weight"].T).T
    state["patch_embed.proj.weight"] = state["patch_embed.proj.weight"][:, ::-1][:, ::-1]
    assert not state["blocks.0.mlp.fc1.weight"].flags.c_contiguous
    for fmt, name in (
        ("canonical", "a.safetensors"),
        ("timm", "b.safetensors"),
        ("hf", "c"),
        ("big_vision", "d.npz"),
    ):
        save_checkpoint(tmp_path / name, small_cfg, state, fmt)
        assert_same_state(
            load_checkpoint(tmp_path / name).state, {k: np.ascontiguousarray(v) for k, v in state.items()}
        )


def test_head_conflict_names_the_counts_and_offers_num_classes(tmp_path, small_cfg, random_state):
    save_checkpoint(tmp_path / "hf", small_cfg, random_state(small_cfg), "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["id2label"] = {str(i): str(i) for i in range(1000)}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match=r"1000 labels but the classifier has 10 rows.*num_classes=10"):
        load_checkpoint(tmp_path / "hf")
    assert load_checkpoint(tmp_path / "hf", num_classes=10).cfg.num_classes == 10
    assert load_checkpoint(tmp_path / "hf", num_classes=3).state["head.bias"].shape == (3,)


def test_nonfinite_tensors_are_warned_by_name(tmp_path, small_cfg, random_state):
    state = random_state(small_cfg)
    state["blocks.1.norm2.bias"][3] = np.nan
    state["cls_token"][0, 0, 0] = np.inf
    save_checkpoint(tmp_path / "a.safetensors", small_cfg, state)
    warnings = load_checkpoint(tmp_path / "a.safetensors").report.warnings
    assert warnings == ["cls_token holds NaN or Inf", "blocks.1.norm2.bias holds NaN or Inf"]


def test_nonfinite_bfloat16_tensors_are_warned_by_name(tmp_path, small_cfg, random_state):
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    state = random_state(small_cfg, dtype=bf16)
    state["blocks.1.norm2.bias"][3] = np.nan
    state["cls_token"][0, 0, 0] = -np.inf
    state["pos_embed"][0, 1, 2] = ml_dtypes.finfo(bf16).max  # the largest finite value is not flagged
    save_checkpoint(tmp_path / "a.safetensors", small_cfg.replace(param_dtype="bfloat16"), state)
    report = convert(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert report.warnings == ["cls_token holds NaN or Inf", "blocks.1.norm2.bias holds NaN or Inf"]


@pytest.mark.parametrize(
    "content, match",
    [
        (b"hello, I am not a checkpoint", "not a checkpoint format"),
        (b"PK\x03\x04broken zip", "damaged zip"),
        (b"", "not a checkpoint format"),
    ],
)
def test_unknown_and_damaged_files_are_named(tmp_path, content, match):
    (tmp_path / "x.bin").write_bytes(content)
    with pytest.raises(FormatError, match=match):
        load_checkpoint(tmp_path / "x.bin")


def test_a_safetensors_file_cut_inside_its_header_is_named_truncated(tmp_path, small_cfg, random_state):
    save_checkpoint(tmp_path / "a.safetensors", small_cfg, random_state(small_cfg))
    data = (tmp_path / "a.safetensors").read_bytes()
    declared = int.from_bytes(data[:8], "little")
    (tmp_path / "cut.safetensors").write_bytes(data[:50])
    match = rf"cut\.safetensors: a truncated or damaged safetensors file \(.* a {declared}-byte header, and 42 bytes"
    with pytest.raises(FormatError, match=match):
        load_checkpoint(tmp_path / "cut.safetensors")


def test_an_unknown_model_type_lists_every_model_type_of_the_hf_formats(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    io.save_safetensors(tmp_path / "hf" / "model.safetensors", {"x": np.ones((2,), np.float32)})
    with pytest.raises(FormatError, match="model_type='bert' is not supported; supported: vit, deit .hf. and ") as e:
        load_checkpoint(tmp_path / "hf")
    assert all(t in str(e.value) for t in ("siglip_vision_model", "clip_vision_model", "dinov2", "vit_mae", "ijepa"))
    assert str(e.value).endswith("(hf_family)")


def test_missing_path_and_frameworks_the_caller_did_not_give(tmp_path, small_cfg, random_state):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nope.safetensors")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "vit_config.json").write_text("{}")
    (tmp_path / "o" / "state").mkdir()
    with pytest.raises(FormatError, match="needs jax"):
        load_checkpoint(tmp_path / "o")
    with pytest.raises(FormatError, match="needs vit_torch"):
        save_checkpoint(tmp_path / "m.pth", small_cfg, random_state(small_cfg))
    assert needs(tmp_path / "o") == "jax" and needs(tmp_path / "m.pth", writing=True) == "torch"
    assert needs(tmp_path / "m.npz", writing=True) is None


def test_unknown_override_is_named(tmp_path, small_cfg, random_state):
    save_checkpoint(tmp_path / "a.safetensors", small_cfg, random_state(small_cfg))
    with pytest.raises(ValueError, match=r"unknown ViTConfig field\(s\) \['heads'\]"):
        load_checkpoint(tmp_path / "a.safetensors", heads=3)


def test_output_format_from_suffix():
    assert [output_format(p) for p in ("a.safetensors", "b.pth", "c.bin", "d.npz")] == [
        "canonical",
        "timm",
        "timm",
        "big_vision",
    ]
    with pytest.raises(ValueError, match="hf or orbax"):
        output_format("some_folder")
    formats = "canonical timm hf hf_family hf_dinov3 dinov3_original original_vit big_vision orbax eva_original"
    assert set(FORMATS) == set(formats.split())


# ------------------------------------------------------------------------------------ atomicity


def test_failed_write_leaves_nothing_and_keeps_the_old_file(tmp_path, monkeypatch, small_cfg, random_state):
    state = random_state(small_cfg)
    save_checkpoint(tmp_path / "x.npz", small_cfg, state)
    before = (tmp_path / "x.npz").read_bytes()

    def boom(fh, array):  # the disk fills while the first member is written
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tensor_files, "_write_npy", boom)
    with io.overwriting(), pytest.raises(OSError, match=r"x.npz: could not be written \(No space left on device\)"):
        save_checkpoint(tmp_path / "x.npz", small_cfg, random_state(small_cfg, seed=1))
    assert (tmp_path / "x.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npz"]


def test_folder_outputs_replace_only_checkpoint_folders_we_wrote(tmp_path, small_cfg, random_state):
    state = random_state(small_cfg)
    save_checkpoint(tmp_path / "hf", small_cfg, state, "hf")
    save_checkpoint(tmp_path / "hf", small_cfg, random_state(small_cfg, seed=1), "hf")  # replaces a checkpoint folder
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]
    mark = io.read_json(tmp_path / "hf" / "config.json")[io.OWNER_KEY]  # what proves the folder ours
    assert mark == {"files": ["config.json", "model.safetensors"]}
    (tmp_path / "hf" / "src").mkdir()  # the user keeps something of theirs there: no longer ours to replace
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    for folder, held in (("mine", "notes.txt"), ("hf", "src")):
        with pytest.raises(io.DestinationError, match=f"{folder}: a folder holding things vit did not write .*{held}"):
            save_checkpoint(tmp_path / folder, small_cfg, state, "hf")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious" and (tmp_path / "hf" / "src").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "mine"]


def test_assumed_fields_are_warned_with_their_flag_and_strict_refuses_them(tmp_path, small_cfg, random_state):
    """A timm file as timm writes it stores no config: every field that changes the function and that
    the tensors do not imply is assumed, warned with the flag that supplies it, and refused by strict."""
    from vit_common.system.io import save_safetensors

    cfg = small_cfg.replace(width=128, num_heads=4, mlp_dim=256)  # no VARIANTS row of width 128: width/64 = 2 heads
    save_safetensors(tmp_path / "t.safetensors", random_state(cfg))
    report = load_checkpoint(tmp_path / "t.safetensors").report
    assert report.assumed == ["image_size", "num_heads", "ln_eps", "gelu", "pool", "posemb_prefix"]
    block = report.assumption_block()
    assert len(block) == 7 and report.warnings == []
    assert block[0].startswith("6 fields assumed: image_size, num_heads, ln_eps, gelu, pool, posemb_prefix (")
    assert "--set FIELD=VALUE (the size: --source-image-size HxW)" in block[0]
    assert block[2] == "  num_heads = 2 (not stored; width / 64 (head_dim 64))"
    given = dict(num_heads=4, gelu="exact", ln_eps=1e-6, pool="token", source_image_size=32)
    quiet = load_checkpoint(tmp_path / "t.safetensors", strict=True, **given)
    assert quiet.report.warnings == [] and quiet.cfg == cfg
    assert quiet.report.provenance["num_heads"].kind == "given"
    with pytest.raises(FormatError) as refused:
        load_checkpoint(tmp_path / "t.safetensors", strict=True)
    assert str(refused.value) == (  # each field's flag said once
        f"{tmp_path / 't.safetensors'}: strict reading refuses assumptions, and the file does not say image_size "
        "(assumed (32, 32): pass --source-image-size HxW (source_image_size=(H, W))); num_heads (assumed 2: pass "
        "--set num_heads=VALUE); ln_eps (assumed 1e-06: pass --set ln_eps=VALUE); gelu (assumed 'exact': pass "
        "--set gelu=VALUE); pool (assumed 'token': pass --set pool=VALUE); posemb_prefix (assumed True: pass "
        "--set posemb_prefix=VALUE)"
    )
    with pytest.warns(UserWarning) as issued:
        assert read_checkpoint(tmp_path / "t.safetensors")[0].num_heads == 2
    api = report.assumption_block(api=True)  # the Python API's warning names keywords, not flags
    assert api[1:] == block[1:] and "the keyword FIELD=VALUE (the size: source_image_size=(H, W))" in api[0]
    assert len(issued) == 1 and str(issued[0].message) == f"{tmp_path / 't.safetensors'}: " + "\n".join(api)


def test_writes_refuse_a_folder_path_and_get_the_usual_file_mode(tmp_path, small_cfg, random_state):
    (tmp_path / "dir.safetensors").mkdir()
    with pytest.raises(IsADirectoryError, match="is a folder"):
        save_checkpoint(tmp_path / "dir.safetensors", small_cfg, random_state(small_cfg))
    assert list((tmp_path / "dir.safetensors").iterdir()) == []
    umask = os.umask(0o022)
    try:
        save_checkpoint(tmp_path / "m.safetensors", small_cfg, random_state(small_cfg))
    finally:
        os.umask(umask)
    assert (tmp_path / "m.safetensors").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


def test_files_written_before_pool_include_prefix_keep_their_map_head(tmp_path, small_cfg, random_state):
    """Our files stored no pool_include_prefix before timm's MAP semantics (patch tokens only) were
    adopted; their MAP head pooled every token, and a file without the field still reads that way."""
    import json as json_

    from vit_common.checkpoints.formats.canonical import FORMAT_TAG
    from vit_common.system.io import save_safetensors

    cfg = small_cfg.replace(pool="map", reg_tokens=1)
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("pool_include_prefix", "dist_token", "head_dist")}
    save_safetensors(
        tmp_path / "old.safetensors", random_state(cfg), {"format": FORMAT_TAG, "vit_config": json_.dumps(old)}
    )
    ckpt = load_checkpoint(tmp_path / "old.safetensors")
    assert ckpt.cfg == cfg.replace(pool_include_prefix=True)
    assert any("predates pool_include_prefix" in n for n in ckpt.report.notes)


def test_every_reader_gives_every_function_field_a_provenance(tmp_path, small_cfg, random_state):
    from vit_common.config import FUNCTION_FIELDS
    from vit_common.system.io import save_safetensors

    state = random_state(small_cfg)
    save_safetensors(tmp_path / "bare_timm.safetensors", state)
    for fmt, name in (("canonical", "a.safetensors"), ("hf", "b"), ("original_vit", "c.npz"), ("big_vision", "d.npz")):
        save_checkpoint(tmp_path / name, small_cfg, state, fmt)
    for name in ("bare_timm.safetensors", "a.safetensors", "b", "c.npz", "d.npz"):
        provenance = load_checkpoint(tmp_path / name).report.provenance
        assert set(provenance) == set(FUNCTION_FIELDS), (name, set(FUNCTION_FIELDS) ^ set(provenance))
        assert {o.kind for o in provenance.values()} <= {"declared", "derived", "assumed"}


def test_a_source_size_that_contradicts_the_declared_one_is_an_error(tmp_path, small_cfg, random_state):
    save_checkpoint(tmp_path / "hf", small_cfg, random_state(small_cfg), "hf")
    assert load_checkpoint(tmp_path / "hf", source_image_size=32).report.provenance["image_size"].kind == "declared"
    with pytest.raises(FormatError, match=r"source_image_size=\(64, 64\) but the file declares image_size=\(32, 32\)"):
        load_checkpoint(tmp_path / "hf", source_image_size=64)


def test_assumed_fields_stay_assumed_through_a_conversion(tmp_path, small_cfg, random_state):
    """Converting a file whose config had to be assumed does not turn the assumptions into facts: our
    .safetensors, timm .safetensors and HF config.json record them; formats that cannot say so."""
    from vit_common.checkpoints.convert import convert
    from vit_common.system.io import save_safetensors

    save_safetensors(tmp_path / "bare.safetensors", random_state(small_cfg))
    source = load_checkpoint(tmp_path / "bare.safetensors").report.assumed
    for name, fmt in (("a.safetensors", "canonical"), ("t.safetensors", "timm"), ("hf", "hf")):
        report = convert(
            tmp_path / "bare.safetensors", tmp_path / name, to_fmt=fmt, source_image_size=32, accept_assumed="all"
        )
        again = load_checkpoint(tmp_path / name).report
        assert again.assumed == report.assumed and set(again.assumed) == set(source) - {"image_size", "posemb_prefix"}
        assert "assumed when this file was converted" in again.provenance["gelu"].source
        with pytest.raises(FormatError, match="strict reading refuses"):
            load_checkpoint(tmp_path / name, strict=True)
    report = convert(tmp_path / "bare.safetensors", tmp_path / "b.npz", num_heads=2, gelu="exact", ln_eps=1e-6)
    assert report.warnings[-1] == (
        "big_vision files cannot record that image_size, pool, posemb_prefix were assumed (the source did not state "
        "them): readers of this file will take them as derived"
    )


def test_a_given_head_count_is_used_where_no_rule_guesses_one(tmp_path, random_state, tiny_cfg):
    """Width 16 has no variant row and is no multiple of 64: refused without num_heads, exact with it."""
    from safetensors.numpy import save_file

    cfg = tiny_cfg
    state = random_state(cfg)
    save_file(state, tmp_path / "t.safetensors")
    with pytest.raises(FormatError) as refused:
        load_checkpoint(tmp_path / "t.safetensors")
    assert str(refused.value).endswith(
        "cannot guess num_heads for width 16: the file does not store it; pass --set num_heads=VALUE"
    )
    ckpt = load_checkpoint(tmp_path / "t.safetensors", num_heads=2)
    assert ckpt.cfg.num_heads == 2 and ckpt.report.provenance["num_heads"].kind == "given"
    assert all(np.array_equal(ckpt.state[k], v) for k, v in state.items())


def test_an_assumed_field_is_not_written_as_fact_unless_given_or_accepted(tmp_path, small_cfg, random_state):
    """timm file (no config) -> HF folder / timm hub folder (config.json states every field as fact): refused
    naming every assumed field; accepted by name, or given. -> a timm state_dict file (stores no config,
    our header records the assumption): written freely, the assumptions kept in the report."""
    from vit_common.checkpoints.convert import convert
    from vit_common.system.io import save_safetensors

    save_safetensors(tmp_path / "bare.safetensors", random_state(small_cfg))
    assumed = load_checkpoint(tmp_path / "bare.safetensors", source_image_size=32).report.assumed
    assert "gelu" in assumed and "ln_eps" in assumed
    for fmt, name, library in (("hf", "hf", "transformers"), ("timm", "t", "timm")):
        with pytest.raises(
            ValueError, match=rf"{name}: its config.json states every field as fact to {library}, and .*gelu='exact'"
        ):
            convert(tmp_path / "bare.safetensors", tmp_path / name, to_fmt=fmt, source_image_size=32)
        assert not (tmp_path / name).exists()
        with pytest.raises(ValueError, match=rf"--accept-assumed {','.join(a for a in assumed if a != 'gelu')} "):
            convert(
                tmp_path / "bare.safetensors",
                tmp_path / name,
                to_fmt=fmt,
                source_image_size=32,
                accept_assumed=("gelu",),
            )
        given = {k: getattr(small_cfg, k) for k in assumed}
        report = convert(tmp_path / "bare.safetensors", tmp_path / name, to_fmt=fmt, source_image_size=32, **given)
        back = load_checkpoint(tmp_path / name).cfg
        assert report.assumed == [] and all(getattr(back, k) == getattr(small_cfg, k) for k in assumed)
    report = convert(tmp_path / "bare.safetensors", tmp_path / "t.safetensors", source_image_size=32)
    assert report.assumed == assumed and not report.warnings
    assert load_checkpoint(tmp_path / "t.safetensors").report.assumed == assumed


def test_a_bias_free_head_is_written_with_a_zero_bias_where_the_format_has_one(tmp_path, small_cfg, random_state):
    """CLIP's projection (head_bias=False) as timm's CLIP converter holds it: head.weight + zero head.bias."""
    cfg = small_cfg.replace(head_bias=False)
    state = random_state(cfg)
    for name, fmt in (("t.safetensors", "timm"), ("h", "hf"), ("b.npz", "big_vision")):
        report = save_checkpoint(tmp_path / name, cfg, state, fmt)
        assert report.config.head_bias and any("zero bias" in n for n in report.notes), name
        back = load_checkpoint(tmp_path / name, gelu=cfg.gelu, ln_eps=cfg.ln_eps)
        assert np.array_equal(back.state["head.bias"], np.zeros(cfg.num_classes, np.float32))
        assert all(np.array_equal(back.state[k], v) for k, v in state.items())


def test_a_size_given_to_resample_is_labelled_given_not_declared(tmp_path, small_cfg, random_state):
    save_checkpoint(tmp_path / "a.safetensors", small_cfg, random_state(small_cfg), "canonical")
    ckpt = load_checkpoint(tmp_path / "a.safetensors", image_size=48)
    origin = ckpt.report.provenance["image_size"]
    assert (origin.kind, origin.source) == ("given", "image_size (the file's 32x32, resampled)")
    assert ckpt.cfg.image_size == (48, 48) and ckpt.report.assumed == []
    assert load_checkpoint(tmp_path / "a.safetensors", image_size=32).report.provenance["image_size"].kind == "declared"


def test_a_new_head_on_a_headless_model_without_head_bias_has_its_bias(tmp_path, tiny_cfg, random_state):
    """A headless model whose config says no head bias (timm's DINOv3 and EVA-02 backbones read so): the
    zero-initialised head that ``num_classes`` adds has a weight and a bias, and the config says so."""
    from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint

    cfg = tiny_cfg.replace(num_classes=0, head_bias=False)
    save_checkpoint(tmp_path / "m.safetensors", cfg, random_state(cfg), "canonical")
    ckpt = load_checkpoint(tmp_path / "m.safetensors", num_classes=5)
    assert ckpt.cfg.num_classes == 5 and ckpt.cfg.head_bias
    assert np.asarray(ckpt.state["head.bias"]).tolist() == [0.0] * 5
    assert np.asarray(ckpt.state["head.weight"]).shape == (5, cfg.features_dim)


def test_a_missing_framework_reader_names_the_flag_that_supplies_it(tmp_path):
    """A .pth read where no torch reader was given (the JAX twin's commands) says why (a torch pickle) and
    names `--framework torch`; in a timm hub folder (``save_for_hf``'s default pytorch_model.bin) it names the
    file and the conversion of the folder to a .safetensors file both twins read."""
    from vit_common.checkpoints.formats.source import reader

    with pytest.raises(FormatError, match=r"a torch pickle, which only torch.load reads.*`--framework torch` on"):
        reader(None, "torch", tmp_path / "m.pth")
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224"}))
    (tmp_path / "hub" / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FormatError) as err:
        load_checkpoint(tmp_path / "hub", readers={})
    assert str(err.value).startswith(f"{tmp_path / 'hub' / 'pytorch_model.bin'}: a torch pickle")
    assert str(err.value).endswith(f"`vit convert {tmp_path / 'hub'} OUT.safetensors`")
