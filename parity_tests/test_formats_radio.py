"""transformers RADIO (``radio``: ``RadioModel``) folders into both twins and back, transformers 5.24 as
the oracle: tiny random models (width 32, depth 2, a 8x8 position table of 8-pixel patches) written by
``save_pretrained``, compared in float32 on the summary, every block's hidden state and attention map, at
the table's size, at config.json's image size and at sizes where the table is cropped."""

from __future__ import annotations

import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

import vit_jax
import vit_torch
from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.hf import HfWriteOptions
from vit_common.tolerance import compare

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8, max_img_size=64)
CASES = {
    "plain": dict(num_cls_tokens=3, num_registers=2, summary_idxs=[0, 2]),
    "swiglu": dict(use_swiglu_ffn=True, mlp_ratio=3.0, qkv_bias=False, num_cls_tokens=2, num_registers=0),
}


def _build(case: str, seed: int = 0) -> transformers.RadioModel:
    config = transformers.RadioConfig(**SMALL, **CASES[case], norm_mean=[0.4, 0.5, 0.6], norm_std=[0.2, 0.25, 0.3])
    torch.manual_seed(seed)
    model = transformers.RadioModel._from_config(config, attn_implementation="eager")
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.1 if "norm" in name or "lambda" in name else 0.05))
    return model.eval()


