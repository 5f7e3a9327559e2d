"""Meta's original DINOv3 ``.pth`` (torch.hub keys) through the dinov3_original format in both twins.

The test files are made by the inverse of timm's own converter (``timm.models.eva.checkpoint_filter_fn``,
its Meta DINOv3 branch) from a tiny timm DINOv3 model, with a non-zero k bias that ``qkv.bias_mask``
zeroes and the periods rounded to bfloat16 as Meta's files hold them; timm's converter and timm's model are
the reference. The periods choice: with peaked attention, 'stored' gives the original's numbers (timm's
model running the file's periods) and 'computed' timm's (its float32 periods)."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

from vit_cli.main import main
from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.tolerance import compare
from vit_jax.weights import from_numpy as jax_from_numpy
from vit_torch.formats import READERS, WRITERS
from vit_torch.weights import from_numpy as torch_from_numpy

timm = pytest.importorskip("timm")
from timm.models.eva import checkpoint_filter_fn  # noqa: E402

SMALL = dict(embed_dim=64, depth=2, num_heads=4, img_size=64, num_classes=0, global_pool="token")


def _timm(name: str, scale_qk: float = 1.0, **kw) -> torch.nn.Module:
    """A tiny timm DINOv3 with every weight moved off the init (LayerScale 1e-5 would hide the blocks);
    ``scale_qk`` multiplies the q and k rows of qkv (peaked attention)."""
    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False, **(SMALL | kw)).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.add_((0.5 if "gamma" in n else 0.05) * torch.randn_like(p))
            if n.endswith("attn.qkv.weight"):
                p[: 2 * p.shape[0] // 3] *= scale_qk
    return m


def _meta_state(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    """timm's converter run backwards: Meta's names, a random k bias under a [1, 0, 1] bias mask, the
    periods rounded to bfloat16, a mask token."""
    out: dict[str, torch.Tensor] = {}
    g = torch.Generator().manual_seed(3)
    swiglu = any(".fc1_g." in k for k in m.state_dict())
    for k, v in m.state_dict().items():
        if k.startswith("rope.") or k.endswith("attn.k_bias"):
            continue
        if k.endswith("attn.q_bias"):
            b = k[: -len("q_bias")]
            v_bias = m.state_dict()[b + "v_bias"]
            out[b + "qkv.bias"] = torch.cat([v, torch.randn(v.shape, generator=g), v_bias])
            out[b + "qkv.bias_mask"] = torch.cat([torch.ones_like(v), torch.zeros_like(v), torch.ones_like(v)])
            continue
        if k.endswith("attn.v_bias"):
            continue
        k = k.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma").replace("reg_token", "storage_tokens")
        k = k.replace("mlp.fc1_g", "mlp.w1").replace("mlp.fc1_x", "mlp.w2")
        k = k.replace("mlp.fc2", "mlp.w3") if swiglu else k
        out[k] = v.clone()
    periods = m.rope.periods.numpy().astype(ml_dtypes.bfloat16).astype(np.float32)
    out["rope_embed.periods"] = torch.from_numpy(periods)
    out["mask_token"] = torch.randn(1, SMALL["embed_dim"], generator=g)
    return out


def _twins(cfg, state, images: torch.Tensor) -> list[np.ndarray]:
    with torch.no_grad():
        out_t = torch_from_numpy(cfg, state)(images).numpy()
    out_j = np.asarray(jax_from_numpy(cfg, state)(jnp.asarray(images.permute(0, 2, 3, 1).numpy())))
    return [out_t, out_j]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["vit_small_patch16_dinov3_qkvb", pytest.param("vit_small_plus_patch16_dinov3", marks=pytest.mark.slow)]
)
def test_meta_file_equals_timm_converter_in_both_twins(name, tmp_path):
    m = _timm(name)
    meta = _meta_state(m)
    torch.save(meta, tmp_path / "dinov3.pth")
    ref_model = timm.create_model(name, pretrained=False, **SMALL).eval()
    ref_model.load_state_dict(checkpoint_filter_fn(dict(meta), ref_model), strict=True)  # timm's converter
    ckpt = load_checkpoint(tmp_path / "dinov3.pth", readers=READERS, rope_periods="computed")
    assert ckpt.report.format == "dinov3_original" and ckpt.cfg.rope_periods == "computed"
    assert "k_bias" in ckpt.cfg.inert_fields() or ckpt.cfg.k_bias is False
    assert "rope.periods" not in ckpt.state
    for hw in ((64, 64), (48, 80)):
        images = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = ref_model(images).numpy()
        for twin, out in zip(("torch", "jax"), _twins(ckpt.cfg, ckpt.state, images), strict=True):
            c = compare(f"{twin} {hw}", out, ref, "tensor", "float32")
            assert c.ok, str(c)
    # stored periods (the default): written back bit for bit, the k third of the bias zeroed
    stored = load_checkpoint(tmp_path / "dinov3.pth", readers=READERS)
    assert stored.cfg.rope_periods == "stored"
    save_checkpoint(tmp_path / "back.pth", stored.cfg, stored.state, "dinov3_original", writers=WRITERS)
    back = torch.load(tmp_path / "back.pth", weights_only=True)
    assert set(back) == set(meta)
    for k, v in meta.items():
        want = torch.zeros_like(v) if k == "mask_token" else v
        if k.endswith("qkv.bias"):
            want = v * meta[k + "_mask"]
        assert torch.equal(back[k], want), k


@pytest.mark.slow
def test_periods_choice_gives_the_original_or_timm(tmp_path, capsys):
    """bf16-rounded periods with peaked attention (q/k weights scaled 12x), every token compared (the class
    token alone hides most of it): 'stored' equals timm's model running the file's periods (the original's
    numbers), 'computed' timm's own; the two differ by ~1e-2 relative."""
    m = _timm("vit_small_patch16_dinov3_qkvb", scale_qk=12.0, depth=1, num_heads=1, img_size=224, global_pool="")
    meta = _meta_state(m)
    torch.save(meta, tmp_path / "dinov3.pth")
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        timm_numbers = m(images).numpy()
        m.rope.periods.copy_(meta["rope_embed.periods"])
        original_numbers = m(images).numpy()
    gap = compare("bf16 vs float32 periods", original_numbers, timm_numbers, "tensor", "float32")
    assert gap.rel >= 100 * gap.bound, str(gap)  # measured 9.9e-3
    for mode, ref in (("stored", original_numbers), ("computed", timm_numbers)):
        ckpt = load_checkpoint(tmp_path / "dinov3.pth", readers=READERS, rope_periods=mode)
        assert any("differ from float32 recomputed ones by up to" in n for n in ckpt.report.notes)
        every_token = ckpt.cfg.replace(pool="none")
        for twin, out in zip(("torch", "jax"), _twins(every_token, ckpt.state, images), strict=True):
            c = compare(f"{mode} {twin}", out, ref, "tensor", "float32")
            assert c.ok, str(c)
    assert main(["info", str(tmp_path / "dinov3.pth"), "--rope-periods", "recomputed"]) == 0
    out = capsys.readouterr().out
    assert "rope_periods         = 'computed'" in out and "differ from float32 recomputed ones" in out


