"""transformers SigLIP, CLIP, DINOv2 (with registers), ViT-MAE, ViT-MSN and I-JEPA folders into both
twins, transformers 5.24 as the oracle: tiny random models (width 32, depth 2) written by
``save_pretrained`` (v4 key names) or from ``state_dict()`` (v5 module names), compared in float32 on
the output, every block's hidden state and attention map, and at sizes other than the native one."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.torch import save_file

import vit_jax
import vit_torch
from vit_common.checkpoints.convert import load_checkpoint
from vit_common.config import FUNCTION_FIELDS
from vit_common.tolerance import compare

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
TEXT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=40)
# case -> (architecture, config class, config kwargs, what transformers' output is compared with)
CASES = {
    "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig", dict(intermediate_size=48), "pooler_output"),
    "siglip_two_tower": ("SiglipModel", "SiglipConfig", dict(intermediate_size=48), "vision_pooler"),
    "siglip_classify": ("SiglipForImageClassification", "SiglipConfig", dict(intermediate_size=48), "logits"),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", dict(intermediate_size=48), "pooler_output"),
    "clip_vision_gelu": (
        "CLIPVisionModel",
        "CLIPVisionConfig",
        dict(intermediate_size=48, hidden_act="gelu"),
        "pooler_output",
    ),
    "clip_projection": (
        "CLIPVisionModelWithProjection",
        "CLIPVisionConfig",
        dict(intermediate_size=48, projection_dim=24),
        "image_embeds",
    ),
    "clip_two_tower": ("CLIPModel", "CLIPConfig", dict(intermediate_size=48), "image_features"),
    "dinov2": ("Dinov2Model", "Dinov2Config", dict(mlp_ratio=3), "pooler_output"),
    "dinov2_swiglu": ("Dinov2Model", "Dinov2Config", dict(mlp_ratio=4, use_swiglu_ffn=True), "pooler_output"),
    "dinov2_classify_swiglu": (
        "Dinov2ForImageClassification",
        "Dinov2Config",
        dict(mlp_ratio=4, use_swiglu_ffn=True, num_labels=5),
        "logits",
    ),
    "dinov2_registers_classify": (
        "Dinov2WithRegistersForImageClassification",
        "Dinov2WithRegistersConfig",
        dict(mlp_ratio=2, num_register_tokens=3, num_labels=5),
        "logits",
    ),
    "dinov2_reg4": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersConfig",
        dict(mlp_ratio=4, num_register_tokens=4),
        "pooler_output",
    ),
    "dinov2_registers_swiglu": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersConfig",
        dict(mlp_ratio=4, num_register_tokens=2, use_swiglu_ffn=True),
        "pooler_output",
    ),
    "vit_mae": ("ViTMAEModel", "ViTMAEConfig", dict(intermediate_size=48, mask_ratio=0.0), "cls"),
    "vit_msn": ("ViTMSNModel", "ViTMSNConfig", dict(intermediate_size=48), "cls"),
    "vit_msn_classify": (
        "ViTMSNForImageClassification",
        "ViTMSNConfig",
        dict(intermediate_size=48, num_labels=5),
        "logits",
    ),
    "ijepa_classify": (
        "IJepaForImageClassification",
        "IJepaConfig",
        dict(intermediate_size=48, num_labels=5),
        "logits",
    ),
}
TWO_TOWER = ("SiglipConfig", "CLIPConfig")


def _build(case: str, seed: int = 0):
    arch, config_cls, kw, _ = CASES[case]
    cls = getattr(transformers, config_cls)
    if config_cls in TWO_TOWER:
        extra = {"projection_dim": 24} if config_cls == "CLIPConfig" else {}
        labels = {k: kw.pop(k) for k in ("num_labels",) if k in kw}
        config = cls(vision_config={**SMALL, **kw}, text_config=TEXT, **extra, **labels)
        if arch == "SiglipForImageClassification":
            config.num_labels = 5
    else:
        config = cls(**{**SMALL, **kw})
    torch.manual_seed(seed)
    model = getattr(transformers, arch)._from_config(config, attn_implementation="eager")
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.1 if "norm" in name else 0.05))
    return model.eval()


def _vision(model):
    """The module whose hidden states are the image tower's (a two-tower or task model's vision part)."""
    for name in ("vision_model", "dinov2", "dinov2_with_registers", "vit", "ijepa"):
        if hasattr(model, name):
            return getattr(model, name)
    return model


def _reference(case: str, model, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """transformers' output (as CASES names it) and its intermediates: per-block hidden states and
    attention maps, as our intermediates' names. At a size other than 32x32 the position embedding is
    interpolated (DINOv2 always does; the others are asked to with interpolate_pos_encoding=True)."""
    what = CASES[case][3]
    pixels = torch.from_numpy(x)
    kw = (
        {"noise": torch.arange(x.shape[0] * 16, dtype=torch.float32).reshape(x.shape[0], 16)}
        if case == "vit_mae"
        else {}
    )
    top = {"interpolate_pos_encoding": True} if x.shape[2:] != (32, 32) and not case.startswith("dinov2") else {}
    with torch.no_grad():
        inner = _vision(model)(pixels, output_hidden_states=True, output_attentions=True, **kw, **top)
        if what == "logits":
            out = model(pixels, **top).logits
        elif what == "image_embeds":
            out = model(pixels, **top).image_embeds
        elif what == "image_features":
            out = model.visual_projection(inner.pooler_output)
        elif what == "cls":
            out = inner.last_hidden_state[:, 0]
        else:
            out = inner.pooler_output
    hidden = inner.hidden_states
    inter = {f"block{i:02d}": h.numpy() for i, h in enumerate(hidden[1:])}
    inter |= {f"attn{i:02d}": a.numpy() for i, a in enumerate(inner.attentions)}
    return out.numpy(), inter


def _save(model, folder, spelling: str) -> None:
    if spelling == "v4":
        model.save_pretrained(folder)  # transformers 5 writes the v4 names to disk
    else:
        folder.mkdir()
        model.config.to_json_file(folder / "config.json")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")


def _twins(folder, x: np.ndarray, **load) -> list[tuple[str, np.ndarray, dict]]:
    jm = vit_jax.load_model(folder, attn_impl="explicit", **load)
    tm = vit_torch.load_model(folder, **load)
    lj, oj = jm.forward_intermediates(jnp.asarray(x.transpose(0, 2, 3, 1)))
    with torch.no_grad():
        lt, ot = tm.forward_intermediates(torch.from_numpy(x))
    return [
        ("jax", np.asarray(lj), {k: np.asarray(v) for k, v in oj.items()}),
        ("torch", lt.numpy(), {k: v.numpy() for k, v in ot.items()}),
    ]


def _check(case: str, model, folder, x: np.ndarray, **load) -> None:
    ref, inter = _reference(case, model, x)
    for twin, logits, out in _twins(folder, x, **load):
        assert compare(f"{twin} {CASES[case][3]}", logits, ref, "tensor", "float32").ok
        for k, v in inter.items():
            assert compare(f"{twin} {k}", out[k], v, "attention" if k.startswith("attn") else "tensor", "float32").ok


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_family_folder_equals_transformers(case, tmp_path, images):
    """Each family's folder (v4 names, as save_pretrained writes) loads into both twins with nothing
    assumed, and gives transformers' output, every block's hidden state and every attention map."""
    model = _build(case)
    _save(model, tmp_path / "hf", "v4")
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    assert ckpt.report.assumed == [] and set(ckpt.report.provenance) == set(FUNCTION_FIELDS)
    assert ckpt.report.layout.startswith(CASES[case][0])
    _check(case, model, tmp_path / "hf", images(2, (32, 32)))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dinov2_classify_swiglu", "dinov2_registers_classify", "vit_mae", "ijepa_classify"])
def test_v5_module_names(case, tmp_path, images):
    """The transformers-5 module names (``state_dict()``: ``attention.q_proj``, DINOv2's SwiGLU as
    ``gate_proj``/``up_proj``/``down_proj``, ViT-style ``layers.i``) read as the v4 file names do."""
    model = _build(case)
    _save(model, tmp_path / "hf", "v5")
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    assert ckpt.report.layout == f"{CASES[case][0]}, v5 key names"
    _check(case, model, tmp_path / "hf", images(2, (32, 32)))


def test_two_tower_folders_report_the_text_tower_as_ignored(tmp_path):
    for case in ("siglip_two_tower", "clip_two_tower"):
        _build(case).save_pretrained(tmp_path / case)
        ckpt = load_checkpoint(tmp_path / case, strict=True)
        ignored = [k for k, _ in ckpt.report.dropped]
        assert ignored and all(k.startswith(("text_model.", "text_projection", "logit_")) for k in ignored)
        assert any(k.startswith("text_model.") for k in ignored)


def test_clip_projection_is_the_bias_free_head(tmp_path):
    _build("clip_projection").save_pretrained(tmp_path / "clip")
    ckpt = load_checkpoint(tmp_path / "clip", strict=True)
    cfg = ckpt.cfg
    assert (cfg.num_classes, cfg.head_bias, cfg.norm_pre, cfg.patch_bias, cfg.gelu, cfg.ln_eps) == (
        24,
        False,
        True,
        False,
        "quick",
        1e-5,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, method, hw",
    [
        ("dinov2", "bicubic", (48, 40)),
        ("dinov2_registers_classify", "bicubic_aa", (24, 24)),
        ("dinov2_registers_classify", "bicubic_aa", (48, 56)),
        ("siglip_vision", "bicubic", (48, 40)),
        ("clip_projection", "bicubic", (24, 40)),
    ],
)
def test_position_embedding_resampled_as_transformers(case, method, hw, tmp_path, images):
    """At a size other than the native 32x32, both twins (the table resampled at load) equal transformers'
    own interpolate_pos_encoding: bicubic without antialias (dinov2, SigLIP, CLIP), dinov2_with_registers
    with it (a smaller size is where antialias shows: the other method fails there)."""
    model = _build(case)
    model.save_pretrained(tmp_path / "hf")
    ckpt = load_checkpoint(tmp_path / "hf")
    assert ckpt.cfg.posemb_resample == method
    x = images(2, hw)
    ref, _ = _reference(case, model, x)
    for _, logits, _ in _twins(tmp_path / "hf", x, image_size=hw):
        assert compare("logits", logits, ref, "tensor", "float32").ok
    if hw == (24, 24):
        other = "bicubic" if method == "bicubic_aa" else "bicubic_aa"
        wrong = vit_torch.load_model(tmp_path / "hf", image_size=hw, posemb_resample=other)
        with torch.no_grad():
            assert not compare("other method", wrong(torch.from_numpy(x)).numpy(), ref, "tensor", "float32").ok


@pytest.mark.parametrize(
    "arch, config_cls, what",
    [
        ("CLIPForImageClassification", "CLIPConfig", "a classifier on the mean of un-normalised patch tokens"),
        ("ViTMAEForPreTraining", "ViTMAEConfig", "masked-image-modelling decoder"),
    ],
)
def test_refused_by_name(arch, config_cls, what, tmp_path):
    cls = getattr(transformers, config_cls)
    config = cls(vision_config=SMALL, text_config=TEXT) if config_cls in TWO_TOWER else cls(**SMALL)
    getattr(transformers, arch)(config).save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match=what):
        load_checkpoint(tmp_path / "hf")


WRITTEN = {  # case -> the architecture our export is: the family that holds the model
    "siglip_vision": "SiglipVisionModel",
    "siglip_two_tower": "SiglipVisionModel",
    "clip_vision": "CLIPVisionModel",
    "clip_projection": "CLIPVisionModelWithProjection",
    "clip_two_tower": "CLIPVisionModelWithProjection",
    "dinov2": "Dinov2Model",
    "dinov2_classify_swiglu": "Dinov2ForImageClassification",
    "dinov2_registers_classify": "Dinov2WithRegistersForImageClassification",
    "dinov2_registers_swiglu": "Dinov2WithRegistersModel",
    "ijepa_classify": "IJepaForImageClassification",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, spelling",
    [(case, "v4") for case in WRITTEN] + [("dinov2_classify_swiglu", "v5"), ("dinov2_registers_swiglu", "v5")],
)
def test_written_folder_loads_strictly_in_transformers(case, spelling, tmp_path, images):
    """Each family read, then written as hf_family: transformers loads the folder with the call the
    report prints (no missing, unexpected or mismatched tensor) and gives the source model's output; a
    two-tower folder is written as its vision tower."""
    from vit_common.checkpoints.convert import save_checkpoint
    from vit_common.checkpoints.formats.hf import HfWriteOptions

    model = _build(case)
    model.save_pretrained(tmp_path / "src")
    ckpt = load_checkpoint(tmp_path / "src", strict=True)
    report = save_checkpoint(tmp_path / "out", ckpt.cfg, ckpt.state, "hf_family", options=HfWriteOptions(spelling))
    arch = WRITTEN[case]
    assert f"transformers.{arch}.from_pretrained(" in report.load_call
    loaded, info = getattr(transformers, arch).from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager"
    )
    assert not any(v for k, v in info.items() if k != "error_msgs") and not info.get("error_msgs"), info
    x = images(2, (32, 32))
    ref, _ = _reference(case, model, x)
    with torch.no_grad():
        out = loaded.eval()(torch.from_numpy(x))
    got = (
        out.logits
        if hasattr(out, "logits")
        else out.image_embeds
        if hasattr(out, "image_embeds")
        else out.pooler_output
    )
    assert compare("written folder", got.numpy(), ref, "tensor", "float32").ok
    back = load_checkpoint(tmp_path / "out", strict=True)
    assert back.cfg == ckpt.cfg and all(np.array_equal(back.state[k], v) for k, v in ckpt.state.items())


@pytest.mark.parametrize("use_head", [True, False])
def test_a_siglip_classifier_is_written_back_as_siglip_s_classifier(use_head, tmp_path, images):
    """A ``SiglipForImageClassification`` folder converted to hf_family is written as one: a ``SiglipConfig``
    nesting the vision_config (``vision_use_head`` false) with transformers' default text_config and the
    labels; transformers loads it strictly and gives the source's logits bit for bit, and the twins equal
    them. Every tensor is the source's bit for bit; the unused MAP head alone is dropped
    (with ``vision_use_head`` false the folder round trips whole), and a second round trip is the same."""
    from safetensors.numpy import load_file

    from vit_common.checkpoints.convert import convert

    model = _build("siglip_classify")
    model.config.vision_config.vision_use_head = use_head
    model = transformers.SiglipForImageClassification._from_config(model.config, attn_implementation="eager")
    model.load_state_dict(_build("siglip_classify").state_dict(), strict=False)
    model.eval().save_pretrained(tmp_path / "src")
    report = convert(tmp_path / "src", tmp_path / "out", to_fmt="hf_family")
    assert "transformers.SiglipForImageClassification.from_pretrained(" in report.load_call
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["model_type"], config["architectures"], len(config["id2label"])) == (
        "siglip",
        ["SiglipForImageClassification"],
        5,
    )
    assert config["vision_config"]["model_type"] == "siglip_vision_model"
    assert config["vision_config"]["vision_use_head"] is False
    alone = transformers.SiglipConfig(vision_config=SMALL)  # what save_pretrained writes for a vision_config alone
    assert config["text_config"] == alone.to_diff_dict()["text_config"]
    written, info = transformers.SiglipForImageClassification.from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info
    x = images(2, (32, 32))
    with torch.no_grad():
        assert torch.equal(written.eval()(torch.from_numpy(x)).logits, model(torch.from_numpy(x)).logits)
    if use_head:  # the twins on the written folder, under one jit (eager dispatch would compile op by op)
        jm, tm = vit_jax.load_model(tmp_path / "out"), vit_torch.load_model(tmp_path / "out")
        with torch.no_grad():
            ref, got = model(torch.from_numpy(x)).logits.numpy(), tm(torch.from_numpy(x)).numpy()
        assert compare("torch", got, ref, "tensor", "float32").ok
        out = nnx.jit(lambda m, a: m(a))(jm, jnp.asarray(x.transpose(0, 2, 3, 1)))
        assert compare("jax", np.asarray(out), ref, "tensor", "float32").ok
    src, out = load_file(tmp_path / "src" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert set(src) - set(out) == {k for k in src if k.startswith("vision_model.head.")} and set(out) <= set(src)
    assert bool([k for k in src if ".head." in k]) == use_head
    assert all(np.array_equal(out[k], src[k]) for k in out)
    convert(tmp_path / "out", tmp_path / "again", to_fmt="hf_family")
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert set(again) == set(out) and all(np.array_equal(again[k], out[k]) for k in out)
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == config


def test_a_mean_pooled_classifier_is_i_jepa_s_unless_a_siglip_classifier_is_asked_for(
    tmp_path, small_cfg, random_state
):
    """Without a model type a mean-pooled classifier without a class token is written as I-JEPA's (a timm
    gap model, an I-JEPA source); ``--hf-model-type siglip`` / ``siglip2`` writes SigLIP's classifier,
    which reads back as the same model; a class-token model asked for as siglip is refused by name."""
    from vit_common.checkpoints.convert import save_checkpoint
    from vit_common.checkpoints.formats.hf import HfWriteOptions
    from vit_common.checkpoints.formats.hf_families import family_for

    cfg = small_cfg.replace(class_token=False, pool="gap", num_classes=5)
    assert family_for(cfg) == ("ijepa", "IJepaForImageClassification")
    state = random_state(cfg)
    for mt, arch, c in (
        ("siglip", "SiglipForImageClassification", cfg.replace(posemb_resample="bicubic")),
        ("siglip2", "Siglip2ForImageClassification", cfg.replace(posemb_resample="bilinear_aa")),
    ):
        report = save_checkpoint(tmp_path / mt, c, state, "hf_family", options=HfWriteOptions(model_type=mt))
        assert f"transformers.{arch}.from_pretrained(" in report.load_call
        back = load_checkpoint(tmp_path / mt, strict=True)
        assert back.cfg == c and all(np.array_equal(back.state[k], v) for k, v in state.items())
    with pytest.raises(ValueError, match="no siglip model has class_token=True"):
        save_checkpoint(
            tmp_path / "x", small_cfg, random_state(small_cfg), "hf_family", options=HfWriteOptions(model_type="siglip")
        )
    assert not (tmp_path / "x").exists()


def test_models_no_family_holds_are_refused_by_name(tmp_path, small_cfg, random_state):
    from vit_common.checkpoints.convert import save_checkpoint

    with pytest.raises(
        ValueError, match="no SigLIP, CLIP, DINOv2 or I-JEPA model has class_token=True, pool='token'"
    ) as e:
        save_checkpoint(tmp_path / "a", small_cfg, random_state(small_cfg), "hf_family")
    # callers without --hf-model-type (the Python API, `vit train`'s exports) get it too: no flag is named
    assert "as hf_family with model type vit_mae or vit_msn" in str(e.value) and "--" not in str(e.value)
    cfg = small_cfg.replace(layer_scale=0.1, qk_norm=True, num_classes=0)
    with pytest.raises(ValueError, match="the hf_family format cannot hold this model: qk_norm"):
        save_checkpoint(tmp_path / "b", cfg, random_state(cfg), "hf_family")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "case, edit, message",
    [
        ("dinov2", {"mlp_ratio": float("inf")}, r"mlp_ratio=inf: expected a number in \(0, 64\]"),
        ("dinov2", {"hidden_act": "relu"}, "hidden_act='relu'"),
        ("siglip_two_tower", {"vision_config": None}, "has no vision_config object"),
        ("clip_vision", {"architectures": ["CLIPTextModel"]}, "architecture 'CLIPTextModel' is not supported"),
    ],
)
def test_bad_family_configs_are_one_line_errors(case, edit, message, tmp_path):
    import json

    from vit_common.checkpoints.formats.errors import FormatError

    _build(case).save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text()) | edit
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match=message):
        load_checkpoint(tmp_path / "hf")


@pytest.mark.parametrize(
    "model_type, what",
    [
        ("beit", "relative position tables"),
        ("data2vec-vision", "relative position tables"),
    ],
)
def test_other_vision_towers_are_refused_by_name(model_type, what, tmp_path):
    import json

    from vit_common.system.io import save_safetensors

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": model_type}))
    save_safetensors(
        tmp_path / "hf" / "model.safetensors", {"embeddings.patch_embeddings.weight": np.ones((2, 3, 4, 4), np.float32)}
    )
    with pytest.raises(ValueError, match=f"model_type='{model_type}' is not supported .the twins lack {what}"):
        load_checkpoint(tmp_path / "hf")


def _mae_noise(x: np.ndarray) -> dict:
    """ViTMAEModel's per-patch noise in patch order: with mask_ratio=0 its shuffle is then the identity,
    so its hidden states are in our token order (its class token does not depend on the order)."""
    n = (x.shape[2] // 8) * (x.shape[3] // 8)
    return {"noise": torch.arange(x.shape[0] * n, dtype=torch.float32).reshape(x.shape[0], n)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, arch, spelling",
    [
        ("vit_mae", "ViTMAEModel", "v4"),
        ("vit_mae", "ViTMAEModel", "v5"),
        ("vit_msn", "ViTMSNModel", "v4"),
        ("vit_msn_classify", "ViTMSNForImageClassification", "v5"),
    ],
)
def test_mae_and_msn_are_written_as_their_own_model_types(case, arch, spelling, tmp_path, images):
    """A ViT-MAE / ViT-MSN folder converted --to hf_family is written as its own model_type (config.json
    and key layout), which transformers loads strictly, giving the source model's output and every
    hidden state (ViTMAEModel with mask_ratio=0, in patch order); it reads back bit-exact."""
    import json

    from vit_common.checkpoints.convert import convert
    from vit_common.checkpoints.formats.hf import HfWriteOptions

    model = _build(case)
    model.save_pretrained(tmp_path / "src")
    report = convert(tmp_path / "src", tmp_path / "out", to_fmt="hf_family", write_options=HfWriteOptions(spelling))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (case.removesuffix("_classify"), [arch])
    assert f"transformers.{arch}.from_pretrained(" in report.load_call
    loaded, info = getattr(transformers, arch).from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager"
    )
    assert not any(v for k, v in info.items() if k != "error_msgs") and not info.get("error_msgs"), info
    x = images(2, (32, 32))
    ref, inter = _reference(case, model, x)
    kw = _mae_noise(x) if case == "vit_mae" else {}
    with torch.no_grad():
        inner = _vision(loaded.eval())(torch.from_numpy(x), output_hidden_states=True, **kw)
        got = loaded(torch.from_numpy(x)).logits if "Classification" in arch else inner.last_hidden_state[:, 0]
    assert compare("written folder", got.numpy(), ref, "tensor", "float32").ok
    for i, h in enumerate(inner.hidden_states[1:]):
        assert compare(f"block{i:02d}", h.numpy(), inter[f"block{i:02d}"], "tensor", "float32").ok
    src, back = load_checkpoint(tmp_path / "src", strict=True), load_checkpoint(tmp_path / "out", strict=True)
    assert back.report.model_type == src.report.model_type == config["model_type"]
    assert back.cfg == src.cfg and all(np.array_equal(back.state[k], v) for k, v in src.state.items())


def test_a_plain_vit_is_written_as_msn_when_asked_and_refused_where_the_type_cannot_hold_it(tmp_path):
    """``vit convert --to hf_family --hf-model-type vit_msn`` writes an HF ViT classifier as ViT-MSN's
    (exit 0, loaded strictly); vit_mae has no classifier: refused by name, exit 2, nothing written."""
    from vit_cli.main import main

    transformers.ViTForImageClassification(
        transformers.ViTConfig(**SMALL, intermediate_size=48, num_labels=3)
    ).save_pretrained(tmp_path / "vit")
    argv = ["convert", str(tmp_path / "vit"), str(tmp_path / "msn"), "--to", "hf_family", "--hf-model-type"]
    assert main([*argv, "vit_msn"]) == 0
    _, info = transformers.ViTMSNForImageClassification.from_pretrained(tmp_path / "msn", output_loading_info=True)
    assert not any(v for k, v in info.items() if k != "error_msgs"), info
    argv[2] = str(tmp_path / "mae")
    assert main([*argv, "vit_mae"]) == 2
    assert not (tmp_path / "mae").exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["siglip_two_tower", "clip_projection", "dinov2_registers_classify", "vit_mae"])
def test_parity_against_transformers_of_the_folders_model_type(case, tmp_path, capsys):
    """``vit parity FOLDER --against transformers`` compares both twins with the transformers class of
    the folder's model type (a two-tower folder's vision tower): exit 0, and the JSON's logits (pooled
    features or projection), every block and every attention map have a passing transformers column."""
    import json

    from vit_cli.main import main

    _build(case).save_pretrained(tmp_path / "hf")
    argv = ["parity", str(tmp_path / "hf"), "--against", "transformers", "--json", str(tmp_path / "r.json")]
    assert main(argv) == 0
    assert "transformers max abs" in capsys.readouterr().out
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["format"] == "hf_family" and res["against"] == "transformers" and res["ok"]
    rows = {r["name"]: r for r in res["rows"]}
    compared = [n for n in ("block00", "block01", "attn00", "attn01", "logits") if rows[n]["against"] is not None]
    assert compared == ["block00", "block01", "attn00", "attn01", "logits"]
    assert all(rows[n]["against"]["ok"] and rows[n]["against"]["rel"] < 1e-5 for n in compared)


# case -> (timm architecture, its keywords at test width): timm's name fixes the rest (class token, pooling,
# pre-norm, eps, LayerScale, registers, the packed SwiGLU). mlp_ratio gives each folder's MLP width;
# vit_giant_patch14_dinov2's SwiGLUPacked halves 2 * 88 rows, as HF's SwiGLU FFN rounds 32 * 4 * 2/3.
TIMM_NAMES = {
    "siglip_vision": ("vit_base_patch16_siglip_224", dict(mlp_ratio=1.5, act_layer="gelu_tanh")),
    "siglip_two_tower": ("vit_base_patch16_siglip_224", dict(mlp_ratio=1.5, act_layer="gelu_tanh")),
    "clip_vision": ("vit_base_patch16_clip_quickgelu_224", dict(mlp_ratio=1.5)),
    "clip_vision_gelu": ("vit_base_patch16_clip_224", dict(mlp_ratio=1.5)),
    "dinov2": ("vit_small_patch14_dinov2", dict(mlp_ratio=3)),
    "dinov2_swiglu": ("vit_giant_patch14_dinov2", dict(mlp_ratio=5.5)),
    "dinov2_reg4": ("vit_small_patch14_reg4_dinov2", dict(mlp_ratio=4)),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", TIMM_NAMES)
def test_converted_to_timm_loads_strictly_in_timms_own_architecture(case, tmp_path, images):
    """A transformers SigLIP / CLIP / DINOv2 (registers, SwiGLU) vision folder, ``vit convert --to timm``:
    timm's own architecture for that model (built at test width) loads the file strictly and gives
    transformers' pooled features within 1e-5. timm's SigLIP names build exact GELU where transformers'
    SigLIP has the tanh one: act_layer='gelu_tanh' is passed (the name alone is 2.6e-4 off here)."""
    import timm
    from safetensors.torch import load_file

    from vit_cli.main import main

    model = _build(case)
    model.save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "t.safetensors"), "--to", "timm"]) == 0
    name, kw = TIMM_NAMES[case]
    size = dict(embed_dim=32, depth=2, num_heads=4, img_size=32, patch_size=8, num_classes=0)
    tm = timm.create_model(name, pretrained=False, **size, **kw).eval()
    tm.load_state_dict(load_file(tmp_path / "t.safetensors"), strict=True)
    x = images(2, (32, 32))
    ref, _ = _reference(case, model, x)
    with torch.no_grad():
        assert compare(name, tm(torch.from_numpy(x)).numpy(), ref, "tensor", "float32").ok
    if "act_layer" in kw:
        plain = timm.create_model(name, pretrained=False, **size, mlp_ratio=kw["mlp_ratio"]).eval()
        plain.load_state_dict(load_file(tmp_path / "t.safetensors"), strict=True)
        with torch.no_grad():
            assert not compare(name, plain(torch.from_numpy(x)).numpy(), ref, "tensor", "float32").ok


def _big_vision_siglip_names(depth: int, prefix: str = "params/img/") -> set[str]:
    """The parameter names big_vision gives a SigLIP image tower (``pool_type='map'``, no class token, no
    head: ``out_dim=(None, ...)``), flattened with '/' as its .npz checkpoints are, from big_vision
    0127fb6 ``big_vision/models/vit.py``: ``_Model`` (``nn.Conv(name="embedding")``, ``get_posemb(...,
    "pos_embedding")``, ``Encoder(name="Transformer")``, ``MAPHead``), ``Encoder`` (``encoderblock_{i}``,
    ``nn.LayerNorm(name="encoder_norm")``), ``Encoder1DBlock`` (LayerNorm_0, MultiHeadDotProductAttention_0,
    LayerNorm_1, MlpBlock_0), ``MlpBlock`` (Dense_0, Dense_1), ``MAPHead`` (``probe``,
    MultiHeadDotProductAttention_0, LayerNorm_0, MlpBlock_0); flax's attention has query/key/value/out;
    ``models/proj/image_text/two_towers.py`` names the image tower ``img``."""
    attn = [
        f"MultiHeadDotProductAttention_0/{m}/{w}" for m in ("query", "key", "value", "out") for w in ("kernel", "bias")
    ]
    norm = lambda n: [f"{n}/scale", f"{n}/bias"]  # noqa: E731
    mlp = [f"MlpBlock_0/Dense_{j}/{w}" for j in (0, 1) for w in ("kernel", "bias")]
    names = ["embedding/kernel", "embedding/bias", "pos_embedding", *norm("Transformer/encoder_norm")]
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}/"
        names += [b + n for n in [*norm("LayerNorm_0"), *attn, *norm("LayerNorm_1"), *mlp]]
    names += ["MAPHead_0/probe"] + [f"MAPHead_0/{n}" for n in [*attn, *norm("LayerNorm_0"), *mlp]]
    return {prefix + n for n in names}


def test_siglip_as_a_big_vision_npz_reads_and_writes_exactly(tmp_path, images):
    """A transformers SigLIP vision folder, ``vit convert --to big_vision --npz-prefix params/img/``: the
    .npz holds exactly the names big_vision's SigLIP image tower has (flax layouts: DenseGeneral q/k/v
    (D, N, D/N), conv kernel HWIO); read back it is the same model bit for bit, equal to transformers; a
    two-tower file's text tower, ``t`` and ``b`` are reported as ignored, each by name."""
    from vit_cli.main import main

    model = _build("siglip_vision")
    model.save_pretrained(tmp_path / "hf")
    npz = tmp_path / "siglip.npz"
    assert main(["convert", str(tmp_path / "hf"), str(npz), "--to", "big_vision", "--npz-prefix", "params/img/"]) == 0
    with np.load(npz) as z:
        files = {k: z[k] for k in z.files}
    assert set(files) == _big_vision_siglip_names(2)
    p = "params/img/"
    assert files[p + "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"].shape == (32, 4, 8)
    assert files[p + "MAPHead_0/MultiHeadDotProductAttention_0/out/kernel"].shape == (4, 8, 32)
    assert files[p + "embedding/kernel"].shape == (8, 8, 3, 32) and files[p + "pos_embedding"].shape == (1, 16, 32)
    src = load_checkpoint(tmp_path / "hf", strict=True)
    files |= {
        "params/txt/Embed_0/embedding": np.ones((40, 16), np.float32),
        "params/t": np.array([2.3], np.float32),
        "params/b": np.array([-10.0], np.float32),
    }
    np.savez(tmp_path / "two_tower.npz", **files)
    for path in (npz, tmp_path / "two_tower.npz"):
        back = load_checkpoint(path)
        assert back.report.format == "big_vision"
        assert back.cfg == src.cfg.replace(posemb_resample="bilinear_corners")
        assert (
            all(np.array_equal(back.state[k], v) for k, v in src.state.items())
            and back.state.keys() == src.state.keys()
        )
    why = dict(back.report.dropped)
    assert set(why) == {"params/txt/Embed_0/embedding", "params/t", "params/b"}
    assert "text tower" in why["params/txt/Embed_0/embedding"] and "temperature t" in why["params/t"]
    assert "logit bias b" in why["params/b"]
    x = images(2, (32, 32))
    ref, _ = _reference("siglip_vision", model, x)
    with torch.no_grad():
        got = vit_torch.load_model(npz, source_image_size=32, gelu="tanh", ln_eps=1e-6, strict=True)(
            torch.from_numpy(x)
        )
    got = got.numpy()
    assert compare("big_vision npz", got, ref, "tensor", "float32").ok


def test_a_clip_projection_is_exported_to_timm_as_timms_clip_converter_holds_it(tmp_path):
    """CLIP's bias-free visual projection -> a timm file: head.weight plus a zero head.bias (timm's
    _convert_openai_clip); timm loads it strictly (the printed load call) and gives transformers' embeds."""
    from vit_common.checkpoints.convert import convert

    model = _build("clip_projection")
    _save(model, tmp_path / "clip", "v4")
    report = convert(tmp_path / "clip", tmp_path / "t.safetensors", to_fmt="timm")
    assert any("zero bias" in n for n in report.notes)
    scope: dict = {}
    exec(report.load_call, scope)  # timm.create_model(...) + load_state_dict(strict=True)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        ours = scope["model"].eval()(torch.from_numpy(x)).numpy()
    c = compare("logits", ours, _reference("clip_projection", model, x)[0], "tensor", "float32")
    assert c.ok, c
