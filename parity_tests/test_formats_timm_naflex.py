"""timm ``NaFlexVit`` (``naflexvit_*``) files and hub folders in both twins against timm's own forward, tiny
models built here: a batch of four aspect ratios made with timm's ``patchify_image`` (patches flattened
(P, P, C), ``patch_coord`` and ``patch_valid``, padding coordinates zero as timm's NaFlex collator pads),
equal within ``vit_common.tolerance`` (float32 1e-5 relative)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import timm
import torch
from flax import nnx
from safetensors.torch import save_file
from timm.data.naflex_transforms import patchify_image
from timm.models._hub import save_for_hf

import vit_jax
import vit_torch
from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.timm import TimmWriteOptions
from vit_common.config import ViTConfig
from vit_common.state import random_state
from vit_common.tolerance import compare
from vit_torch.formats import READERS

# patch grids 2x5, 4x3, 1x1, 5x3 in one batch of N=16 patches; a 4x4 table (patch 8)
_SIZES = ((16, 40), (32, 24), (8, 8), (40, 24))
_TINY = dict(embed_dim=32, depth=2, num_heads=4, patch_size=8, pos_embed_grid_size=(4, 4), num_classes=5)


def _timm_naflex(name: str, **kwargs) -> torch.nn.Module:
    """A tiny timm NaFlexVit, every parameter N(0, 0.3)."""
    model = timm.create_model(name, pretrained=False, **(_TINY | kwargs))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def _batch(n: int = 16, seed: int = 0):
    """(patches [B, N, P*P*C], patch_coord [B, N, 2], patch_valid [B, N], spatial_shapes [B, 2]) as torch."""
    rng = np.random.default_rng(seed)
    patches, coord = torch.zeros(len(_SIZES), n, 8 * 8 * 3), torch.zeros(len(_SIZES), n, 2, dtype=torch.long)
    valid = torch.zeros(len(_SIZES), n, dtype=torch.bool)
    for i, (h, w) in enumerate(_SIZES):
        p, c, v = patchify_image(torch.from_numpy(rng.standard_normal((3, h, w)).astype(np.float32)), (8, 8), True)
        patches[i, : len(p)], coord[i, : len(p)], valid[i, : len(p)] = p.reshape(len(p), -1), c, v.bool()
    return patches, coord, valid, torch.tensor([(h // 8, w // 8) for h, w in _SIZES])


def _assert_close(name: str, ours, ref) -> None:
    c = compare(name, np.asarray(ours), np.asarray(ref), "tensor", "float32")
    assert c.ok, c


def _twins(cfg, state, batch) -> list[tuple[str, np.ndarray]]:
    """Both twins' outputs on a NaFlex batch: torch (SDPA), JAX under one ``nnx.jit``."""
    patches, _, valid, shapes = batch
    with torch.no_grad():
        out = [("torch", vit_torch.from_numpy(cfg, state)(patches, patch_mask=valid, spatial_shapes=shapes).numpy())]
    mask, grids = valid.numpy(), shapes.numpy()
    run = nnx.jit(lambda m, x: m(x, patch_mask=mask, spatial_shapes=grids))
    return out + [("jax", np.asarray(run(vit_jax.from_numpy(cfg, state), jnp.asarray(patches.numpy()))))]


def test_naflexvit_siglip_hub_folder_and_file_equal_timm_in_both_twins(tmp_path):
    """``naflexvit_base_patch16_siglip``: its hub folder loads with nothing assumed (timm builds it: the
    bilinear resize, tanh GELU, MAP head declared); its bare state dict reads the same tensors bit for bit,
    with the settings a file cannot hold assumed (named) and given here; both twins give timm's output on
    a batch of four aspect ratios."""
    name = "naflexvit_base_patch16_siglip"
    model = _timm_naflex(name)
    save_for_hf(model, tmp_path / "hub", model_config={"architecture": name})
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "naflex.safetensors")
    batch = _batch()
    with torch.no_grad():
        ref = model(batch[0], patch_coord=batch[1], patch_valid=batch[2]).numpy()
    hub = load_checkpoint(tmp_path / "hub", readers=READERS, strict=True)
    cfg = hub.cfg
    assert hub.report.assumed == [] and "naflexvit_base_patch16_siglip" in hub.report.layout
    assert (cfg.posemb_resample, cfg.gelu, cfg.pool, cfg.class_token, cfg.image_size) == (
        "bilinear_aa",
        "tanh",
        "map",
        False,
        (32, 32),
    )
    for twin, out in _twins(cfg, hub.state, batch):
        _assert_close(twin, out, ref)
    bare = load_checkpoint(tmp_path / "naflex.safetensors")
    assert bare.report.layout == "timm NaFlexVit state_dict"
    assert {"in_chans", "num_heads", "gelu", "ln_eps"} <= set(bare.report.assumed)
    assert bare.cfg.replace(num_heads=4, gelu="tanh", posemb_resample="bilinear_aa") == cfg
    assert all(np.array_equal(np.asarray(bare.state[k]), np.asarray(v)) for k, v in hub.state.items())
    with torch.no_grad():
        got = vit_torch.load_model(
            tmp_path / "naflex.safetensors", num_heads=4, gelu="tanh", posemb_resample="bilinear_aa"
        )
        _assert_close("torch, bare file", got(batch[0], patch_mask=batch[2], spatial_shapes=batch[3]), ref)


