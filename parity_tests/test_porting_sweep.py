"""The porting sweep: files written by timm and transformers themselves (random weights) across the
constructor and config options that change the function. Each file either loads into both twins with
logits within 1e-5 of the library that wrote it (exact), or loads with a warning naming each field it had
to assume, where every field that differs from the real model is among them and giving those fields
makes it exact (warned), or is refused with a message naming what is unsupported (refused). Never
silently different. docs/formats.md reports the counts; ``test_formats_page_reports_the_sweep_counts`` holds
it to them.
"""

from __future__ import annotations

import itertools
import json
import re
import zlib
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import vit_jax
import vit_torch
from vit_common.checkpoints.convert import load_checkpoint
from vit_common.checkpoints.formats.hf_families import ONE_SPELLING
from vit_common.config import FUNCTION_FIELDS
from vit_common.tolerance import compare
from vit_torch.formats import READERS

ROOT = Path(__file__).resolve().parents[1]


def _timm_cases() -> dict[str, dict]:
    """timm VisionTransformer keyword arguments per case (on top of the tiny sizes of ``timm_vit``)."""
    cases = {}
    for pool, fc_norm, cls, reg, include in itertools.product(
        ("token", "avg", "max", "avgmax", "map", ""), (True, False), (True, False), (0, 2), (False, True)
    ):
        if (pool == "token" and not cls) or (include and not (cls or reg)):
            continue  # timm refuses token pooling without a class token; nothing to include
        kw = dict(global_pool=pool, fc_norm=fc_norm, class_token=cls, reg_tokens=reg, pool_include_prefix=include)
        cases[f"pool={pool or 'none'},fc_norm={fc_norm},cls={cls},reg={reg},include_prefix={include}"] = kw
    cases |= {
        "no_embed_class": dict(no_embed_class=True, reg_tokens=2),
        "reg_tokens_4": dict(reg_tokens=4),
        "pos_embed_none": dict(pos_embed="none"),
        "layer_scale": dict(init_values=1e-5),
        "final_norm_false": dict(final_norm=False, init_values=1e-5, reg_tokens=3, no_embed_class=True),  # RADIO
        "qk_norm": dict(qk_norm=True),
        "pre_norm_no_patch_bias": dict(pre_norm=True),
        "no_qkv_bias": dict(qkv_bias=False),
        "non_square_read_as_square": dict(img_size=(32, 48)),  # 4x6 + 1 rows = a 5x5 grid: both assumed
        "dynamic_img_size": dict(dynamic_img_size=True),
        "gelu_tanh": dict(act_layer="gelu_tanh"),
        "quick_gelu": dict(act_layer="quick_gelu"),
        "heads_8": dict(num_heads=8),
        "mlp_ratio_3": dict(mlp_ratio=3.0),
        "deit_distilled": dict(distilled=True),
        "dinov2_style": dict(init_values=1e-5, reg_tokens=4, no_embed_class=True, dynamic_img_size=True),
        "siglip_style": dict(global_pool="map", class_token=False, act_layer="gelu_tanh"),
        "clip_style": dict(pre_norm=True, act_layer="quick_gelu"),
        "swiglu_packed": dict(mlp_layer="SwiGLUPacked"),  # gate rows first in fc1 (vit_giant_patch14_dinov2)
        "swiglu_split": dict(mlp_layer="SwiGLU"),  # fc1_g (gate) and fc1_x
        "proj_bias_false": dict(proj_bias=False),  # no attention output or MLP biases
        "embed_norm": dict(embed_norm_layer="layernorm"),  # a norm after the patch embedding
        "rmsnorm": dict(norm_layer="rmsnorm"),
        "aimv2_style": dict(  # timm aimv2_*: RmsNorm everywhere, split SwiGLU, no biases but the patch's
            norm_layer="rmsnorm",
            embed_norm_layer="rmsnorm",
            mlp_layer="SwiGLU",
            proj_bias=False,
            qkv_bias=False,
            class_token=False,
            global_pool="avg",
        ),
    }
    return cases