def _reference(model, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    with torch.no_grad():
        out = model(torch.from_numpy(x), output_hidden_states=True, output_attentions=True)
    inter = {f"block{i:02d}": h.numpy() for i, h in enumerate(out.hidden_states[1:])}
    inter |= {f"attn{i:02d}": a.numpy() for i, a in enumerate(out.attentions)}
    return out.summary.numpy(), inter | {"norm": out.last_hidden_state.numpy()}


def _check(model, folder, x: np.ndarray) -> None:
    ref, inter = _reference(model, x)
    jm, tm = vit_jax.load_model(folder, attn_impl="explicit"), vit_torch.load_model(folder)
    lj, oj = jm.forward_intermediates(jnp.asarray(x.transpose(0, 2, 3, 1)))
    with torch.no_grad():
        lt, ot = tm.forward_intermediates(torch.from_numpy(x))
    for twin, logits, out in (("jax", np.asarray(lj), oj), ("torch", lt.numpy(), ot)):
        assert compare(f"{twin} summary", logits, ref, "tensor", "float32").ok
        for k, v in inter.items():
            got = np.asarray(out[k])
            assert compare(f"{twin} {k}", got, v, "attention" if k.startswith("attn") else "tensor", "float32").ok


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_radio_folder_equals_transformers_at_sizes_that_crop_the_table(case, tmp_path, images):
    """Both twins equal RadioModel on the summary, every block and attention map: at the table's own 64x64,
    config.json's 32x32, and 48x32 and 24x40 (the table resized to a square of the larger side, then
    cropped); the input is normalised inside the model, as transformers' input conditioner does."""
    model = _build(case)
    model.save_pretrained(tmp_path / "src")
    ckpt = load_checkpoint(tmp_path / "src", strict=True)
    cfg = ckpt.cfg
    assert (cfg.image_size, cfg.pool, cfg.final_norm, cfg.posemb_resample) == (
        (64, 64),
        "summary",
        False,
        "bilinear_crop",
    )
    n_cls = CASES[case]["num_cls_tokens"]
    assert cfg.reg_tokens == n_cls + CASES[case]["num_registers"] - 1
    assert cfg.summary_idxs == tuple(CASES[case].get("summary_idxs", [0, 1]))
    for hw in ((64, 64), (32, 32), (48, 32), (24, 40)):
        _check(model, tmp_path / "src", np.abs(images(2, hw)) * 0.5)


def test_radio_written_back_loads_strictly_in_transformers_and_round_trips_bit_exact(tmp_path, images):
    """A RADIO folder read and written as hf_family: every tensor and buffer as the source file (bit for
    bit), loaded by RadioModel with nothing missing or unexpected, the same summary."""
    model = _build("plain")
    model.save_pretrained(tmp_path / "src")
    ckpt = load_checkpoint(tmp_path / "src", strict=True)
    assert (ckpt.info.preprocess.mean, ckpt.info.preprocess.std) == ((0.0,), (1.0,))  # the model normalises
    report = save_checkpoint(tmp_path / "out", ckpt.cfg, ckpt.state, "hf_family", options=HfWriteOptions("v4"))
    assert "transformers.RadioModel.from_pretrained(" in report.load_call
    src, out = load_file(tmp_path / "src" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert set(src) == set(out) and all(np.array_equal(src[k], out[k]) and src[k].dtype == out[k].dtype for k in src)
    loaded, info = transformers.RadioModel.from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager"
    )
    assert not any(v for k, v in info.items() if k != "error_msgs") and not info.get("error_msgs"), info
    x = np.abs(images(2, (48, 32)))
    with torch.no_grad():
        want, got = model(torch.from_numpy(x)).summary, loaded.eval()(torch.from_numpy(x)).summary
    assert torch.equal(want, got)
    back = load_checkpoint(tmp_path / "out", strict=True)
    assert back.cfg == ckpt.cfg and all(np.array_equal(back.state[k], v) for k, v in ckpt.state.items())


@pytest.mark.slow
def test_a_file_without_layer_scale_reads_without_it(tmp_path, images):
    """C-RADIO's own files have no ``layer_scale`` tensors (transformers' default layerscale_value 1 is the
    identity): read without LayerScale, still equal to transformers."""
    model = _build("swiglu")
    model.save_pretrained(tmp_path / "src")
    path = tmp_path / "src" / "model.safetensors"
    save_file({k: v for k, v in load_file(path).items() if "lambda1" not in k}, path, metadata={"format": "pt"})
    model = transformers.RadioModel.from_pretrained(tmp_path / "src", attn_implementation="eager").eval()
    assert load_checkpoint(tmp_path / "src", strict=True).cfg.layer_scale is None
    _check(model, tmp_path / "src", np.abs(images(1, (40, 24))))


def _edit(folder, config=None, drop=(), tensors=None) -> None:
    """Rewrite a saved RADIO folder: config.json keys replaced by ``config``, tensors ``drop`` removed and
    ``tensors`` replaced."""
    if config:
        path = folder / "config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | config))
    path = folder / "model.safetensors"
    kept = {k: v for k, v in load_file(path).items() if k not in drop}
    save_file(kept | (tensors or {}), path, metadata={"format": "pt"})


@pytest.mark.parametrize(
    "config, drop, tensors, message",
    [
        (None, (), {"radio_model.summary_idxs": np.array([0, 3])}, r"summary_idxs=\[0, 3\]: expected class token"),
        (None, ("radio_model.input_conditioner.norm_std",), None, "no radio_model.input_conditioner.norm_std"),
        ({"mlp_ratio": -1.0}, (), None, "mlp_ratio=-1.0: expected a number"),
        ({"num_cls_tokens": 0}, (), None, "num_cls_tokens=0, num_registers=2: expected >= 1"),
        ({"max_img_size": 4}, (), None, "max_img_size=4 is smaller than patch_size=8"),
    ],
)
def test_bad_radio_folders_are_one_line_errors(config, drop, tensors, message, tmp_path, capsys):
    """A folder whose buffers or config.json RADIO cannot have: ``vit info`` exits 2 with one line naming
    the value."""
    from vit_cli.main import main

    transformers.RadioModel(transformers.RadioConfig(**SMALL, num_registers=2)).save_pretrained(tmp_path / "hf")
    _edit(tmp_path / "hf", config, drop, tensors)
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(["info", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


@pytest.mark.slow
def test_vit_parity_against_transformers_and_convert_through_our_safetensors(tmp_path, capsys):
    """``vit parity FOLDER --against transformers`` passes with RadioModel's summary, blocks and attention
    maps compared; ``vit convert`` to our safetensors and back to a transformers folder gives the source's
    tensors bit for bit."""
    from vit_cli.main import main

    _build("swiglu").save_pretrained(tmp_path / "src")
    argv = ["parity", str(tmp_path / "src"), "--against", "transformers", "--json", str(tmp_path / "r.json")]
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "r.json").read_text())["rows"]}
    for name in ("block00", "block01", "attn00", "attn01", "norm", "logits"):
        assert rows[name]["against"]["ok"] and rows[name]["against"]["rel"] < 1e-5, name
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "m.safetensors")]) == 0
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "back"), "--to", "hf_family"]) == 0
    src, back = load_file(tmp_path / "src" / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert set(src) == set(back) and all(np.array_equal(src[k], back[k]) for k in src)


@pytest.mark.slow
def test_a_naflex_batch_of_sizes_equals_transformers_image_by_image(tmp_path, images):
    """Images of three sizes in one NaFlex batch (patches, mask, grids; the input normaliser applied per
    channel of the flattened patches, the table cropped per image): each image's summary equals
    RadioModel's on that image alone, in both twins."""
    from vit_common.naflex import patchify, stack_patches

    model = _build("plain")
    model.save_pretrained(tmp_path / "src")
    sizes = [(48, 32), (24, 40), (64, 64)]
    imgs = [np.abs(images(1, hw, seed=i))[0] * 0.5 for i, hw in enumerate(sizes)]  # [C, H, W]
    with torch.no_grad():
        ref = np.concatenate([model(torch.from_numpy(x[None])).summary.numpy() for x in imgs])
    items = [(patchify(x.transpose(1, 2, 0), (8, 8)), (h // 8, w // 8)) for x, (h, w) in zip(imgs, sizes, strict=True)]
    patches, mask, shapes = stack_patches(items, 64)
    jm, tm = vit_jax.load_model(tmp_path / "src"), vit_torch.load_model(tmp_path / "src")
    lj = np.asarray(jm(jnp.asarray(patches), patch_mask=mask, spatial_shapes=shapes))
    with torch.no_grad():
        lt = tm(torch.from_numpy(patches), patch_mask=mask, spatial_shapes=shapes).numpy()
    for twin, got in (("jax", lj), ("torch", lt)):
        assert compare(f"{twin} NaFlex summary", got, ref, "tensor", "float32").ok
