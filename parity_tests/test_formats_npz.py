""".npz files we write, checked by timm's own loader of original-ViT and big_vision checkpoints
(``timm.models.vision_transformer._load_weights``) as an independent reader."""

from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer, _load_weights

from vit_common.checkpoints.convert import save_checkpoint
from vit_common.checkpoints.formats.npz import NpzWriteOptions
from vit_common.config import ViTConfig

BASE = ViTConfig(
    image_size=32,
    patch_size=8,
    width=64,
    depth=2,
    num_heads=4,
    mlp_dim=128,
    num_classes=10,
    gelu="tanh",
    posemb_resample="bilinear_corners",
)


@pytest.mark.parametrize(
    "fmt, write, kw, timm_kw",
    [
        ("original_vit", NpzWriteOptions("opt/target/"), {}, {}),
        (
            "big_vision",
            NpzWriteOptions("params/img/", scan=True),
            dict(posemb_prefix=False),
            dict(no_embed_class=True),
        ),
        (
            "big_vision",
            NpzWriteOptions(scan=True),
            dict(pool="map", class_token=False),
            dict(global_pool="map", class_token=False),
        ),
        (
            "big_vision",
            NpzWriteOptions(),
            dict(pool="gap", class_token=False),
            dict(global_pool="avg", class_token=False, fc_norm=False),
        ),
    ],
)
def test_npz_export_loads_in_timm_and_both_twins(
    tmp_path, fmt, write, kw, timm_kw, images, assert_twins_match, random_state
):
    cfg = BASE.replace(**kw)
    state = random_state(cfg, scale=0.1)
    save_checkpoint(tmp_path / "m.npz", cfg, state, fmt, options=write)
    tm = VisionTransformer(
        img_size=32,
        patch_size=8,
        embed_dim=64,
        depth=2,
        num_heads=4,
        mlp_ratio=2,
        num_classes=10,
        act_layer="gelu_tanh",
        **timm_kw,
    ).eval()
    _load_weights(tm, str(tmp_path / "m.npz"))
    assert all(torch.equal(v, torch.from_numpy(state[k])) for k, v in tm.state_dict().items())
    x = images(2, (32, 32))
    with torch.no_grad():
        ref = tm(torch.from_numpy(x)).numpy()
    assert_twins_match(tmp_path / "m.npz", x, ref)