# What the twins lack, and the words the refusal must use.
TIMM_REFUSED = {
    "scale_attn_norm": (dict(scale_attn_norm=True), "a LayerNorm inside attention or the MLP"),
    "scale_mlp_norm": (dict(scale_mlp_norm=True), "a LayerNorm inside attention or the MLP"),
    "non_square_refused": (dict(img_size=(32, 40)), "--source-image-size HxW"),  # 4x5 + 1 rows: no square
    "eva_q_v_bias": (dict(model="Eva"), "separate q_bias/v_bias attention biases"),
    "beit_relative_position": (dict(model="Beit", use_rel_pos_bias=True), "relative position tables"),
}
TIMM_CASES = _timm_cases() | {k: kw for k, (kw, _) in TIMM_REFUSED.items()}

# timm hub folders (timm's save_for_hf: config.json + model.safetensors) of every timm architecture the
# twins can build, one per distinct structure, each at test width (embed_dim 32, depth 1, 2 heads, a 2x2
# patch grid, 3 classes where the name has a head). timm 1.0.31 registers 179 names in vision_transformer
# and deit; built on the meta device, 163 are models the twins implement, in these 35 structures (class
# and register tokens, pooling, fc_norm, pre_norm, qkv bias, qk_norm, LayerScale, GELU, SwiGLU, eps,
# distilled, heads, RmsNorm, patch norm, no projection biases, no final norm), and 16 are refused, in
# these 6 kinds.
# Name -> image size (the name's patch x 2).
TIMM_HUB_CASES = {
    "aimv2_1b_patch14_224": 28,  # 11 more (RmsNorm, a patch norm, split SwiGLU, no biases)
    "deit3_base_patch16_224": 32,  # and 7 more names of this structure
    "deit_base_distilled_patch16_224": 32,  # 3 more
    "deit_base_patch16_224": 32,  # 20 more (vit_base_patch16_224, ...)
    "eva_large_patch14_196": 28,  # 1 more
    "flexivit_base": 32,  # 2 more
    "test_vit": 32,
    "test_vit2": 32,
    "test_vit3": 32,
    "test_vit4": 32,  # RmsNorm
    "vit_base_patch14_dinov2": 28,  # 2 more
    "vit_base_patch14_reg1_tipsv2": 28,  # 2 more
    "vit_base_patch14_reg4_dinov2": 28,  # 2 more
    "vit_giant_patch14_dinov2": 28,  # SwiGLUPacked (gate rows first), as the two below
    "vit_giant_patch14_reg1_tipsv2": 28,
    "vit_giant_patch14_reg4_dinov2": 28,
    "vit_base_patch16_224_miil": 32,
    "vit_base_patch16_clip_224": 32,  # 18 more
    "vit_base_patch16_clip_quickgelu_224": 32,  # 6 more
    "vit_base_patch16_gap_224": 32,
    "vit_base_patch16_plus_240": 32,  # 2 more
    "vit_base_patch16_radio_v3": 32,  # 5 more (no final norm, 7 registers, a patch-only table)
    "vit_base_patch16_reg4_gap_256": 32,
    "vit_base_patch16_siglip_224": 32,  # 7 more
    "vit_base_patch16_siglip_gap_224": 32,  # 12 more
    "vit_base_patch32_siglip_256": 64,  # 6 more
    "vit_base_patch32_siglip_gap_256": 64,  # 6 more
    "vit_betwixt_patch16_gap_256": 32,  # 3 more
    "vit_betwixt_patch16_reg1_gap_256": 32,  # 3 more
    "vit_betwixt_patch16_reg4_gap_256": 32,  # 5 more
    "vit_huge_patch14_224": 28,  # 2 more
    "vit_intern300m_patch14_448": 28,  # no final norm, LayerScale
    "vit_so150m2_patch16_reg1_gap_256": 32,  # 2 more
    "vit_so150m_patch16_reg4_gap_256": 32,  # 1 more
    "vit_so150m_patch16_reg4_map_256": 32,
}
TIMM_HUB_REFUSED = {  # name -> (image size, the words of the refusal)
    "beit3_base_patch16_224": (32, "a norm inside attention or MLP"),  # 3 more
    "vit_base_patch16_18x2_224": (32, "its block ParallelThingsBlock"),  # 5 more (ParallelScalingBlock)
    "vit_base_patch16_rpn_224": (32, "its block ResPostBlock"),
    "vit_dlittle_patch16_reg1_gap_256": (32, "its attention DiffAttention"),  # 1 more
    "vit_dpwee_patch16_reg1_gap_256": (32, "its block DiffParallelScalingBlock"),
    "vit_so400m_patch14_siglip_384": (30, "image_size=(30, 30) is not a multiple of patch_size=(14, 14)"),  # 1 more
}
TIMM_HUB_ALL = TIMM_HUB_CASES | {k: size for k, (size, _) in TIMM_HUB_REFUSED.items()}

