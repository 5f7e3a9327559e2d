"""timm ``Eva`` exports (DINOv3, Perception Encoder, EVA-02, RoPE-ViT): every block layout the timm format
reads is written back as a timm .safetensors, .pth and hub folder. Each export loads strictly in timm
(its load call: ``timm.create_model(name, pretrained=False, **kwargs)`` + ``load_state_dict(strict=True)``,
or ``local-dir:`` for a folder), gives timm's outputs bit for bit, holds the source's tensors bit for bit,
and reads back to the same config and canonical state."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from vit_cli.main import main
from vit_common.checkpoints.convert import convert, load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.timm_eva import EVA_NAMES, eva_name
from vit_common.checkpoints.formats.timm_hub import hub_config_json
from vit_torch.formats import READERS, WRITERS
from vit_torch.timm_eva import eva_config
from vit_torch.weights import tensor_to_numpy

timm = pytest.importorskip("timm")

# timm name -> image size: one per family and block layout the reader takes.
LAYOUTS = {
    "vit_base_patch16_dinov3": 32,  # half-layout RoPE, registers, no qkv bias
    "vit_base_patch16_dinov3_qkvb": 32,  # q/v biases without a key bias
    "vit_pe_core_tiny_patch16_384": 32,  # cat xy offset 1, norm_pre, learned table, MAP head of 8 heads
    "vit_pe_spatial_tiny_patch16_512": 32,  # no pool, no final norm
    "eva02_tiny_patch14_224": 28,  # fused qkv with q/v biases, packed SwiGLU
    "eva02_base_patch14_224": 28,  # split q/k/v, split SwiGLU with its inner norm (scale_mlp)
    "eva02_large_patch14_clip_224": 28,  # plus a norm inside attention (scale_attn_inner)
    "vit_base_patch16_rope_mixed_224": 32,  # learned rope.freqs
    "vit_base_patch16_rope_ape_224": 32,  # axial RoPE plus a patch-only learned table
    "vit_base_patch16_rope_reg1_gap_256": 32,  # a register, no class token, average pooling
}
SLOW = {"vit_pe_spatial_tiny_patch16_512", "eva02_large_patch14_clip_224"}  # their originals run fast


def _timm(name: str, size: int) -> torch.nn.Module:
    """A tiny timm model with weights moved off timm's init."""
    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False, embed_dim=32, depth=1, num_heads=2, img_size=size, num_classes=3)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


def _run(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model.eval()(x).numpy()


def _same_state(a, b) -> bool:
    return set(a) == set(b) and all(np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in LAYOUTS])
def test_every_eva_layout_is_written_back_as_timm_loads_it(tmp_path, name):
    size = LAYOUTS[name]
    m = _timm(name, size)
    timm.models.save_for_hf(m, tmp_path / "src", safe_serialization=True)
    source = {k: tensor_to_numpy(v) for k, v in m.state_dict().items()}
    src = load_checkpoint(tmp_path / "src", readers=READERS, strict=True)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    ref = _run(m, x)
    for dst in ("m.safetensors", "m.pth", "hub"):
        report = convert(tmp_path / "src", tmp_path / dst, to_fmt="timm", readers=READERS, writers=WRITERS)
        assert report.written_format == "timm" and report.assumed == []
        scope: dict = {}
        exec(report.load_call, scope)  # timm.create_model + load_state_dict(strict=True), or local-dir:
        assert np.array_equal(_run(scope["model"], x), ref), dst
        written = (
            torch.load(tmp_path / dst, weights_only=True)
            if dst.endswith(".pth")
            else load_file(tmp_path / dst / "model.safetensors" if dst == "hub" else tmp_path / dst)
        )
        assert _same_state(
            {k: tensor_to_numpy(v) for k, v in written.items()} if dst.endswith(".pth") else written, source
        )
        if not dst.endswith(".pth"):  # a .pth holds no RoPE settings: read back through its load call only
            for readers in (READERS, {}):  # timm's reading, and the header's config without timm
                back = load_checkpoint(tmp_path / dst, readers=readers, strict=True)
                assert back.cfg == src.cfg and _same_state(back.state, src.state), (dst, readers)


def test_the_qkv_spelling_and_timm_name_are_write_options(tmp_path, capsys):
    """``vit convert --timm-eva-qkv split`` writes EVA-02 tiny's fused attention as q_proj/k_proj/v_proj,
    and ``--timm-architecture`` names the model its printed load call builds; timm loads it strictly."""
    m = _timm("eva02_tiny_patch14_224", 28)
    timm.models.save_for_hf(m, tmp_path / "src", safe_serialization=True)
    out = tmp_path / "split.safetensors"
    argv = ["convert", str(tmp_path / "src"), str(out), "--to", "timm", "--timm-eva-qkv", "split", "--json"]
    assert main([*argv, "--timm-architecture", "eva02_base_patch14_224"]) == 0
    call = json.loads(capsys.readouterr().out)["load_call"]
    assert "timm.create_model('eva02_base_patch14_224', pretrained=False," in call and "qkv_fused=False" in call
    keys = set(load_file(out))
    assert "blocks.0.attn.k_proj.weight" in keys and "blocks.0.attn.qkv.weight" not in keys
    assert "blocks.0.attn.k_proj.bias" not in keys  # EvaAttention: no key bias
    scope: dict = {}
    exec(call, scope)
    x = torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    assert np.array_equal(_run(scope["model"], x), _run(m, x))


