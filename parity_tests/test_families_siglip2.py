"""SigLIP 2 in both twins against the libraries that publish it, tiny models built here.

Fixed resolution: transformers publishes SigLIP 2 as plain ``siglip`` folders (``SiglipModel``, a
``siglip_vision_model`` vision_config) and big_vision as ``siglip2_*.npz`` files in SigLIP's layout (its
README_siglip2: "compatible with vit.py and two_towers.py ... the only difference is the vocab size (256k)
and the tokenizer"); both must load as they are, equal to transformers' forward within
``vit_common.tolerance`` (float32 1e-5 relative).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import vit_jax
import vit_torch
from vit_common.checkpoints.convert import convert, load_checkpoint
from vit_common.checkpoints.formats.hf_families import ONE_SPELLING
from vit_common.checkpoints.formats.npz import NpzWriteOptions
from vit_common.config import ViTConfig
from vit_common.naflex import pad_batch, patchify
from vit_common.state import random_state
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


@pytest.mark.slow
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
    _assert_close("jax", nnx.jit(lambda m, x: m(x))(jm, jnp.asarray(x.transpose(0, 2, 3, 1))), ref)

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


# NaFlex: images of four aspect ratios (patch grids 2x5, 4x3, 1x1, 5x3) in one batch of N=16 patches, for a
# model whose position table is 4x4 (image_size 32, patch 8).
_NAFLEX_SIZES = ((16, 40), (32, 24), (8, 8), (40, 24))
_NAFLEX = dict(image_size=32, patch_size=8, width=32, depth=2, num_heads=4, mlp_dim=48, num_classes=0)
_NAFLEX_CONFIGS = {
    "map": dict(class_token=False, pool="map", gelu="tanh", posemb_resample="bilinear_aa"),
    "class_token_gap": dict(pool="gap", posemb_resample="bicubic_aa"),
}


def _naflex_batch(rng, sizes=_NAFLEX_SIZES, n=16):
    images = [rng.standard_normal((h, w, 3)).astype(np.float32) for h, w in sizes]
    return images, pad_batch(images, (8, 8), n)


def _jax(cfg, state, batch, intermediates: bool = False):
    """The JAX twin on a NaFlex batch under one ``nnx.jit`` (the host-side mask and shapes are constants of
    the trace): a compile of the whole graph, about 4x faster here than op-by-op eager dispatch."""
    patches, mask, shapes = batch
    call = "forward_intermediates" if intermediates else "__call__"
    run = nnx.jit(lambda m, x: getattr(m, call)(x, patch_mask=mask, spatial_shapes=shapes))
    return run(vit_jax.from_numpy(cfg, state), jnp.asarray(patches))


def _naflex_twins(cfg, state, batch, intermediates: bool) -> list[tuple[str, np.ndarray, dict]]:
    """(twin, output, intermediates) on a NaFlex batch: JAX explicit, torch SDPA, torch explicit; with
    ``intermediates`` also JAX with XLA's fused kernel, and the explicit paths' intermediates."""
    runs = []
    if intermediates:
        out, inter = _jax(cfg, state, batch, True)
        runs += [
            ("jax explicit", np.asarray(out), inter),
            ("jax xla", _jax(cfg.replace(attn_backend="xla"), state, batch), {}),
        ]
    else:
        runs.append(("jax explicit", _jax(cfg, state, batch), {}))
    tm = vit_torch.from_numpy(cfg, state)
    with torch.no_grad():
        t, m, s = (torch.from_numpy(a) for a in batch)
        runs.append(("torch sdpa", tm(t, patch_mask=m, spatial_shapes=s).numpy(), {}))
        out, inter = tm.forward_intermediates(t, patch_mask=m, spatial_shapes=s)
        runs.append(("torch explicit", out.numpy(), inter))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("case", _NAFLEX_CONFIGS)
def test_naflex_batch_equals_each_image_alone_in_both_twins(case):
    """A NaFlex batch of four aspect ratios: both twins agree, fused and explicit; the padding gets no
    attention (probabilities exactly 0 there); each image run alone gives its row: unpadded in torch, and
    (one compile) the last in JAX, padded; an image through the image path of a dynamic-size
    model gives it too (the same resample)."""
    cfg = ViTConfig(**_NAFLEX, **_NAFLEX_CONFIGS[case])
    state = random_state(cfg, seed=1, scale=0.3)
    images, batch = _naflex_batch(np.random.default_rng(0))
    runs = _naflex_twins(cfg, state, batch, intermediates=case == "map")
    ref = runs[-1][1]
    for name, out, inter in runs:
        _assert_close(name, out, ref)
        for key in [k for k in inter if k.startswith("attn0")]:
            probs = np.asarray(inter[key])  # [B, N, L, L]
            for i, (h, w) in enumerate(batch[2]):
                assert np.all(probs[i, :, :, cfg.num_prefix_tokens + h * w :] == 0), (name, key)
    tm = vit_torch.from_numpy(cfg, state)
    with pytest.raises(ValueError, match=r"spatial_shapes of shape \(\): expected \[B=4, 2\]"):
        tm(torch.from_numpy(batch[0]), patch_mask=batch[1])  # a mask without the grids
    dynamic = vit_torch.from_numpy(cfg.replace(dynamic_img_size=True), state)
    for i, image in enumerate(images):
        if i == len(images) - 1:  # one JAX compile: the 5x3 image, padded to 16
            _assert_close(f"jax image {i} alone", _jax(cfg, state, pad_batch([image], (8, 8), 16))[0], ref[i])
        alone = pad_batch([image], (8, 8), len(patchify(image, (8, 8))))  # no padding
        with torch.no_grad():
            got = tm(torch.from_numpy(alone[0]), patch_mask=alone[1], spatial_shapes=alone[2])
            _assert_close(f"torch image {i} alone", got[0], ref[i])
            full = dynamic(torch.from_numpy(image.transpose(2, 0, 1)[None]))
        _assert_close(f"image path {i}", full[0], ref[i])


def _siglip2_folder(folder) -> torch.nn.Module:
    """A tiny transformers Siglip2VisionModel (patch 8, a 4x4 position table: num_patches 16), saved."""
    config = transformers.Siglip2VisionConfig(**{**_VISION, "patch_size": 8, "num_patches": 16})
    del config.image_size
    model = _normal(transformers.Siglip2VisionModel._from_config(config, attn_implementation="eager"))
    model.save_pretrained(folder)
    return model


@pytest.mark.slow
def test_siglip2_naflex_folder_equals_transformers_in_both_twins(tmp_path, capsys):
    """A ``siglip2_vision_model`` folder loads strictly (nothing assumed; image_size 4 x 8 from num_patches,
    posemb_resample bilinear_aa declared; its key names are transformers 4's and 5's, not "v4"); on a
    batch of four aspect ratios both twins give transformers' pooled output and its last hidden state on
    every image patch, and transformers on each image alone gives the same rows. ``vit info --set
    posemb_resample=nearest`` is one line and exit 2."""
    from vit_cli.main import main

    model = _siglip2_folder(tmp_path / "hf")
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    assert ckpt.report.assumed == [] and ckpt.report.layout == f"Siglip2VisionModel, {ONE_SPELLING}"
    cfg = ckpt.cfg
    assert (cfg.image_size, cfg.patch_size, cfg.posemb_resample, cfg.pool) == ((32, 32), (8, 8), "bilinear_aa", "map")
    _, batch = _naflex_batch(np.random.default_rng(2))
    patches, mask, shapes = (torch.from_numpy(a) for a in batch)
    with torch.no_grad():
        ref = model(pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes)
        for i in range(len(shapes)):
            n = int(mask[i].sum())
            alone = model(
                pixel_values=patches[i : i + 1, :n],
                pixel_attention_mask=mask[i : i + 1, :n],
                spatial_shapes=shapes[i : i + 1],
            )
            _assert_close(f"transformers image {i} alone", alone.pooler_output[0], ref.pooler_output[i])
        tm = vit_torch.load_model(tmp_path / "hf")
        got, inter = tm.forward_intermediates(patches, patch_mask=mask, spatial_shapes=shapes)
        runs = [("torch", got.numpy(), inter)]
    out, inter = _jax(cfg, ckpt.state, batch, intermediates=True)
    runs.append(("jax", np.asarray(out), inter))
    for name, out, inter in runs:
        _assert_close(name, out, ref.pooler_output)
        for i in range(len(shapes)):
            n = int(mask[i].sum())
            _assert_close(f"{name} image {i} tokens", np.asarray(inter["norm"])[i, :n], ref.last_hidden_state[i, :n])
    capsys.readouterr()  # save_pretrained's progress bars
    assert main(["info", str(tmp_path / "hf"), "--set", "posemb_resample=nearest"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "posemb_resample" in err[0] and "nearest" in err[0], err


@pytest.mark.slow
def test_siglip2_two_tower_and_classifier_folders_read_their_vision_tower(tmp_path):
    """``siglip2`` folders: ``Siglip2Model`` (the text tower reported as ignored) gives transformers' image
    features, ``Siglip2ForImageClassification`` its logits (the masked mean of the tokens), torch twin."""
    text = {k: v for k, v in _PUBLISHED["text_config"].items() if k != "model_type"}
    vision = {**_VISION, "patch_size": 8, "num_patches": 16}
    _, batch = _naflex_batch(np.random.default_rng(3))
    patches, mask, shapes = (torch.from_numpy(a) for a in batch)
    for arch in ("Siglip2Model", "Siglip2ForImageClassification"):
        config = transformers.Siglip2Config(vision_config=vision, text_config=text, num_labels=5)
        model = _normal(getattr(transformers, arch)._from_config(config, attn_implementation="eager"))
        model.save_pretrained(tmp_path / arch)
        ckpt = load_checkpoint(tmp_path / arch, strict=True)
        assert ckpt.report.layout.startswith(arch) and ckpt.report.assumed == []
        assert (ckpt.cfg.pool, ckpt.cfg.num_classes) == (("map", 0) if arch == "Siglip2Model" else ("gap", 5))
        with torch.no_grad():
            kw = dict(pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes)
            ref = model.get_image_features(**kw) if arch == "Siglip2Model" else model(**kw).logits
            ref = ref if isinstance(ref, torch.Tensor) else ref.pooler_output
            got = vit_torch.load_model(tmp_path / arch)(patches, patch_mask=mask, spatial_shapes=shapes)
        _assert_close(arch, got, ref)


def test_siglip2_folders_are_written_back_and_load_strictly_in_transformers(tmp_path):
    """A ``siglip2_vision_model`` folder converted to hf_family is written as ``Siglip2VisionModel``
    (``num_patches``, the flattened patch embedding): transformers loads it strictly and gives the source's
    output bit for bit on the batch of four aspect ratios; it reads back with the source's tensors bit for
    bit. Written as timm's ``naflexvit_base_patch16_siglip`` hub folder, timm gives transformers' output
    within 1e-5. A fixed-resolution SigLIP (bicubic resize) asked for as ``siglip2_vision_model`` is
    refused by name."""
    import timm

    from vit_common.checkpoints.formats.hf import HfWriteOptions
    from vit_common.checkpoints.formats.timm import TimmWriteOptions
    from vit_torch.formats import READERS, WRITERS

    model = _siglip2_folder(tmp_path / "hf")
    report = convert(tmp_path / "hf", tmp_path / "out", to_fmt="hf_family")
    assert "Siglip2VisionModel.from_pretrained" in report.load_call
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "siglip2_vision_model" and config["num_patches"] == 16 and "image_size" not in config
    written, info = transformers.Siglip2VisionModel.from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info
    _, batch = _naflex_batch(np.random.default_rng(2))
    names = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
    kw = dict(zip(names, (torch.from_numpy(a) for a in batch), strict=True))
    with torch.no_grad():
        assert torch.equal(written.eval()(**kw).pooler_output, model(**kw).pooler_output)
    source, back = load_checkpoint(tmp_path / "hf"), load_checkpoint(tmp_path / "out", strict=True)
    assert back.cfg == source.cfg and all(np.array_equal(back.state[k], v) for k, v in source.state.items())
    options = TimmWriteOptions(architecture="naflexvit_base_patch16_siglip")
    convert(tmp_path / "hf", tmp_path / "timm", to_fmt="timm", readers=READERS, writers=WRITERS, write_options=options)
    coord = torch.zeros(*kw["pixel_values"].shape[:2], 2, dtype=torch.long)  # timm's (y, x) of each patch
    for i, (h, w) in enumerate(kw["spatial_shapes"].tolist()):
        coord[i, : h * w] = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(
            -1, 2
        )
    with torch.no_grad():
        got = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()(
            kw["pixel_values"], patch_coord=coord, patch_valid=kw["pixel_attention_mask"]
        )
        _assert_close("timm naflexvit", got, model(**kw).pooler_output)
    _published_fixed_res(tmp_path / "fixed")
    with pytest.raises(ValueError, match=r"posemb_resample='bicubic' \(Siglip2VisionModel resizes its table"):
        options = HfWriteOptions(model_type="siglip2_vision_model")
        convert(tmp_path / "fixed", tmp_path / "fixed2", to_fmt="hf_family", write_options=options)
    assert not (tmp_path / "fixed2").exists()


def test_a_siglip2_classifier_is_written_back_as_siglip2_s_classifier(tmp_path):
    """A ``Siglip2ForImageClassification`` folder converted to hf_family is written as one (a
    ``Siglip2Config`` nesting the vision_config with ``num_patches``, ``vision_use_head`` false, the
    default text_config, the labels; its processor's patch budget), not as a fixed-size I-JEPA:
    transformers loads it strictly and gives the source's logits on a NaFlex batch bit for bit, both twins
    within 1e-5; every tensor is the source's bit for bit but the unused MAP head, and a second round trip
    is the same folder; so are ``vit train --init``'s exports (``vit_jax.finetune.export``)."""
    from safetensors.numpy import load_file

    from vit_jax.finetune import export

    vision = {**_VISION, "patch_size": 8, "num_patches": 16}
    config = transformers.Siglip2Config(vision_config=vision, num_labels=5)
    model = _normal(transformers.Siglip2ForImageClassification._from_config(config, attn_implementation="eager"))
    model.save_pretrained(tmp_path / "src")
    transformers.Siglip2ImageProcessor(patch_size=8, max_num_patches=64).save_pretrained(tmp_path / "src")
    report = convert(tmp_path / "src", tmp_path / "out", to_fmt="hf_family")
    assert "transformers.Siglip2ForImageClassification.from_pretrained(" in report.load_call
    processor = json.loads((tmp_path / "out" / "preprocessor_config.json").read_text())
    assert (processor["image_processor_type"], processor["max_num_patches"]) == ("Siglip2ImageProcessor", 64)
    written_config = json.loads((tmp_path / "out" / "config.json").read_text())
    vc = written_config["vision_config"]
    assert (written_config["model_type"], written_config["architectures"], len(written_config["id2label"])) == (
        "siglip2",
        ["Siglip2ForImageClassification"],
        5,
    )
    assert (vc["model_type"], vc["num_patches"], vc["vision_use_head"], "image_size" in vc) == (
        "siglip2_vision_model",
        16,
        False,
        False,
    )
    assert written_config["text_config"] == config.to_diff_dict()["text_config"]
    written, info = transformers.Siglip2ForImageClassification.from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info
    _, batch = _naflex_batch(np.random.default_rng(4))
    names = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
    kw = dict(zip(names, (torch.from_numpy(a) for a in batch), strict=True))
    with torch.no_grad():
        ref = model(**kw).logits
        assert torch.equal(written.eval()(**kw).logits, ref)
    back = load_checkpoint(tmp_path / "out", strict=True)
    for name, out, _ in _naflex_twins(back.cfg, back.state, batch, intermediates=False):
        _assert_close(name, out, ref)
    src, out = load_file(tmp_path / "src" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert set(src) - set(out) == {k for k in src if k.startswith("vision_model.head.")} and set(out) <= set(src)
    assert all(np.array_equal(out[k], src[k]) for k in out)
    convert(tmp_path / "out", tmp_path / "again", to_fmt="hf_family")
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert set(again) == set(out) and all(np.array_equal(again[k], out[k]) for k in out)
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == written_config
    source = load_checkpoint(tmp_path / "src")  # `vit train --init`'s exports: the same class and budget
    (tmp_path / "run").mkdir()
    done = export(
        tmp_path / "run",
        source.cfg,
        source.state,
        preprocess=source.info.preprocess,
        classes=None,
        source=source.report,
    )
    assert "transformers.Siglip2ForImageClassification.from_pretrained(" in done.load_calls["hf_family"]
    exported = json.loads((done.paths["hf_family"] / "preprocessor_config.json").read_text())
    assert exported["max_num_patches"] == 64


def _big_vision_naflex(model: torch.nn.Module, heads: int) -> dict[str, np.ndarray]:
    """A ``Siglip2VisionModel``'s weights under big_vision ``naflex_vit``'s names (``params/img/``), the
    inverse of transformers' ``convert_siglip2_to_hf.py``: Dense kernels [in, out], attention kernels
    (D, H, D/H) and (H, D/H, D), ``embedding/kernel`` [P*P*C, D], ``pos_embedding`` [G, G, D]."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    d = sd["embeddings.patch_embedding.weight"].shape[0]
    g = int(np.sqrt(sd["embeddings.position_embedding.weight"].shape[0]))
    out = {
        "embedding/kernel": sd["embeddings.patch_embedding.weight"].T,
        "embedding/bias": sd["embeddings.patch_embedding.bias"],
        "pos_embedding": sd["embeddings.position_embedding.weight"].reshape(g, g, d),
        "Transformer/encoder_norm/scale": sd["post_layernorm.weight"],
        "Transformer/encoder_norm/bias": sd["post_layernorm.bias"],
        "MAPHead_0/probe": sd["head.probe"],
        "MAPHead_0/LayerNorm_0/scale": sd["head.layernorm.weight"],
        "MAPHead_0/LayerNorm_0/bias": sd["head.layernorm.bias"],
    }

    def attention(dst: str, names: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        for name, (w, b) in names.items():
            if name == "out":
                out[f"{dst}/out/kernel"], out[f"{dst}/out/bias"] = w.T.reshape(heads, d // heads, d), b
            else:
                out[f"{dst}/{name}/kernel"], out[f"{dst}/{name}/bias"] = (
                    w.T.reshape(d, heads, d // heads),
                    b.reshape(heads, d // heads),
                )

    def mlp(dst: str, src: str) -> None:
        for i in range(2):
            out[f"{dst}/Dense_{i}/kernel"] = sd[f"{src}.fc{i + 1}.weight"].T
            out[f"{dst}/Dense_{i}/bias"] = sd[f"{src}.fc{i + 1}.bias"]

    w, b = np.split(sd["head.attention.in_proj_weight"], 3), np.split(sd["head.attention.in_proj_bias"], 3)
    attention(
        "MAPHead_0/MultiHeadDotProductAttention_0",
        {n: (w[i], b[i]) for i, n in enumerate(("query", "key", "value"))}
        | {"out": (sd["head.attention.out_proj.weight"], sd["head.attention.out_proj.bias"])},
    )
    mlp("MAPHead_0/MlpBlock_0", "head.mlp")
    i = 0
    while f"encoder.layers.{i}.layer_norm1.weight" in sd:
        src, dst = f"encoder.layers.{i}", f"Transformer/encoderblock_{i}"
        for j in (1, 2):
            out[f"{dst}/LayerNorm_{j - 1}/scale"] = sd[f"{src}.layer_norm{j}.weight"]
            out[f"{dst}/LayerNorm_{j - 1}/bias"] = sd[f"{src}.layer_norm{j}.bias"]
        proj = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "out_proj"}
        attention(
            f"{dst}/MultiHeadDotProductAttention_0",
            {n: (sd[f"{src}.self_attn.{p}.weight"], sd[f"{src}.self_attn.{p}.bias"]) for n, p in proj.items()},
        )
        mlp(f"{dst}/MlpBlock_0", f"{src}.mlp")
        i += 1
    return {f"params/img/{k}": np.ascontiguousarray(v) for k, v in out.items()}


@pytest.mark.slow
def test_big_vision_naflex_npz_equals_transformers_in_both_twins(tmp_path):
    """A big_vision ``naflex_vit`` ``.npz`` (built here from a tiny ``Siglip2VisionModel`` by the inverse of
    transformers' converter, beside a text tower's ``params/txt/`` and ``params/t``): read with
    ``posemb_resample`` bilinear_aa and its 4x4 table derived, what an .npz cannot hold (GELU, eps,
    channels) assumed; given nothing, both twins equal transformers' pooled output on four aspect ratios.
    Written back to big_vision (naflex_vit's layout, the source's): its image tower bit for bit; written
    from the transformers folder: read as naflex_vit, equal to transformers."""
    model = _siglip2_folder(tmp_path / "hf")
    files = _big_vision_naflex(model, heads=4) | {
        "params/txt/Embed_0/embedding": np.zeros((64, 2), np.float32),
        "params/t": np.array([2.3], np.float32),
    }
    np.savez(tmp_path / "siglip2_naflex.npz", **files)
    ckpt = load_checkpoint(tmp_path / "siglip2_naflex.npz")
    cfg = ckpt.cfg
    assert ckpt.report.format == "big_vision" and ckpt.report.layout.endswith("naflex_vit")
    assert (cfg.posemb_resample, cfg.image_size, cfg.patch_size, cfg.pool) == ("bilinear_aa", (32, 32), (8, 8), "map")
    assert set(ckpt.report.assumed) == {"gelu", "ln_eps", "in_chans"}
    assert cfg == load_checkpoint(tmp_path / "hf").cfg.replace(dynamic_img_size=True)
    _, batch = _naflex_batch(np.random.default_rng(2))
    patches, mask, shapes = (torch.from_numpy(a) for a in batch)
    with torch.no_grad():
        ref = model(pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes).pooler_output
        got = vit_torch.from_numpy(cfg, ckpt.state)(patches, patch_mask=mask, spatial_shapes=shapes)
    _assert_close("torch", got, ref)
    _assert_close("jax", _jax(cfg, ckpt.state, batch), ref)
    # written back: naflex_vit's layout, the source's image tower bit for bit; from the transformers folder too
    options = NpzWriteOptions(prefix="params/img/")  # the layout from the source: naflex_vit
    convert(tmp_path / "siglip2_naflex.npz", tmp_path / "back.npz", to_fmt="big_vision", write_options=options)
    with np.load(tmp_path / "back.npz") as z:
        tower = {k: v for k, v in files.items() if k.startswith("params/img/")}
        assert set(z.files) == set(tower) and all(np.array_equal(z[k], v) for k, v in tower.items())
    convert(tmp_path / "hf", tmp_path / "from_hf.npz", to_fmt="big_vision", write_options=options)
    written = load_checkpoint(tmp_path / "from_hf.npz", gelu="tanh", ln_eps=1e-6, in_chans=3, strict=True)
    assert written.report.layout.endswith("naflex_vit") and written.cfg == cfg
    with torch.no_grad():
        got = vit_torch.from_numpy(written.cfg, written.state)(patches, patch_mask=mask, spatial_shapes=shapes)
    _assert_close("torch, written from transformers", got, ref)


def test_naflex_preprocessing_equals_transformers_siglip2_processor():
    """``vit_common.naflex.preprocess`` + ``stack_patches`` equal transformers' ``Siglip2ImageProcessorPil``
    bit for bit (patches, mask, spatial shapes) on photos of several aspect ratios, one smaller than the
    budget (the RGBA one given to transformers as the project's ``to_channels`` makes it RGB)."""
    from PIL import Image

    from vit_common.data.images import to_channels
    from vit_common.naflex import preprocess, stack_patches

    rng = np.random.default_rng(4)
    images = [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((97, 240), (300, 64), (20, 20))
    ]
    images.append(Image.fromarray(rng.integers(0, 256, (50, 70, 4), dtype=np.uint8), "RGBA"))
    processor = transformers.Siglip2ImageProcessorPil(patch_size=16, max_num_patches=64)
    ref = processor([to_channels(im, 3) for im in images], return_tensors="np")
    patches, mask, shapes = stack_patches([preprocess(im, 16, 64) for im in images], 64)
    assert np.array_equal(shapes, ref["spatial_shapes"]) and np.array_equal(mask, ref["pixel_attention_mask"] == 1)
    assert np.array_equal(patches, ref["pixel_values"])


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_vit_predict_on_a_naflex_model_equals_transformers(framework, tmp_path, capsys):
    """``vit predict FOLDER IMAGES --max-patches 16`` on a ``Siglip2ForImageClassification`` folder: each
    image kept at its aspect ratio (three ratios, one batch), the probabilities transformers gives on its
    processor's output, to 1e-5."""
    from PIL import Image

    from vit_cli.main import main

    text = {k: v for k, v in _PUBLISHED["text_config"].items() if k != "model_type"}
    config = transformers.Siglip2Config(
        vision_config={**_VISION, "patch_size": 8, "num_patches": 16}, text_config=text, num_labels=5
    )
    model = _normal(transformers.Siglip2ForImageClassification._from_config(config, attn_implementation="eager"))
    model.save_pretrained(tmp_path / "hf")
    rng = np.random.default_rng(5)
    paths = []
    for i, (h, w) in enumerate(((30, 70), (64, 20), (40, 40))):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    processor = transformers.Siglip2ImageProcessorPil(patch_size=8, max_num_patches=16)
    inputs = processor([Image.open(p) for p in paths], return_tensors="pt")
    with torch.no_grad():
        ref = model(**inputs).logits.double().softmax(-1).numpy()
    capsys.readouterr()
    args = ["predict", str(tmp_path / "hf"), *map(str, paths), "--max-patches", "16", "--json", "--top-k", "5"]
    assert main([*args, "--framework", framework]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["image"] for r in rows] == [str(p) for p in paths]
    for row, want in zip(rows, ref, strict=True):
        got = np.zeros(5)
        for t in row["top"]:
            got[t["index"]] = t["probability"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_siglip2_folder_s_processor_config_is_its_preprocessing(tmp_path, capsys):
    """A ``Siglip2ForImageClassification`` folder with the preprocessor_config.json transformers writes (one
    file for ``Siglip2ImageProcessor``, its Fast and its Pil class; non-default budget, filter and
    statistics): read as declared, its patches equal the Pil processor's bit for bit (torchvision's within
    ``pixels_torchvision``), ``vit info`` names it and ``vit predict`` (no flag) gives the probabilities
    transformers gives on the Pil processor's output, to 1e-5; ``--max-patches`` changes the budget."""
    import skimage
    from PIL import Image
    from transformers import AutoImageProcessor

    from vit_cli.main import main
    from vit_common.checkpoints.metadata import hf_preprocess_file
    from vit_common.data.images import Preprocess
    from vit_common.naflex import preprocess, stack_patches
    from vit_common.tolerance import tolerance

    text = {k: v for k, v in _PUBLISHED["text_config"].items() if k != "model_type"}
    config = transformers.Siglip2Config(
        vision_config={**_VISION, "patch_size": 8, "num_patches": 16}, text_config=text, num_labels=5
    )
    model = _normal(transformers.Siglip2ForImageClassification._from_config(config, attn_implementation="eager"))
    model.save_pretrained(tmp_path / "hf")
    kw = dict(patch_size=8, max_num_patches=12, resample=3, image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.3, 0.4])
    files = []
    for name in ("Siglip2ImageProcessor", "Siglip2ImageProcessorFast", "Siglip2ImageProcessorPil"):
        getattr(transformers, name)(**kw).save_pretrained(tmp_path / name)
        files.append(json.loads((tmp_path / name / "preprocessor_config.json").read_text()))
    assert files[0] == files[1] == files[2]
    transformers.Siglip2ImageProcessorPil(**kw).save_pretrained(tmp_path / "hf")
    want = Preprocess((0.4, 0.5, 0.6), (0.2, 0.3, 0.4), "bicubic", max_patches=12)
    assert hf_preprocess_file(tmp_path / "hf", "siglip2", 8) == want
    assert load_checkpoint(tmp_path / "hf").info.preprocess == want

    rng = np.random.default_rng(6)
    paths = []
    for i, (h, w) in enumerate(((30, 70), (64, 20), (40, 40), (9, 200))):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    ours = stack_patches([preprocess(Image.open(p), 8, 12, 3, want) for p in paths], 12)
    pil = AutoImageProcessor.from_pretrained(tmp_path / "hf", backend="pil")([Image.open(p) for p in paths])
    assert np.array_equal(ours[0], np.asarray(pil["pixel_values"])), "pixels differ from Siglip2ImageProcessorPil"
    assert np.array_equal(ours[1], np.asarray(pil["pixel_attention_mask"]) == 1)
    assert np.array_equal(ours[2], np.asarray(pil["spatial_shapes"]))
    # torchvision's bicubic departs from Pillow's on noise shrunk this far (11 levels measured), on photos
    # within the table's bound (1 level measured)
    photos = [Image.open(Path(skimage.data_dir) / n).convert("RGB") for n in ("astronaut.png", "coffee.png")]
    fast = AutoImageProcessor.from_pretrained(tmp_path / "hf", backend="torchvision")(photos)
    ours = stack_patches([preprocess(im, 8, 12, 3, want) for im in photos], 12)
    std = np.tile(np.asarray(want.std), 64)  # uint8 levels of the (P, P, C) flattened patches
    levels = np.abs(ours[0] - np.asarray(fast["pixel_values"], np.float32)) * std * 255
    assert np.array_equal(ours[2], np.asarray(fast["spatial_shapes"]))
    assert levels.max() <= tolerance("pixels_torchvision", "uint8")[1], levels.max()

    capsys.readouterr()
    assert main(["info", str(tmp_path / "hf")]) == 0
    assert "at most 12 patches" in capsys.readouterr().out
    with torch.no_grad():
        ref = model(**{k: torch.as_tensor(np.asarray(v)) for k, v in pil.items()}).logits.double().softmax(-1)
    for flags, expected in (([], ref.numpy()), (["--max-patches", "16"], None)):
        args = ["predict", str(tmp_path / "hf"), *map(str, paths), "--json", "--top-k", "5", "--framework", "torch"]
        assert main([*args, *flags]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        got = np.zeros((len(rows), 5))
        for i, row in enumerate(rows):
            for t in row["top"]:
                got[i, t["index"]] = t["probability"]
        if expected is not None:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
        else:  # a budget of 16: other inputs, other probabilities
            assert np.abs(got - ref.numpy()).max() > 1e-4


@pytest.mark.slow
def test_vit_parity_runs_a_naflex_model_s_images_as_a_naflex_batch(tmp_path):
    """``run_parity`` with a folder of images of three aspect ratios and a NaFlex model (its stored
    preprocessing a budget of 16 patches): one NaFlex batch through both twins, every intermediate within
    the float32 tolerance; ``max_patches`` (``vit parity --max-patches``) replaces the budget; a reference
    library is refused by name (it takes fixed-size images here)."""
    from PIL import Image
    from safetensors.numpy import save_file

    from vit_common.checkpoints.formats.canonical import FORMAT_TAG
    from vit_common.data.images import Preprocess
    from vit_compare.inference import run_parity

    cfg = ViTConfig(**{**_NAFLEX, "num_classes": 3}, **_NAFLEX_CONFIGS["map"])
    pre = json.dumps(Preprocess(max_patches=16).to_dict())
    save_file(random_state(cfg, seed=2, scale=0.3), str(tmp_path / "n.safetensors"),
              {"format": FORMAT_TAG, "vit_config": cfg.to_json(), "preprocess": pre})  # fmt: skip
    rng = np.random.default_rng(7)
    (tmp_path / "images").mkdir()
    for i, (h, w) in enumerate(((30, 70), (64, 20), (40, 40))):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "images" / f"{i}.png")
    result = run_parity(tmp_path / "n.safetensors", images=tmp_path / "images")
    assert result.ok and result.images == ["0.png", "1.png", "2.png"] and result.agreement == 1.0
    assert {r.name for r in result.rows} >= {"patch_embed", "block00", "attn01", "logits"}
    nine = run_parity(tmp_path / "n.safetensors", images=tmp_path / "images", max_patches=9, keep_outputs=True)
    assert nine.ok and nine.outputs["torch"]["attn01"].shape[-1] == 9  # no prefix token, N = the budget
    with pytest.raises(ValueError, match="--against transformers with a NaFlex model's images"):
        run_parity(tmp_path / "n.safetensors", images=tmp_path / "images", against="transformers")
    with pytest.raises(ValueError, match="--against transformers on a NaFlex model with generated images"):
        run_parity(tmp_path / "n.safetensors", against="transformers")  # was a shape error from transformers


@pytest.mark.slow
@pytest.mark.parametrize("family", ["Siglip2", "Siglip"])
def test_a_siglip_vision_model_given_classes_is_exported_as_its_family_s_classifier(family, tmp_path, capsys):
    """A ``Siglip2VisionModel`` (``SiglipVisionModel``) folder without the MAP head read with 5 classes and
    mean pooling is written by ``vit convert`` and by ``vit train --init``'s exports
    (``vit_jax.finetune.export``) as ``Siglip2ForImageClassification`` (``SiglipForImageClassification``)
    with model_type ``siglip2`` (``siglip``), not as an I-JEPA; transformers loads both strictly, and with
    a seeded head gives the torch twin's logits within 1e-5 (a NaFlex batch; 32-px images)."""
    from vit_cli.main import main
    from vit_jax.finetune import export

    sizes = {**_VISION, "patch_size": 8, "vision_use_head": False}
    config = getattr(transformers, f"{family}VisionConfig")(
        **sizes, **({"num_patches": 16} if family == "Siglip2" else {})
    )
    _normal(getattr(transformers, f"{family}VisionModel")._from_config(config)).save_pretrained(tmp_path / "src")
    capsys.readouterr()  # save_pretrained's progress bar
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "cli"), "--to", "hf_family", "--num-classes", "5"]
    assert main([*argv, "--set", "pool=gap"]) == 0, capsys.readouterr().err
    source = load_checkpoint(tmp_path / "src", num_classes=5, pool="gap")
    rng = np.random.default_rng(5)
    state = {**source.state, "head.weight": rng.standard_normal((5, 32)).astype(np.float32)}
    (tmp_path / "run").mkdir()
    done = export(
        tmp_path / "run", source.cfg, state, preprocess=source.info.preprocess, classes=None, source=source.report
    )
    arch = getattr(transformers, f"{family}ForImageClassification")
    for folder in (tmp_path / "cli", done.paths["hf_family"]):
        written = json.loads((folder / "config.json").read_text())
        assert (written["architectures"], written["model_type"]) == ([arch.__name__], family.lower())
        assert written["vision_config"]["model_type"] == f"{family.lower()}_vision_model"
        model, info = arch.from_pretrained(folder, output_loading_info=True, attn_implementation="eager")
        assert not any(info.values()), info
    ours = vit_torch.from_numpy(source.cfg, state).eval()
    if family == "Siglip2":
        _, batch = _naflex_batch(np.random.default_rng(6))
        names = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
        kw = dict(zip(names, (torch.from_numpy(a) for a in batch), strict=True))
        args = (kw["pixel_values"],), dict(patch_mask=batch[1], spatial_shapes=batch[2])
    else:
        kw = {"pixel_values": torch.from_numpy(rng.standard_normal((2, 3, 32, 32)).astype(np.float32))}
        args = (kw["pixel_values"],), {}
    with torch.no_grad():
        _assert_close(arch.__name__, model.eval()(**kw).logits, ours(*args[0], **args[1]))


def test_a_big_vision_naflex_npz_is_written_as_a_siglip2_folder(tmp_path, capsys):
    """``vit convert X.npz out --to hf_family`` of a big_vision naflex_vit file (no family's folder, its
    table resized per image bilinearly with antialias) writes a ``Siglip2VisionModel`` folder, not a
    fixed-resolution SigLIP: transformers loads it strictly and equals the torch twin on the batch of
    four aspect ratios within 1e-5."""
    from vit_cli.main import main
    from vit_common.checkpoints.convert import save_checkpoint

    cfg = ViTConfig(image_size=32, patch_size=8, width=64, depth=1, num_heads=2, mlp_dim=128, num_classes=0,
                    class_token=False, pool="map", gelu="tanh", posemb_resample="bilinear_aa")  # fmt: skip
    state = random_state(cfg, seed=3)
    options = NpzWriteOptions(prefix="params/img/", naflex=True)
    save_checkpoint(tmp_path / "a.npz", cfg, state, "big_vision", options=options)
    args = ["convert", str(tmp_path / "a.npz"), str(tmp_path / "out"), "--to", "hf_family", "--accept-assumed", "all"]
    assert main([*args, "--set", "num_heads=2"]) == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "siglip2_vision_model" and config["architectures"] == ["Siglip2VisionModel"]
    written, info = transformers.Siglip2VisionModel.from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info
    patches, mask, shapes = _naflex_batch(np.random.default_rng(4))[1]
    with torch.no_grad():
        got = written.eval()(torch.from_numpy(patches), torch.from_numpy(mask), torch.from_numpy(shapes))
        ref = vit_torch.from_numpy(cfg.replace(dynamic_img_size=True), state)(
            torch.from_numpy(patches), patch_mask=torch.from_numpy(mask), spatial_shapes=torch.from_numpy(shapes)
        )
    _assert_close("siglip2", got.pooler_output.numpy(), ref.numpy())