# timm NaFlexVit (naflexvit_*): timm 1.0.31 registers 14 names. Their hub folders, at test width with a 2x2
# table run on 48x32 images (the table resized to a 3x2 grid): the 12 the twins implement are exact (the
# _radio ones with RADIO's bilinear_crop, base and huge _radio_v3 with bilinear_crop_corners), the 2 others
# refused in 2 kinds, one folder each: an aspect-preserving bicubic table (_par_gap), a factorized one
# (_parfac_gap). The 12 as bare state dicts (no config: warned, the resize among the assumed).
NAFLEX_CASES = (
    "naflexvit_base_patch16_gap",
    "naflexvit_base_patch16_map",
    "naflexvit_base_patch16_radio_v3",
    "naflexvit_base_patch16_siglip",
    "naflexvit_giant_patch16_radio_v3",
    "naflexvit_huge_patch16_radio_v3",
    "naflexvit_huge_patch16_radio_v4",
    "naflexvit_large_patch16_radio_v3",
    "naflexvit_so150m2_patch16_reg1_gap",
    "naflexvit_so150m2_patch16_reg1_map",
    "naflexvit_so400m_patch16_radio_v4",
    "naflexvit_so400m_patch16_siglip",
)
NAFLEX_REFUSED = {
    "naflexvit_base_patch16_par_gap": "an aspect-preserving table resize ('bicubic', True, False)",
    "naflexvit_base_patch16_parfac_gap": "a factorized position table",
}

# transformers: (architecture, config keyword arguments, how the folder is written)
HF_CASES = {
    "vit_classify_gelu": ("ViTForImageClassification", {}, "v4"),
    "vit_classify_gelu_tanh": ("ViTForImageClassification", dict(hidden_act="gelu_pytorch_tanh"), "v4"),
    "vit_classify_gelu_new": ("ViTForImageClassification", dict(hidden_act="gelu_new"), "v4"),
    "vit_classify_quick_gelu": ("ViTForImageClassification", dict(hidden_act="quick_gelu"), "v4"),
    "vit_classify_v5_names": ("ViTForImageClassification", {}, "v5"),
    "vit_classify_sharded": ("ViTForImageClassification", {}, "sharded"),
    "vit_classify_unused_pooler": ("ViTForImageClassification", {}, "pooler added"),
    "vit_classify_no_qkv_bias": ("ViTForImageClassification", dict(qkv_bias=False), "v4"),
    "vit_classify_eps_1e-6": ("ViTForImageClassification", dict(layer_norm_eps=1e-6), "v4"),
    "vit_classify_non_square": ("ViTForImageClassification", dict(image_size=[32, 48]), "v4"),
    "vit_classify_patch_4": ("ViTForImageClassification", dict(patch_size=4), "v4"),
    "vit_classify_one_channel": ("ViTForImageClassification", dict(num_channels=1), "v4"),
    "vit_model_pooler": ("ViTModel", {}, "v4"),
    "vit_model_pooler_48": ("ViTModel", dict(pooler_output_size=48), "v5"),
    "vit_model_pooler_sharded": ("ViTModel", {}, "sharded"),
    "vit_model_no_pooler": ("ViTModel", dict(add_pooling_layer=False), "v4"),
    "deit_classify": ("DeiTForImageClassification", {}, "v4"),
    "deit_classify_v5_names": ("DeiTForImageClassification", {}, "v5"),
    "deit_teacher": ("DeiTForImageClassificationWithTeacher", {}, "v4"),
    "deit_teacher_sharded": ("DeiTForImageClassificationWithTeacher", dict(hidden_act="gelu_pytorch_tanh"), "sharded"),
    "deit_teacher_v5_names": ("DeiTForImageClassificationWithTeacher", {}, "v5"),
    "deit_model_pooler": ("DeiTModel", {}, "v4"),
    "deit_model_no_pooler": ("DeiTModel", dict(add_pooling_layer=False), "v5"),
}
HF_REFUSED = {
    "vit_masked_image_modeling": ("ViTForMaskedImageModeling", {}, "v4", "a masked-image-modelling decoder"),
    "deit_masked_image_modeling": ("DeiTForMaskedImageModeling", {}, "v4", "a masked-image-modelling decoder"),
    "beit": ("BeitForImageClassification", {}, "v4", "relative position tables and q/v biases"),
    "relu_mlp": ("ViTForImageClassification", dict(hidden_act="relu"), "v4", "hidden_act='relu'"),
    "relu_pooler": ("ViTModel", dict(pooler_act="relu"), "v4", "pooler_act='relu'"),
}
HF_ALL = HF_CASES | {k: v[:3] for k, v in HF_REFUSED.items()}

