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

from vit_common.checkpoints.convert import save_checkpoint
from vit_common.checkpoints.formats.hf import HfWriteOptions
from vit_common.checkpoints.formats.timm import timm_kwargs
from vit_common.checkpoints.registry import REGISTRY
from vit_common.config import ViTConfig
from vit_torch.weights import numpy_to_tensor


def timm_model_kwargs(cfg: ViTConfig) -> dict:
    """Keyword arguments of timm's ``VisionTransformer`` for ``cfg``: ``vit_common.checkpoints.formats.timm
    .timm_kwargs`` with its LayerNorm eps as timm's ``norm_layer`` (the one timm builder: ``timm_model``,
    the benchmarks' timm contender)."""
    from timm.layers import LayerNorm

    kw = timm_kwargs(cfg)
    kw["norm_layer"] = partial(LayerNorm, eps=kw.pop("norm_eps"))
    if kw.pop("mlp_layer", None):
        from timm.layers import SwiGLUPacked

        kw["mlp_layer"] = SwiGLUPacked
    return kw


def timm_model(cfg: ViTConfig, state: Mapping[str, np.ndarray] | None = None) -> torch.nn.Module:
    """timm ``VisionTransformer`` (``VisionTransformerDistilled`` with head_dist) for ``cfg``
    (``timm_model_kwargs``), in eval mode.

    With ``state`` (canonical, i.e. a timm state_dict) the weights are loaded with strict=True.
    """
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    model = (VisionTransformerDistilled if cfg.head_dist else VisionTransformer)(**timm_model_kwargs(cfg))
    if state is not None:
        model.load_state_dict({k: numpy_to_tensor(np.asarray(v)) for k, v in state.items()}, strict=True)
    return model.eval()


def hf_model(cfg: ViTConfig, state: Mapping[str, np.ndarray], *, spelling: str = "v4") -> torch.nn.Module:
    """The transformers model ``vit_common.checkpoints.formats.hf.config_json`` names for ``cfg`` (ViT or DeiT:
    backbone, classifier, or classifier with teacher), in eval mode.

    The state is written as an HF folder (``vit_common.checkpoints.formats.hf``) and loaded with ``from_pretrained``,
    which must report no missing, unexpected or mismatched key (else ValueError). Attention is 'eager'
    so that attention probabilities can be returned.
    """
    import transformers

    from vit_common.checkpoints.formats.hf import config_json

    cls = getattr(transformers, config_json(cfg)["architectures"][0])
    kw = {} if cfg.num_classes else {"add_pooling_layer": cfg.rep_size > 0}
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(f"{tmp}/hf", cfg, state, "hf", options=HfWriteOptions(spelling))
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


def library_logits(path, fmt: str, cfg: ViTConfig, batches) -> tuple[str, list[np.ndarray]]:
    """(library, logits float32 [B, K] per batch) of the checkpoint file ``path`` of format ``fmt`` as the
    library that defines the format reads it (the format's ``reference``), on ``batches`` of images
    float32 [B, H, W, C].

    Loader 'state_dict' (timm files): timm's ``VisionTransformer`` for ``cfg`` (a timm file stores no
    head count, so the architecture comes from ``cfg``) loading the file's own tensors strictly
    (safetensors, or torch's weights-only loader for .pth/.bin); a timm hub folder is
    ``timm.create_model("local-dir:PATH", pretrained=True)``, timm reading its own config.json. 'npz'
    (original_vit / big_vision): timm's .npz loader (``timm.models.vision_transformer._load_weights``).
    'from_pretrained' (hf folders): transformers' ``ViTForImageClassification.from_pretrained`` (eager
    attention), which reads its own config.json.

    Raises:
        ImportError: the library is not installed (``e.name`` names it).
        ValueError: the library cannot build this model, or the format has no defining library here.
    """
    from pathlib import Path

    reference = REGISTRY[fmt].reference if fmt in REGISTRY else None
    loader = reference.loader if reference is not None else None
    if loader == "from_pretrained":
        import transformers

        model = transformers.ViTForImageClassification.from_pretrained(str(path), attn_implementation="eager")
        run = lambda x: model(pixel_values=x).logits  # noqa: E731
        library = f"transformers {transformers.__version__}"
    elif loader in ("state_dict", "npz"):
        import timm

        model = timm_model(cfg)
        if Path(path).is_dir():  # a timm hub folder: timm reads its config.json and loads it strictly
            model = timm.create_model(f"local-dir:{path}", pretrained=True)
        elif loader == "npz":
            from timm.models.vision_transformer import _load_weights

            _load_weights(model, str(path))
        elif Path(path).suffix == ".safetensors":
            from safetensors.torch import load_file

            model.load_state_dict(load_file(str(path)), strict=True)
        else:
            model.load_state_dict(torch.load(str(path), map_location="cpu", weights_only=True), strict=True)
        run = model
        library = f"timm {timm.__version__}" + (" (.npz loader)" if loader == "npz" else "")
    else:
        raise ValueError(f"format {fmt!r}: no defining library to check it with")
    model.eval()
    out = []
    with torch.no_grad():
        for x in batches:
            out.append(run(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))).float().numpy())
    return library, out