def test_naflexvit_hub_folder_preprocesses_as_timm_s_naflex_evaluation(tmp_path):
    """A NaFlexVit hub folder's preprocessing is timm's NaFlex evaluation (``create_transform(naflex=True)``:
    ``ResizeToSequence`` keeping the aspect ratio, then patches): mean, std and filter from
    ``pretrained_cfg``, the patch budget its ``input_size`` (384 x 384) in the model's 8-pixel patches, each
    stated as such; the image_size is the table's (4 x 4 patches), said to be. The patches equal timm's."""
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    from vit_common.naflex import preprocess

    name = "naflexvit_base_patch16_siglip"
    model = _timm_naflex(name)
    save_for_hf(model, tmp_path / "hub", model_config={"architecture": name})
    ckpt = load_checkpoint(tmp_path / "hub", readers=READERS)
    pre, budget = ckpt.info.preprocess, (384 // 8) ** 2
    assert (pre.max_patches, pre.interpolation, pre.mean, pre.std) == (budget, "bicubic", (0.5,) * 3, (0.5,) * 3)
    assert f"max_patches={budget}, its input_size 384x384 in 8-pixel patches" in ckpt.info.preprocess_source
    assert "its 4x4 position table x the patch" in ckpt.report.provenance["image_size"].source
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 500, 3), np.uint8))
    timm_eval = create_transform(
        **resolve_data_config(model=model), naflex=True, patch_size=8, max_seq_len=budget, patchify=True
    )
    ref = timm_eval(image)  # patches [N, P*P*C] (P, P, C), patch_valid
    patches, (h, w) = preprocess(image, 8, budget, 3, pre)
    assert len(patches) == h * w == int(ref["patch_valid"].sum()) <= budget
    np.testing.assert_allclose(patches, ref["patches"][: h * w].numpy(), rtol=0, atol=1e-6)


