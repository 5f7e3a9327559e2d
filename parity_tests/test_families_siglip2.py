"""SigLIP 2 in both twins against the libraries that publish it, tiny models built here.

Fixed resolution: transformers publishes SigLIP 2 as plain ``siglip`` folders (``SiglipModel``, a
``siglip_vision_model`` vision_config) and big_vision as ``siglip2_*.npz`` files in SigLIP's layout (its
README_siglip2: "compatible with vit.py and two_towers.py ... the only difference is the vocab size (256k)
and the tokenizer"); both must load as they are, equal to transformers' forward within
``vit_common.tolerance`` (float32 1e-5 relative).
"""

from __future__ import annotations

import json

import numpy as np
import torch
import transformers

import vit_jax
import vit_torch
from vit_common.checkpoints.convert import convert, load_checkpoint
from vit_common.checkpoints.formats.npz import NpzWriteOptions
from vit_common.tolerance import compare

# The keys of google/siglip2-base-patch16-224's config.json (transformers 4.49), sizes made tiny: no
# hidden_act, layer_norm_eps or vision_use_head, so transformers' defaults apply.
_VISION = dict(hidden_size=32, image_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2)
_PUBLISHED = {
    "architectures": ["SiglipModel"],
    "initializer_factor": 1.0,
    "model_type": "siglip",
    "text_config": {
        "hidden_size": 16,
        "intermediate_size": 32,
        "model_type": "siglip_text_model",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": 64,
    },
    "torch_dtype": "float32",
    "vision_config": {**_VISION, "model_type": "siglip_vision_model", "patch_size": 16},
}


def _normal(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter N(0, 0.3), norm weights included."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def _assert_close(name: str, ours, ref) -> None:
    c = compare(name, np.asarray(ours), np.asarray(ref), "tensor", "float32")
    assert c.ok, c


def _published_fixed_res(folder) -> torch.nn.Module:
    """A tiny SiglipModel saved by transformers, its config.json replaced by the published key set."""
    config = transformers.SiglipConfig.from_dict(_PUBLISHED)
    model = _normal(transformers.SiglipModel._from_config(config, attn_implementation="eager"))
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(_PUBLISHED))
    return model


def test_fixed_resolution_siglip2_folders_and_npz_load(tmp_path, images):
    """The published fixed-resolution form (``siglip`` folder, ``SiglipModel``) loads strictly with nothing
    assumed; as a big_vision ``siglip2_*.npz`` (``params/img/`` beside a 256k-vocab text tower ``params/txt/``,
    ``params/t``, ``params/b``) it reads back bit for bit; both twins equal transformers' image features."""
    model = _published_fixed_res(tmp_path / "hf")
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    assert ckpt.report.assumed == [] and ckpt.report.layout.startswith("SiglipModel")
    assert (ckpt.cfg.gelu, ckpt.cfg.ln_eps, ckpt.cfg.pool, ckpt.cfg.class_token) == ("tanh", 1e-6, "map", False)
    x = images(3, (32, 32))
    with torch.no_grad():
        ref = model.get_image_features(pixel_values=torch.from_numpy(x))
        ref = (ref if isinstance(ref, torch.Tensor) else ref.pooler_output).numpy()
        _assert_close("torch", vit_torch.load_model(tmp_path / "hf")(torch.from_numpy(x)), ref)
    jm = vit_jax.load_model(tmp_path / "hf")
    _assert_close("jax", jm(x.transpose(0, 2, 3, 1)), ref)

    npz = tmp_path / "siglip2_b16_224.npz"
    convert(tmp_path / "hf", npz, to_fmt="big_vision", write_options=NpzWriteOptions(prefix="params/img/"))
    with np.load(npz) as z:
        files = {k: z[k] for k in z.files}
    text = {  # big_vision text_transformer's names; SigLIP 2's Gemma vocabulary (256k rows, here 2 wide)
        "params/txt/Embed_0/embedding": np.zeros((256_000, 2), np.float32),
        "params/txt/pos_embedding": np.zeros((1, 64, 2), np.float32),
        "params/txt/head/kernel": np.zeros((2, 2), np.float32),
        "params/t": np.array([2.3], np.float32),
        "params/b": np.array([-10.0], np.float32),
    }
    np.savez(npz, **files, **text)
    back = load_checkpoint(npz)
    assert back.report.format == "big_vision" and set(dict(back.report.dropped)) == set(text)
    assert back.state.keys() == ckpt.state.keys()
    assert all(np.array_equal(back.state[k], v) for k, v in ckpt.state.items())
    with torch.no_grad():
        got = vit_torch.load_model(npz, source_image_size=32, gelu="tanh", ln_eps=1e-6, strict=True)
        _assert_close("big_vision npz", got(torch.from_numpy(x)), ref)
