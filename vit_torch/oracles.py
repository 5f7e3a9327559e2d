"""Reference models of other libraries built from our config: timm and Hugging Face transformers.

Used as oracles by the parity tests, ``vit parity --against`` and the benchmarks. timm and transformers
are optional (the ``dev`` extra) and imported inside the functions.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from functools import partial

import numpy as np
import torch

from vit_common.config import ViTConfig
from vit_common.convert import save_checkpoint
from vit_common.formats.timm import timm_kwargs
from vit_torch.weights import numpy_to_tensor


def timm_model(cfg: ViTConfig, state: Mapping[str, np.ndarray] | None = None) -> torch.nn.Module:
    """timm ``VisionTransformer`` (``VisionTransformerDistilled`` with head_dist) for ``cfg``
    (``vit_common.formats.timm.timm_kwargs``), in eval mode.

    With ``state`` (canonical, i.e. a timm state_dict) the weights are loaded with strict=True.
    """
    from timm.layers import LayerNorm
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    kw = timm_kwargs(cfg)
    kw["norm_layer"] = partial(LayerNorm, eps=kw.pop("norm_eps"))
    model = (VisionTransformerDistilled if cfg.head_dist else VisionTransformer)(**kw)
    if state is not None:
        model.load_state_dict({k: numpy_to_tensor(np.asarray(v)) for k, v in state.items()}, strict=True)
    return model.eval()


def hf_model(cfg: ViTConfig, state: Mapping[str, np.ndarray], *, spelling: str = "v4") -> torch.nn.Module:
    """The transformers model ``vit_common.formats.hf.config_json`` names for ``cfg`` (ViT or DeiT:
    backbone, classifier, or classifier with teacher), in eval mode.

    The state is written as an HF folder (``vit_common.formats.hf``) and loaded with ``from_pretrained``,
    which must report no missing, unexpected or mismatched key (else ValueError). Attention is 'eager'
    so that attention probabilities can be returned.
    """
    import transformers

    from vit_common.formats.hf import config_json

    cls = getattr(transformers, config_json(cfg)["architectures"][0])
    kw = {} if cfg.num_classes else {"add_pooling_layer": cfg.rep_size > 0}
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(f"{tmp}/hf", cfg, state, "hf", spelling=spelling)
        model, info = cls.from_pretrained(
            f"{tmp}/hf",
            output_loading_info=True,
            attn_implementation="eager",
            dtype=getattr(torch, cfg.param_dtype),
            **kw,
        )
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"} | (
        {"errors": info["error_msgs"]} if info.get("error_msgs") else {}
    )
    if bad:
        raise ValueError(f"transformers did not load the folder strictly: {bad}")
    return model.eval()