# transformers vision towers beyond ViT and DeiT (the hf_family format), each at test width (32 wide, one
# block, 4 heads, a 4x4 grid of 8 px patches): case -> (architecture, config class, config keywords, how
# the folder is written, the image size run). Every family with and without its head, the v5 module
# names where they differ from the v4 file names (DINOv2's attention and SwiGLU, the ViT-style types'
# ``layers.i``), sharded folders, and sizes other than the native 32 (the position embedding resampled
# as transformers does: DINOv2 always, the others with interpolate_pos_encoding=True).
_MLP = dict(intermediate_size=48)
HF_FAMILY_CASES = {
    "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig", _MLP, "v4", (32, 32)),
    "siglip_vision_no_head": (
        "SiglipVisionModel",
        "SiglipVisionConfig",
        _MLP | dict(vision_use_head=False),
        "v4",
        (32, 32),
    ),
    "siglip_vision_sharded": ("SiglipVisionModel", "SiglipVisionConfig", _MLP, "sharded", (32, 32)),
    "siglip_vision_48x40": ("SiglipVisionModel", "SiglipVisionConfig", _MLP, "v4", (48, 40)),
    "siglip_two_tower": ("SiglipModel", "SiglipConfig", _MLP, "v4", (32, 32)),
    "siglip_classify": ("SiglipForImageClassification", "SiglipConfig", _MLP, "v4", (32, 32)),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", _MLP, "v4", (32, 32)),
    "clip_vision_gelu": ("CLIPVisionModel", "CLIPVisionConfig", _MLP | dict(hidden_act="gelu"), "v4", (32, 32)),
    "clip_projection": (
        "CLIPVisionModelWithProjection",
        "CLIPVisionConfig",
        _MLP | dict(projection_dim=24),
        "v4",
        (32, 32),
    ),
    "clip_projection_24x40": (
        "CLIPVisionModelWithProjection",
        "CLIPVisionConfig",
        _MLP | dict(projection_dim=24),
        "v4",
        (24, 40),
    ),
    "clip_two_tower": ("CLIPModel", "CLIPConfig", _MLP, "v4", (32, 32)),
    "dinov2": ("Dinov2Model", "Dinov2Config", dict(mlp_ratio=3), "v4", (32, 32)),
    "dinov2_v5_names": ("Dinov2Model", "Dinov2Config", dict(mlp_ratio=3), "v5", (32, 32)),
    "dinov2_sharded": ("Dinov2Model", "Dinov2Config", {}, "sharded", (32, 32)),
    "dinov2_48x40": ("Dinov2Model", "Dinov2Config", {}, "v4", (48, 40)),
    "dinov2_classify": ("Dinov2ForImageClassification", "Dinov2Config", {}, "v4", (32, 32)),
    "dinov2_swiglu": ("Dinov2Model", "Dinov2Config", dict(use_swiglu_ffn=True), "v4", (32, 32)),
    "dinov2_swiglu_v5_names": (
        "Dinov2ForImageClassification",
        "Dinov2Config",
        dict(use_swiglu_ffn=True),
        "v5",
        (32, 32),
    ),
    "dinov2_registers": ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", {}, "v4", (32, 32)),
    "dinov2_registers_24": ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", {}, "v4", (24, 24)),
    "dinov2_registers_classify_v5_names": (
        "Dinov2WithRegistersForImageClassification",
        "Dinov2WithRegistersConfig",
        dict(num_register_tokens=2, use_swiglu_ffn=True),
        "v5",
        (32, 32),
    ),
    "vit_mae": ("ViTMAEModel", "ViTMAEConfig", _MLP | dict(mask_ratio=0.0), "v4", (32, 32)),
    "vit_mae_v5_names": ("ViTMAEModel", "ViTMAEConfig", _MLP | dict(mask_ratio=0.0), "v5", (32, 32)),
    "vit_msn": ("ViTMSNModel", "ViTMSNConfig", _MLP, "v4", (32, 32)),
    "vit_msn_classify": ("ViTMSNForImageClassification", "ViTMSNConfig", _MLP, "v4", (32, 32)),
    "vit_msn_classify_v5_names": ("ViTMSNForImageClassification", "ViTMSNConfig", _MLP, "v5", (32, 32)),
    "ijepa": ("IJepaModel", "IJepaConfig", _MLP, "v4", (32, 32)),
    "ijepa_classify_v5_names": ("IJepaForImageClassification", "IJepaConfig", _MLP, "v5", (32, 32)),
    "aimv2_probe": ("Aimv2VisionModel", "Aimv2VisionConfig", dict(intermediate_size=88), "v4", (32, 32)),
    "aimv2_biases_no_head": (
        "Aimv2VisionModel",
        "Aimv2VisionConfig",
        dict(intermediate_size=88, use_head=False, qkv_bias=True, mlp_bias=True),
        "v4",
        (32, 32),
    ),
    "aimv2_native": ("Aimv2VisionModel", "Aimv2VisionConfig", dict(is_native=True, use_head=False), "v4", (32, 32)),
    "aimv2_two_tower": ("Aimv2Model", "Aimv2Config", dict(intermediate_size=88), "v4", (32, 32)),
    "dinov3": ("DINOv3ViTModel", "DINOv3ViTConfig", dict(num_register_tokens=2), "v4", (32, 32)),  # hf_dinov3
    "radio": ("RadioModel", "RadioConfig", dict(max_img_size=64, num_registers=2), "v4", (32, 32)),
    "radio_swiglu_cropped": (
        "RadioModel",
        "RadioConfig",
        dict(max_img_size=64, use_swiglu_ffn=True, num_cls_tokens=2, num_registers=1),
        "v4",
        (40, 24),
    ),
}
HF_FAMILY_REFUSED = {  # case -> (architecture, config class, the words of the refusal)
    "clip_classify": ("CLIPForImageClassification", "CLIPConfig", "a classifier on the mean of un-normalised"),
    "vit_mae_pretraining": ("ViTMAEForPreTraining", "ViTMAEConfig", "ViT-MAE's masked-image-modelling decoder"),
    "dinov2_backbone": ("Dinov2Backbone", "Dinov2Config", "a multi-stage backbone output"),
    "data2vec_vision": ("Data2VecVisionModel", "Data2VecVisionConfig", "relative position tables and q/v biases"),
}