# timm NaFlexVit entry points and keywords: register tokens with avg pooling and fc_norm (bicubic resize),
# a MAP head on the patches beside a register token, a class token with token pooling, a Conv2d projection
_FAMILIES = {
    "gap_reg4": ("naflexvit_base_patch16_gap", {}),
    "map_reg1": ("naflexvit_base_patch16_map", {}),
    "token_bilinear": (
        "naflexvit_base_patch16_gap",
        dict(class_token=True, global_pool="token", fc_norm=False, pos_embed_interp_mode="bilinear", reg_tokens=0),
    ),
    "conv_proj": ("naflexvit_base_patch16_map", dict(embed_proj_type="conv")),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", _FAMILIES)
def test_naflexvit_families_equal_timm_in_both_twins(tmp_path, family):
    """Each NaFlexVit family's hub folder: nothing assumed, both twins equal timm on the batch of four
    aspect ratios (a Conv2d projection's NaFlex patches go through timm's image path one image at a time)."""
    name, kwargs = _FAMILIES[family]
    model = _timm_naflex(name, **kwargs)
    save_for_hf(model, tmp_path / "hub", model_config={"architecture": name, "model_args": kwargs})
    batch = _batch()
    ckpt = load_checkpoint(tmp_path / "hub", readers=READERS, strict=True)
    assert ckpt.report.assumed == []
    with torch.no_grad():
        if family == "conv_proj":  # timm's Conv2d embedding takes images, not NaFlex patches
            ref = np.concatenate([_image_path(model, p, s) for p, s in zip(batch[0], batch[3], strict=True)])
        else:
            ref = model(batch[0], patch_coord=batch[1], patch_valid=batch[2]).numpy()
    for twin, out in _twins(ckpt.cfg, ckpt.state, batch):
        _assert_close(f"{family} {twin}", out, ref)


def _image_path(model, patches, shape) -> np.ndarray:
    """timm on one image rebuilt from its NaFlex patches [N, P*P*C] of grid ``shape`` (h, w)."""
    h, w = (int(n) for n in shape)
    image = patches[: h * w].reshape(h, w, 8, 8, 3).permute(4, 0, 2, 1, 3).reshape(1, 3, 8 * h, 8 * w)
    return model(image).numpy()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs, why",
    [
        (dict(pos_embed="factorized"), "a factorized position table"),
        (dict(pos_embed_ar_preserving=True), "an aspect-preserving table resize"),
        (dict(pos_embed_use_grid_sample=True), "a table resize by grid_sample"),
        (dict(pos_embed_interp_mode="nearest"), "a table resize ('nearest', True, False)"),
    ],
)
def test_naflexvit_choices_the_twins_lack_are_refused_by_name(tmp_path, capsys, kwargs, why):
    """A NaFlexVit hub folder whose table the twins cannot resize as timm does: ``vit info`` says which
    in one line, exit 2."""
    from vit_cli.main import main

    name = "naflexvit_base_patch16_gap"
    save_for_hf(
        _timm_naflex(name, **kwargs), tmp_path / "hub", model_config={"architecture": name, "model_args": kwargs}
    )
    capsys.readouterr()
    assert main(["info", str(tmp_path / "hub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0], err


def test_naflexvit_exports_load_strictly_in_timm_and_give_its_output(tmp_path):
    """A NaFlexVit hub folder converted to timm (a hub folder, a .safetensors, a .pth) is written as a
    NaFlexVit: timm loads each strictly (``create_model("local-dir:...")``, the printed load call) and gives
    the source model's output on the batch of four aspect ratios bit for bit; each reads back with the
    source's tensors bit for bit (the .pth, which stores no config, with its assumptions named). A model
    whose table has a class token's row is refused as a NaFlexVit by name."""
    from vit_common.checkpoints.convert import convert
    from vit_torch.formats import WRITERS

    name = "naflexvit_base_patch16_map"
    model = _timm_naflex(name, reg_tokens=2)
    save_for_hf(model, tmp_path / "hub", model_config={"architecture": name, "model_args": dict(reg_tokens=2)})
    source = load_checkpoint(tmp_path / "hub", readers=READERS)
    patches, coord, valid, _ = _batch()
    with torch.no_grad():
        ref = model(patches, patch_coord=coord, patch_valid=valid)
    for dst in ("out", "out.safetensors", "out.pth"):
        report = convert(tmp_path / "hub", tmp_path / dst, to_fmt="timm", readers=READERS, writers=WRITERS)
        if dst == "out":
            assert report.load_call.endswith("pretrained=True)")
            timm_model = timm.create_model(f"local-dir:{tmp_path / dst}", pretrained=True)
        else:
            assert f"timm.create_model({name!r}, pretrained=False," in report.load_call
            scope: dict = {}
            exec(report.load_call, scope)  # builds the NaFlexVit and loads the file with strict=True
            timm_model = scope["model"]
        with torch.no_grad():
            assert torch.equal(timm_model.eval()(patches, patch_coord=coord, patch_valid=valid), ref), dst
        back = load_checkpoint(tmp_path / dst, readers=READERS)
        assert "NaFlexVit" in back.report.layout or name in back.report.layout
        if dst == "out":  # the patch budget written as the input_size it is read from
            assert back.info.preprocess == source.info.preprocess
        assert back.report.assumed == [] if dst != "out.pth" else {"num_heads", "gelu"} <= set(back.report.assumed)
        assert all(np.array_equal(np.asarray(back.state[k]), np.asarray(v)) for k, v in source.state.items())
    cfg = ViTConfig(image_size=16, patch_size=8, width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=0)
    options = TimmWriteOptions(architecture="naflexvit_base_patch16_gap")
    with pytest.raises(
        ValueError, match=r"cannot hold this model: posemb_prefix=True with prefix tokens \(a NaFlexVit table"
    ):
        save_checkpoint(tmp_path / "vit.safetensors", cfg, random_state(cfg), "timm", options=options)
    assert not (tmp_path / "vit.safetensors").exists()


def test_a_naflexvit_export_names_an_entry_point_its_keywords_define():
    """The names a NaFlexVit export may take are timm's own entry points; an unknown one (timm could not
    build it) and one whose table the written keywords leave aspect-preserving or factorized are refused."""
    from vit_common.checkpoints.formats.timm_naflex import NAFLEX_NAMES, naflex_name

    assert set(NAFLEX_NAMES) <= set(timm.list_models("naflexvit_*"))
    cfg = ViTConfig(image_size=32, patch_size=16, width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)
    assert naflex_name(cfg, "naflexvit_base_patch16_map") == "naflexvit_base_patch16_map"
    for name in ("naflexvit_bogus", "naflexvit_base_patch16_par_gap", "naflexvit_base_patch16_radio_v3"):
        with pytest.raises(ValueError, match=f"--timm-architecture '{name}': a NaFlexVit export names one of"):
            naflex_name(cfg, name)


@pytest.mark.parametrize(
    "name, resample",
    [
        ("naflexvit_large_patch16_radio_v3", "bilinear_crop"),
        ("naflexvit_base_patch16_radio_v3", "bilinear_crop_corners"),
    ],
)
def test_naflexvit_radio_crops_its_table_as_timm_in_both_twins_and_exports(tmp_path, capsys, name, resample):
    """C-RADIOv3-L (the table resized bilinearly to a square of the longer side, then cropped) and
    C-RADIOv3-B (the same with corners aligned; no final norm; 7 registers): each hub folder reads with
    its ``posemb_resample`` and nothing assumed, both twins equal timm on the batch of four aspect ratios,
    and its timm export (a file and a hub folder: a NaFlexVit with ``pos_embed_ar_preserving``) loads
    strictly with timm's output bit for bit. An aspect-preserving bicubic resize is refused naming it."""
    from vit_cli.main import main
    from vit_common.checkpoints.convert import convert
    from vit_torch.formats import WRITERS

    model = _timm_naflex(name)
    save_for_hf(model, tmp_path / "hub", model_config={"architecture": name})
    patches, coord, valid, shapes = batch = _batch()
    with torch.no_grad():
        ref = model(patches, patch_coord=coord, patch_valid=valid).numpy()
    hub = load_checkpoint(tmp_path / "hub", readers=READERS, strict=True)
    cfg = hub.cfg
    assert hub.report.assumed == []
    assert (cfg.posemb_resample, cfg.final_norm, cfg.reg_tokens, cfg.pool) == (resample, False, 7, "token")
    for twin, out in _twins(cfg, hub.state, batch):
        _assert_close(twin, out, ref)
    report = convert(tmp_path / "hub", tmp_path / "out.safetensors", to_fmt="timm", readers=READERS, writers=WRITERS)
    assert "pos_embed_ar_preserving=True" in report.load_call
    scope: dict = {}
    exec(report.load_call, scope)  # builds the NaFlexVit and loads the file with strict=True
    convert(tmp_path / "hub", tmp_path / "out", to_fmt="timm", readers=READERS, writers=WRITERS)
    back = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True)  # a hub folder, strictly
    with torch.no_grad():
        for written in (scope["model"], back):
            assert np.array_equal(written.eval()(patches, patch_coord=coord, patch_valid=valid).numpy(), ref)
    assert load_checkpoint(tmp_path / "out", readers=READERS, strict=True).cfg == cfg
    bicubic = {"architecture": name, "model_args": {"pos_embed_interp_mode": "bicubic"}}
    save_for_hf(_timm_naflex(name, pos_embed_interp_mode="bicubic"), tmp_path / "bicubic", model_config=bicubic)
    capsys.readouterr()
    assert main(["info", str(tmp_path / "bicubic")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "an aspect-preserving table resize ('bicubic', False," in err[0], err


def test_a_model_resizing_other_than_vision_transformer_exports_as_naflexvit(tmp_path):
    """A dynamic-size model whose table resizes bilinearly with antialias (not read from a NaFlexVit) is
    written to timm as a NaFlexVit, which resizes so (a VisionTransformer resizes bicubically): the file
    and the hub folder load strictly and equal the torch twin at 48x80; where a NaFlexVit cannot hold
    the model either (a class token's table row), the write is refused in one line, nothing written."""
    from vit_common.checkpoints.convert import convert
    from vit_torch.formats import WRITERS

    cfg = ViTConfig(
        image_size=32, patch_size=8, width=64, depth=1, num_heads=2, mlp_dim=128, num_classes=0,
        class_token=False, pool="map", gelu="tanh", posemb_prefix=False, dynamic_img_size=True,
        posemb_resample="bilinear_aa",
    )  # fmt: skip
    state = random_state(cfg)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 48, 80)).astype(np.float32))
    with torch.no_grad():
        ref = vit_torch.from_numpy(cfg, state)(x).numpy()
    save_checkpoint(tmp_path / "src.safetensors", cfg, state)
    for dst in ("out.safetensors", "out"):
        report = convert(tmp_path / "src.safetensors", tmp_path / dst, to_fmt="timm", readers=READERS, writers=WRITERS)
        assert any("written as timm's NaFlexVit naflexvit_base_patch16_siglip" in n for n in report.notes), dst
        if dst == "out":
            model = timm.create_model(f"local-dir:{tmp_path / dst}", pretrained=True)
        else:
            scope: dict = {}
            exec(report.load_call, scope)  # builds the NaFlexVit and loads the file with strict=True
            model = scope["model"]
        with torch.no_grad():
            _assert_close(dst, model.eval()(x).numpy(), ref)
    bad = cfg.replace(class_token=True, posemb_prefix=True, pool="token")
    with pytest.raises(ValueError, match=r"posemb_resample='bilinear_aa' \(timm's VisionTransformer .*as a NaFlexVit"):
        save_checkpoint(tmp_path / "bad.safetensors", bad, random_state(bad), "timm")
    assert not (tmp_path / "bad.safetensors").exists()