def test_stored_dinov3_periods_are_dropped_as_timm_drops_them(tmp_path):
    """A DINOv3 state with stored (bf16-rounded) periods is written without them, as timm's own filter
    drops Meta's buffer, and the report says so; the file reads back with computed periods."""
    m = _timm("vit_base_patch16_dinov3", 32)
    timm.models.save_for_hf(m, tmp_path / "src", safe_serialization=True)
    ckpt = load_checkpoint(tmp_path / "src", readers=READERS)
    periods = 100.0 ** (np.arange(4, dtype=np.float32) / 4)  # hd 16: T^(k / (hd / 4)), rounded as Meta stores them
    state = {**ckpt.state, "rope.periods": periods.astype(ml_dtypes.bfloat16).astype(np.float32)}
    report = save_checkpoint(tmp_path / "out.safetensors", ckpt.cfg.replace(rope_periods="stored"), state, "timm")
    assert any("rope.periods (stored) not written" in n for n in report.notes)
    assert "rope.periods" not in load_file(tmp_path / "out.safetensors")
    back = load_checkpoint(tmp_path / "out.safetensors")
    assert back.cfg == ckpt.cfg and _same_state(back.state, ckpt.state)


@pytest.mark.parametrize(
    "source, written",
    [
        ("vit_small_plus_patch16_dinov3", "vit_small_plus_patch16_dinov3"),  # SwiGLU: once vit_base_patch16_dinov3
        ("vit_huge_plus_patch16_dinov3_qkvb", "vit_small_plus_patch16_dinov3_qkvb"),  # SwiGLU, q/v biases
        ("vit_large_patch16_dinov3", "vit_base_patch16_dinov3"),  # plain MLP: the family's first
    ],
)
def test_a_tiny_dinov3_export_names_an_entry_point_of_its_mlp_and_loads_strictly(tmp_path, source, written):
    """Written with no source name to keep (a canonical file), a tiny DINOv3 hub folder names the DINOv3
    entry point of its MLP, and timm loads it strictly into the same outputs."""
    m = _timm(source, 32)
    timm.models.save_for_hf(m, tmp_path / "src", safe_serialization=True)
    src = load_checkpoint(tmp_path / "src", readers=READERS)
    save_checkpoint(tmp_path / "m.safetensors", src.cfg, src.state)  # canonical: no timm name in it
    ckpt = load_checkpoint(tmp_path / "m.safetensors")
    save_checkpoint(tmp_path / "out", ckpt.cfg, ckpt.state, "timm", writers=WRITERS)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architecture"] == written
    back = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True)  # strict
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    assert np.array_equal(_run(back, x), _run(m, x))


def test_a_full_size_export_names_the_entry_point_of_its_size():
    """A 7B, an H+ or a large export (configs read off timm's meta-device builds) names its own entry point
    in config.json, not its family's first (``vit_base_patch16_dinov3`` once named every DINOv3)."""
    for name in ("vit_7b_patch16_dinov3", "vit_huge_plus_patch16_dinov3_qkvb", "vit_pe_core_large_patch14_336",
                 "eva02_large_patch14_448"):  # fmt: skip
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
        assert hub_config_json(eva_config(model, name))["architecture"] == name


@pytest.mark.slow
def test_each_eva_name_builds_the_eps_the_writer_records():
    """``EVA_NAMES``: the LayerNorm eps each timm entry point builds, which a hub folder's name fixes."""
    for name, eps in EVA_NAMES.items():
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)  # full size: the name depends on it
        assert model.blocks[0].norm1.eps == eps, name
        assert eva_name(eva_config(model, name)) == name, name  # each family names its own entry point


@pytest.mark.slow
def test_parity_against_timm_builds_timms_eva(tmp_path):
    """``vit parity --against timm`` of a RoPE backbone compares with timm's own Eva (once a plain
    VisionTransformer without rotary embeddings would have been built): every tensor within tolerance."""
    timm.models.save_for_hf(_timm("eva02_base_patch14_224", 28), tmp_path / "m", safe_serialization=True)
    assert main(["parity", str(tmp_path / "m"), "--against", "timm", "--json", str(tmp_path / "p.json")]) == 0
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["against"] == "timm" and result["against_agreement"] == 1.0