def counts() -> dict[str, int]:
    """Files per outcome: timm files store no config (GELU, eps and the grid are always assumed), so
    every supported one is 'warned'; transformers folders (ViT, DeiT and the other vision towers) declare
    everything in config.json, timm hub folders through the model timm builds from theirs."""
    return {
        "exact": len(HF_CASES) + len(TIMM_HUB_CASES) + len(HF_FAMILY_CASES) + len(NAFLEX_CASES),
        "warned": len(TIMM_CASES) - len(TIMM_REFUSED) + len(NAFLEX_CASES),
        "refused": len(TIMM_REFUSED)
        + len(HF_REFUSED)
        + len(TIMM_HUB_REFUSED)
        + len(HF_FAMILY_REFUSED)
        + len(NAFLEX_REFUSED),
        "wrong": 0,
    }


def _twins(ckpt, x: np.ndarray) -> list[np.ndarray]:
    """Both twins' float32 outputs (JAX eagerly: the sweep's many small configs would each compile)."""
    jm, tm = vit_jax.from_numpy(ckpt.cfg, ckpt.state), vit_torch.from_numpy(ckpt.cfg, ckpt.state)
    lj = np.asarray(jm(jnp.asarray(x.transpose(0, 2, 3, 1))))
    with torch.no_grad():
        lt = tm(torch.from_numpy(x)).numpy()
    return [lj, lt]


def _equal(outs: list[np.ndarray], ref: np.ndarray) -> bool:
    return all(o.shape == ref.shape and compare("logits", o, ref, "tensor", "float32").ok for o in outs)


