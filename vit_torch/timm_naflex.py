"""The embedding fields of a built timm ``NaFlexVit`` (``timm/models/naflexvit.py``: ``naflexvit_*``), read
off its ``embeds`` module: every choice declared. ``vit_torch.timm_models.timm_config`` reads the blocks,
norms and pooling, which are timm VisionTransformer's.

What the twins lack is refused by name: a factorized table, an aspect-preserving resize other than
RADIO's (bilinear without antialias to a square, cropped: ``bilinear_crop``, or with corners aligned as
the C-RADIOv3 B and H entry points: ``bilinear_crop_corners``), a
resize by ``grid_sample`` or one ``vit_common.posemb`` does not have, a norm before the projection,
patches flattened (C, P, P), rotary position embeddings.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.timm_naflex import CROP, RESAMPLE


def naflex_embed_fields(model: nn.Module, name: str = "model") -> dict[str, Any]:
    """ViTConfig fields of a NaFlexVit's ``embeds`` (image and patch size, channels, patch bias and norm,
    class and register tokens, the table and its resize ``posemb_resample``: ``timm_naflex.RESAMPLE``).

    Raises:
        FormatError: naming what the model has and the twins lack.
    """
    e = model.embeds
    resize = (e.pos_embed_interp_mode, bool(e.pos_embed_antialias), bool(e.pos_embed_align_corners))
    crop = bool(e.pos_embed_ar_preserving)  # to a square of the longer side, then the top-left crop
    lacks = {
        "a factorized position table (pos_embed='factorized')": e.pos_embed_type == "factorized",
        f"an aspect-preserving table resize {resize} (interp mode, antialias, align_corners); the twins have "
        f"{sorted(CROP)}": crop and resize not in CROP,
        "a table resize by grid_sample (pos_embed_use_grid_sample)": e.pos_embed_use_grid_sample,
        f"a table resize {resize} (interp mode, antialias, align_corners); the twins have {sorted(RESAMPLE)}": (
            e.pos_embed_type == "learned" and not crop and resize not in RESAMPLE
        ),
        "a norm on the flattened patches before the projection (input_norm_layer)": e.norm_input is not None,
        "patches flattened (C, P, P) (patchify_channels_last=False)": e.is_linear and not e.channels_last,
        "rotary position embeddings": getattr(model, "rope", None) is not None,
    }
    if any(lacks.values()):
        raise FormatError(
            f"timm model {name!r} has what the twins do not implement: " + ", ".join(k for k, v in lacks.items() if v)
        )
    (gh, gw), (ph, pw) = e.pos_embed_grid_size, e.patch_size
    return dict(
        image_size=(gh * ph, gw * pw),
        patch_size=(ph, pw),
        patch_bias=e.proj.bias is not None,
        in_chans=e.in_chans,
        patch_norm=not isinstance(e.norm, nn.Identity),
        class_token=e.cls_token is not None,
        reg_tokens=e.num_reg_tokens,
        posemb="learn" if e.pos_embed_type == "learned" else "none",
        posemb_prefix=False,
        dynamic_img_size=True,
        posemb_resample=(CROP if crop else RESAMPLE).get(resize, "bicubic_aa"),
    )
