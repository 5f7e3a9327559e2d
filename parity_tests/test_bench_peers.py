"""The benchmark's peers: timm and transformers built from ``benchmarks.peers.peer_config`` are the
model the twins are (a twin's config and its reference libraries: parity_tests/, see README Layout)."""

from __future__ import annotations

from benchmarks.peers import peer_config
from vit_common.config import ViTConfig


def test_peer_configs_build_the_same_model():
    """timm and HF built from peer_config have the golden Ti/16 parameter count (5,717,416)."""
    import timm.models.vision_transformer as timm_vit
    import transformers

    cfg = ViTConfig.from_name("Ti/16")
    models = [
        timm_vit.VisionTransformer(**peer_config(cfg, "timm")),
        transformers.ViTForImageClassification(transformers.ViTConfig(**peer_config(cfg, "hf"))),
    ]
    assert [sum(p.numel() for p in m.parameters()) for m in models] == [5_717_416] * 2