def _timm_model(kw: dict, timm_vit):
    kw = dict(kw)
    if kw.get("model") in ("Eva", "Beit"):
        from timm.models.beit import Beit
        from timm.models.eva import Eva

        cls = {"Eva": Eva, "Beit": Beit}[kw.pop("model")]
        return cls(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=4, num_classes=5, **kw).eval()
    if kw.get("mlp_layer"):
        import timm.layers

        kw["mlp_layer"], kw["act_layer"] = getattr(timm.layers, kw["mlp_layer"]), torch.nn.SiLU
    return timm_vit(depth=1, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("case", TIMM_CASES)
def test_timm_file(case, tmp_path, timm_vit, images):
    from vit_torch.timm_models import timm_config

    tm = _timm_model(TIMM_CASES[case], timm_vit)
    path = tmp_path / ("t.pth" if zlib.crc32(case.encode()) % 4 == 0 else "t.safetensors")  # both containers
    state = {k: v.contiguous() for k, v in tm.state_dict().items()}
    torch.save(state, path) if path.suffix == ".pth" else save_file(state, path)
    if case in TIMM_REFUSED:
        with pytest.raises(ValueError, match=re.escape(TIMM_REFUSED[case][1])):
            load_checkpoint(path, readers=READERS)
        return
    truth = timm_config(tm, case)
    x = images(1, truth.image_size)
    ref = tm(torch.from_numpy(x)).detach().numpy()
    ckpt = load_checkpoint(path, readers=READERS)
    assumed = ckpt.report.assumed
    assert assumed, "a timm file stores no config: something must be assumed"
    differ = [k for k in FUNCTION_FIELDS if getattr(ckpt.cfg, k) != getattr(truth, k)]
    differ = [k for k in differ if k not in ckpt.cfg.inert_fields() | truth.inert_fields()]
    assert set(differ) <= set(assumed), f"silently different: {sorted(set(differ) - set(assumed))}"
    assert [line.partition(" = ")[0] for line in ckpt.report.assumptions] == assumed
    if not differ:
        assert _equal(_twins(ckpt, x), ref)
    unknown = [k for k, origin in ckpt.report.provenance.items() if origin.kind == "assumed"]  # relevant or not
    given = {k: getattr(truth, k) for k in unknown if k != "image_size"}
    exact = load_checkpoint(path, readers=READERS, strict=True, source_image_size=truth.image_size, **given)
    assert exact.report.assumed == [] and _equal(_twins(exact, x), ref)


@pytest.mark.slow
@pytest.mark.parametrize("name", TIMM_HUB_ALL)
def test_timm_hub_folder(name, tmp_path, perturb, images):
    import timm

    size = TIMM_HUB_ALL[name]
    with torch.device("meta"):
        has_head = timm.create_model(name, pretrained=False, embed_dim=32, depth=1, num_heads=2).num_classes > 0
    torch.manual_seed(0)
    kw = dict(embed_dim=32, depth=1, num_heads=2, img_size=size) | ({"num_classes": 3} if has_head else {})
    tm = perturb(timm.create_model(name, pretrained=False, **kw)).eval()
    timm.models.save_for_hf(tm, tmp_path / "hub", safe_serialization=True)
    if name in TIMM_HUB_REFUSED:
        with pytest.raises(ValueError, match=re.escape(TIMM_HUB_REFUSED[name][1])):
            load_checkpoint(tmp_path / "hub", readers=READERS)
        return
    x = images(1, (size, size))
    with torch.no_grad():
        ref = tm(torch.from_numpy(x)).numpy()
    ckpt = load_checkpoint(tmp_path / "hub", readers=READERS, strict=True)
    assert ckpt.report.assumed == [] and _equal(_twins(ckpt, x), ref)


def _naflexvit(name: str, perturb):
    """timm's NaFlexVit ``name`` at test width (embed_dim 32, depth 1, 2 heads, a 2x2 table), perturbed."""
    import timm

    torch.manual_seed(0)
    kw = dict(embed_dim=32, depth=1, num_heads=2, pos_embed_grid_size=(2, 2))
    return perturb(timm.create_model(name, pretrained=False, **kw)).eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", (*NAFLEX_CASES, *NAFLEX_REFUSED))
def test_timm_naflexvit_hub_folder(name, tmp_path, perturb, images):
    """A NaFlexVit hub folder: exact in both twins on 48x32 images (its 2x2 table resized to 3x2), nothing
    assumed; or refused naming what the twins lack."""
    import timm

    tm = _naflexvit(name, perturb)
    timm.models.save_for_hf(tm, tmp_path / "hub", safe_serialization=True)
    if name in NAFLEX_REFUSED:
        with pytest.raises(ValueError, match=re.escape(NAFLEX_REFUSED[name])):
            load_checkpoint(tmp_path / "hub", readers=READERS)
        return
    x = images(1, (48, 32))
    with torch.no_grad():
        ref = tm(torch.from_numpy(x)).numpy()
    ckpt = load_checkpoint(tmp_path / "hub", readers=READERS, strict=True)
    assert ckpt.report.assumed == [] and _equal(_twins(ckpt, x), ref)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAFLEX_CASES)