def test_meta_refusals_are_one_line(tmp_path, capsys):
    meta = _meta_state(_timm("vit_small_patch16_dinov3_qkvb", depth=1))
    for edit, words in (
        (dict(bias=torch.ones(192)), "qkv.bias_mask is neither"),
        (dict(periods=torch.ones(3)), "rope_embed.periods of shape (3,)"),
        (dict(periods=torch.ones(4)), "rope_embed.periods are not base 100's"),
    ):
        bad = dict(meta)
        if "bias" in edit:
            bad["blocks.0.attn.qkv.bias_mask"] = edit["bias"] * torch.arange(192) % 2
        else:
            bad["rope_embed.periods"] = edit["periods"]
        torch.save(bad, tmp_path / "bad.pth")
        assert main(["convert", str(tmp_path / "bad.pth"), str(tmp_path / "out.safetensors")]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and not (tmp_path / "out.safetensors").exists()


@pytest.mark.slow  # two parity runs with timm: 10 s of CPU
def test_vit_parity_against_timm_on_a_meta_file_in_both_periods_modes(tmp_path, capsys):
    """`vit parity --against timm` on a Meta file: 'stored' (the default) runs timm with the file's
    bf16-rounded periods (timm's own float32 ones part by 6e-5 here, beyond the bound), 'recomputed' timm
    as it is; both pass, the report names the choice."""
    import json

    torch.save(_meta_state(_timm("vit_small_patch16_dinov3_qkvb")), tmp_path / "dinov3.pth")
    for mode in ("stored", "recomputed"):
        argv = ["parity", str(tmp_path / "dinov3.pth"), "--against", "timm", "--json", str(tmp_path / f"{mode}.json")]
        assert main([*argv, "--rope-periods", mode]) == 0
        out = capsys.readouterr().out
        assert ("timm running the file's stored RoPE periods" in out) == (mode == "stored")
        report = json.loads((tmp_path / f"{mode}.json").read_text())
        timm_rows = [r["against"] for r in report["rows"] if r["against"] is not None]
        assert report["ok"] and len(timm_rows) == 4 and all(r["ok"] for r in timm_rows), report["rows"]
        assert report["conversion"]["config"]["rope_periods"] == {"stored": "stored"}.get(mode, "computed")


def test_a_model_without_registers_is_written_without_storage_tokens(tmp_path):
    """A transformers DINOv3 of num_register_tokens=0 written as Meta's file holds no ``storage_tokens``
    (Meta's ``DinoVisionTransformer`` of ``n_storage_tokens=0`` has none) and reads back bit-exact, with the
    periods it stores."""
    import transformers

    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, image_size=64)
    config = transformers.DINOv3ViTConfig(**tiny, patch_size=16, num_register_tokens=0)
    transformers.DINOv3ViTModel(config).save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "d3.pth"), "--to", "dinov3_original"]) == 0
    written = torch.load(tmp_path / "d3.pth", weights_only=True)
    assert "storage_tokens" not in written and "mask_token" in written
    want, got = load_checkpoint(tmp_path / "hf"), load_checkpoint(tmp_path / "d3.pth", readers=READERS)
    assert got.report.format == "dinov3_original" and got.cfg.reg_tokens == 0
    assert set(got.state) - set(want.state) == {"rope.periods"}  # stored by Meta's files, not by transformers'
    assert all(np.array_equal(np.asarray(got.state[k]), np.asarray(want.state[k])) for k in want.state)
