"""transformers ``dinov3_vit`` folders (``DINOv3ViTModel.save_pretrained``) through the hf_dinov3 format in
both twins: the config and tensors read (vit_common.checkpoints.formats.hf_dinov3), both twins equal to
transformers' own forward at the native size and another one, and the folder written back bit for bit,
loading strictly in transformers."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats import hf_dinov3
from vit_common.tolerance import compare
from vit_jax.weights import from_numpy as jax_from_numpy
from vit_torch.weights import from_numpy as torch_from_numpy

transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=64, patch_size=16
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [
        dict(num_register_tokens=4),  # plain MLP, q and v biases only (key_bias=False, transformers' default)
        pytest.param(
            dict(num_register_tokens=2, use_gated_mlp=True, hidden_act="silu", key_bias=True), marks=pytest.mark.slow
        ),
        pytest.param(
            dict(proj_bias=False, mlp_bias=False, use_gated_mlp=True, hidden_act="silu"), marks=pytest.mark.slow
        ),
    ],
    ids=["plain", "gated_key_bias", "no_proj_mlp_bias"],
)
def test_dinov3_vit_folder_in_both_twins(kw, tmp_path):
    torch.manual_seed(0)
    model = transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**TINY, **kw)).eval()
    with torch.no_grad():  # off the init: LayerScale 1 and every weight moved
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    tensors = safetensors_numpy.load_file(tmp_path / "hf" / "model.safetensors")
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    cfg, state = ckpt.cfg, ckpt.state
    assert ckpt.report.format == "hf_dinov3" and ckpt.report.assumed == []
    assert (cfg.proj_bias, cfg.mlp_bias) == (kw.get("proj_bias", True), kw.get("mlp_bias", True))
    for hw in ((64, 64), (48, 80)):
        images = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = model(pixel_values=images)
            tokens_ref, pooled_ref = ref.last_hidden_state.numpy(), ref.pooler_output.numpy()
            pooled_t = torch_from_numpy(cfg, state)(images).numpy()
            tokens_t = torch_from_numpy(cfg.replace(pool="none"), state)(images).numpy()
        x = jnp.asarray(images.permute(0, 2, 3, 1).numpy())
        pooled_j = np.asarray(jax_from_numpy(cfg, state)(x))
        tokens_j = np.asarray(jax_from_numpy(cfg.replace(pool="none"), state)(x))
        for name, out, want in (
            ("pooled torch", pooled_t, pooled_ref),
            ("pooled jax", pooled_j, pooled_ref),
            ("tokens torch", tokens_t, tokens_ref),
            ("tokens jax", tokens_j, tokens_ref),
        ):
            c = compare(f"{name} {hw}", out, want, "tensor", "float32")
            assert c.ok, str(c)
    # written back: the same tensors bit for bit (mask_token, training only, as zeros) and a strict load
    save_checkpoint(tmp_path / "ours", cfg, state, "hf_dinov3")
    written = safetensors_numpy.load_file(tmp_path / "ours" / "model.safetensors")
    assert set(written) == set(tensors)
    assert all(np.array_equal(written[k], tensors[k]) for k in tensors if k != "embeddings.mask_token")
    back, info = transformers.DINOv3ViTModel.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(back.eval()(pixel_values=images).pooler_output, model(pixel_values=images).pooler_output)
    again = load_checkpoint(tmp_path / "ours", strict=True)
    assert again.cfg == cfg and all(np.array_equal(again.state[k], v) for k, v in state.items())


def test_dinov3_vit_refusals_name_the_key(tmp_path, small_cfg, random_state):
    with pytest.raises(ValueError, match="key_bias=True"):
        hf_dinov3.dinov3_config({"query_bias": False, "value_bias": False, "key_bias": True})
    with pytest.raises(ValueError, match="hidden_act='gelu' with use_gated_mlp=True"):
        hf_dinov3.dinov3_config({"use_gated_mlp": True})
    with pytest.raises(ValueError, match="head_dim divisible by 4"):
        hf_dinov3.dinov3_config({"hidden_size": 40, "num_attention_heads": 4})
    with pytest.raises(ValueError, match="config.json proj_bias='no' is not a bool"):
        hf_dinov3.dinov3_config({"proj_bias": "no"})
    transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**TINY | dict(num_hidden_layers=1))).save_pretrained(
        tmp_path / "hf"
    )
    with pytest.raises(ValueError, match="a dinov3_vit folder stores no periods"):
        load_checkpoint(tmp_path / "hf", rope_periods="stored")
    lacks = "posemb='learn' .dinov3_vit has 'none'.; rope='none' .dinov3_vit has 'dinov3'.; num_classes=10"
    with pytest.raises(ValueError, match=f"cannot hold this model: {lacks}"):
        save_checkpoint(tmp_path / "a", small_cfg, random_state(small_cfg), "hf_dinov3")
    assert not (tmp_path / "a").exists()


def test_dinov3_vit_folder_with_its_processor_converts(tmp_path, capsys):
    """A folder with the preprocessor_config.json transformers saves (DINOv3ViTImageProcessor) is read,
    declared, and written back as the same processor."""
    from vit_cli.main import main

    transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**TINY | dict(num_hidden_layers=1))).save_pretrained(
        tmp_path / "hf"
    )
    transformers.DINOv3ViTImageProcessor(size={"height": 64, "width": 64}).save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ours"), "--to", "hf_dinov3"]) == 0
    ckpt = load_checkpoint(tmp_path / "ours", strict=True)
    assert ckpt.info.preprocess_source == f"declared: {tmp_path / 'ours' / 'preprocessor_config.json'}"
    assert ckpt.info.preprocess.rescale_before_resize and ckpt.info.preprocess.resize_size == (64, 64)
    proc = transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours")
    assert type(proc).__name__ == "DINOv3ViTImageProcessor"