def test_timm_naflexvit_file(name, tmp_path, perturb, images):
    """A NaFlexVit state dict (no config): every field that differs from timm's model, the table resize
    included, is among the assumed; giving them makes it exact in strict mode."""
    from vit_torch.timm_models import timm_config

    tm = _naflexvit(name, perturb)
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, tmp_path / "n.safetensors")
    truth, x = timm_config(tm, name), images(1, (48, 32))
    with torch.no_grad():
        ref = tm(torch.from_numpy(x)).numpy()
    ckpt = load_checkpoint(tmp_path / "n.safetensors", readers=READERS)
    assert "posemb_resample" in ckpt.report.assumed
    differ = [k for k in (*FUNCTION_FIELDS, "posemb_resample") if getattr(ckpt.cfg, k) != getattr(truth, k)]
    differ = [k for k in differ if k not in ckpt.cfg.inert_fields() | truth.inert_fields()]
    assert set(differ) <= set(ckpt.report.assumed), (
        f"silently different: {sorted(set(differ) - set(ckpt.report.assumed))}"
    )
    given = {k: getattr(truth, k) for k, o in ckpt.report.provenance.items() if o.kind == "assumed"}
    exact = load_checkpoint(tmp_path / "n.safetensors", readers=READERS, strict=True, **given)
    assert exact.report.assumed == [] and _equal(_twins(exact, x), ref)


def _hf_folder(arch: str, config: dict, how: str, folder: Path, hf_vit):
    config = dict(config)
    pooling = config.pop("add_pooling_layer", None)
    if arch.startswith("Beit"):
        import transformers

        torch.manual_seed(0)
        model = transformers.BeitForImageClassification(
            transformers.BeitConfig(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=4,
                intermediate_size=64,
                image_size=32,
                patch_size=8,
                num_labels=5,
            )
        ).eval()
    else:
        model = hf_vit(arch, add_pooling_layer=pooling, num_hidden_layers=1, **config)
    if how == "v5":
        folder.mkdir()
        model.config.to_json_file(folder / "config.json")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    else:
        model.save_pretrained(folder, **({"max_shard_size": "8KB"} if how == "sharded" else {}))
    if how == "sharded":
        assert len(set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    if how == "pooler added":
        tensors = load_file(folder / "model.safetensors")
        tensors |= {"vit.pooler.dense.weight": torch.randn(32, 32), "vit.pooler.dense.bias": torch.randn(32)}
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return model


@pytest.mark.slow
@pytest.mark.parametrize("case", HF_ALL)
def test_transformers_folder(case, tmp_path, hf_vit, images):
    arch, config, how = HF_ALL[case]
    model = _hf_folder(arch, config, how, tmp_path / "hf", hf_vit)
    if case in HF_REFUSED:
        with pytest.raises(ValueError, match=re.escape(HF_REFUSED[case][3])):
            load_checkpoint(tmp_path / "hf")
        return
    c = model.config
    size = c.image_size if isinstance(c.image_size, (list, tuple)) else (c.image_size, c.image_size)
    x = images(1, size, chans=c.num_channels)
    with torch.no_grad():
        out = model(torch.from_numpy(x))
    ref = out.logits if hasattr(out, "logits") else out.pooler_output
    ref = (ref if ref is not None else out.last_hidden_state[:, 0]).numpy()
    ckpt = load_checkpoint(tmp_path / "hf", strict=True)
    assert ckpt.report.assumed == [] and _equal(_twins(ckpt, x), ref)


_TEXT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=40)


def _family_model(arch: str, config_cls: str, config: dict, perturb):
    """A transformers model ``arch`` at test width (a two-tower config's vision tower, with a tiny text
    tower), random weights perturbed, in eval mode."""
    import transformers

    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, image_size=32, patch_size=8)
    cls = getattr(transformers, config_cls)
    if config_cls in ("SiglipConfig", "CLIPConfig", "Aimv2Config"):
        extra = {"projection_dim": 24} if config_cls != "SiglipConfig" else {}
        c = cls(vision_config=small | config, text_config=_TEXT, **extra)
        c.num_labels = 5
    else:
        c = cls(**small, **config, num_labels=5)
    torch.manual_seed(0)
    model = getattr(transformers, arch)._from_config(c, attn_implementation="eager")
    return perturb(model, scale=0.05)


def _family_output(model, arch: str, x: np.ndarray) -> np.ndarray:
    """What transformers' ``arch`` gives for images ``x`` as the twins' output: logits, CLIP's projection,
    the pooler (SigLIP's MAP head, CLIP's and DINOv2's class token, AIMv2's probe), RADIO's summary, else the
    class token
    (ViT-MAE with patch-order noise, ViT-MSN), the mean of the tokens (I-JEPA) or every token (SigLIP and
    AIMv2 without head)."""
    pixels = torch.from_numpy(x)
    top = (
        {"interpolate_pos_encoding": True}
        if x.shape[2:] != (32, 32) and not arch.startswith(("Dinov2", "Radio"))
        else {}
    )
    with torch.no_grad():
        if arch in ("SiglipModel", "CLIPModel", "Aimv2Model"):
            pooled = model.vision_model(pixels, **top).pooler_output
            return (pooled if arch == "SiglipModel" else model.visual_projection(pooled)).numpy()
        n = (x.shape[2] // 8) * (x.shape[3] // 8)
        noise = {"noise": torch.arange(n, dtype=torch.float32)[None].repeat(len(x), 1)} if arch == "ViTMAEModel" else {}
        out = model(pixels, **noise, **top)
    for name in ("logits", "image_embeds", "pooler_output", "summary"):
        if getattr(out, name, None) is not None:
            return getattr(out, name).numpy()
    last = out.last_hidden_state
    return (last.mean(1) if arch == "IJepaModel" else last[:, 0] if arch.startswith("ViTM") else last).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("case", HF_FAMILY_CASES | HF_FAMILY_REFUSED)
def test_transformers_family_folder(case, tmp_path, perturb, images):
    if case in HF_FAMILY_REFUSED:
        arch, config_cls, words = HF_FAMILY_REFUSED[case]
        _family_model(arch, config_cls, {}, perturb).save_pretrained(tmp_path / "hf")
        with pytest.raises(ValueError, match=re.escape(words)):
            load_checkpoint(tmp_path / "hf")
        return
    arch, config_cls, config, how, size = HF_FAMILY_CASES[case]
    model = _family_model(arch, config_cls, config, perturb)
    if how == "v5":
        (tmp_path / "hf").mkdir()
        model.config.to_json_file(tmp_path / "hf" / "config.json")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "hf" / "model.safetensors")
    else:
        model.save_pretrained(tmp_path / "hf", **({"max_shard_size": "8KB"} if how == "sharded" else {}))
    if how == "sharded":
        index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
    x = images(1, size)
    ref = _family_output(model, arch, x)
    ckpt = load_checkpoint(tmp_path / "hf", strict=True, **({"image_size": size} if size != (32, 32) else {}))
    layout = "layer.{i}" if arch == "DINOv3ViTModel" else "v5" if how == "v5" else "v4"
    names = ONE_SPELLING if arch.startswith(("Siglip", "CLIP", "Aimv2", "Radio")) else f"{layout} key names"
    fmt = "hf_dinov3" if arch == "DINOv3ViTModel" else "hf_family"
    assert ckpt.report.format == fmt and ckpt.report.layout == f"{arch}, {names}"
    assert ckpt.report.assumed == [] and _equal(_twins(ckpt, x), ref)


def test_formats_page_reports_the_sweep_counts():
    n = counts()
    line = (
        f"{sum(n.values())} files: {n['exact']} loaded exact, {n['warned']} loaded with a warning naming each "
        f"assumed field, {n['refused']} refused naming what is unsupported, {n['wrong']} wrong"
    )
    assert line in " ".join((ROOT / "docs" / "formats.md").read_text().split()), line
