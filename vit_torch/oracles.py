"""Reference models of other libraries built from our config: timm and Hugging Face transformers.

Each returns the library's own model (or its logits) for a config, to compare a twin against. timm and
transformers are optional (the ``dev`` extra) and imported inside the functions.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from functools import partial

import numpy as np
import torch

from vit_common.checkpoints.convert import save_checkpoint
from vit_common.checkpoints.formats.hf import HfWriteOptions
from vit_common.checkpoints.formats.timm_eva import canonical_to_eva, default_layout, eva_kwargs, eva_name, is_eva
from vit_common.checkpoints.formats.timm_state import timm_kwargs
from vit_common.checkpoints.registry import REGISTRY
from vit_common.config import ViTConfig
from vit_torch.weights import numpy_to_tensor


def timm_model_kwargs(cfg: ViTConfig) -> dict:
    """Keyword arguments of timm's ``VisionTransformer`` for ``cfg``:
    ``vit_common.checkpoints.formats.timm_state.timm_kwargs`` with its norm (class and eps) as timm's
    ``norm_layer`` and, with a patch norm, ``embed_norm_layer`` (the one timm builder: ``timm_model``, the
    benchmarks' timm contender)."""
    import timm.layers

    kw = timm_kwargs(cfg)
    norm = partial(getattr(timm.layers, kw.pop("norm_class")), eps=kw.pop("norm_eps"))
    kw["norm_layer"] = norm
    if kw.pop("embed_norm", False):
        kw["embed_norm_layer"] = norm
    if kw.pop("mlp_layer", None):
        from timm.layers import SwiGLUPacked

        kw["mlp_layer"] = SwiGLUPacked
    return kw


def timm_model(cfg: ViTConfig, state: Mapping[str, np.ndarray] | None = None) -> torch.nn.Module:
    """timm ``VisionTransformer`` (``VisionTransformerDistilled`` with head_dist) for ``cfg``
    (``timm_model_kwargs``), in eval mode; timm's ``Eva`` for a RoPE backbone (``timm_eva.is_eva``:
    ``timm.create_model`` of ``timm_eva.eva_name`` with ``eva_kwargs`` and ``cfg``'s LayerNorm eps).

    With ``state`` (canonical, i.e. a timm state_dict; an Eva's in timm's own spelling,
    ``timm_eva.canonical_to_eva``) the weights are loaded with strict=True.
    """
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    if is_eva(cfg):
        import timm

        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in eva_kwargs(cfg).items()}
        norm = partial(timm.layers.LayerNorm, eps=cfg.ln_eps)
        model = timm.create_model(eva_name(cfg) or "eva02_tiny_patch14_224", pretrained=False, norm_layer=norm, **kw)
        state = canonical_to_eva(cfg, state, default_layout(cfg)) if state is not None else None
    else:
        model = (VisionTransformerDistilled if cfg.head_dist else VisionTransformer)(**timm_model_kwargs(cfg))
    if state is not None:
        model.load_state_dict({k: numpy_to_tensor(np.asarray(v)) for k, v in state.items()}, strict=True)
    return model.eval()


def transformers_format(cfg: ViTConfig, fmt: str | None = None) -> str:
    """The registry format a transformers reference of ``cfg`` is written in: ``fmt`` (the source's) where
    transformers defines it, else the first format transformers defines that can hold ``cfg`` (hf for a
    ViT or DeiT, hf_family for SigLIP, CLIP, DINOv2, I-JEPA models).

    Raises:
        ValueError: no transformers format holds ``cfg`` (names what each lacks).
    """
    ours = [n for n, f in REGISTRY.items() if f.reference is not None and f.reference.library == "transformers"]
    for name in ([fmt] if fmt in ours else []) + ours:
        if not REGISTRY[name].cannot_hold(cfg):
            return name
    lacks = "; ".join(f"{n}: {', '.join(REGISTRY[n].cannot_hold(cfg))}" for n in ours)
    raise ValueError(f"no transformers model holds this config ({lacks})")


def hf_model(
    cfg: ViTConfig,
    state: Mapping[str, np.ndarray],
    *,
    spelling: str = "v4",
    fmt: str | None = None,
    model_type: str | None = None,
) -> torch.nn.Module:
    """The transformers model that holds ``cfg`` (``transformers_format``: ViT or DeiT as the hf format
    writes it; SigLIP, CLIP, DINOv2, ViT-MAE, ViT-MSN or I-JEPA as hf_family does, of ``model_type``
    where given and it holds the model), in eval mode.

    The state is written as that format's folder and loaded with ``from_pretrained`` of the class its
    config.json names, which must report no missing, unexpected or mismatched key (else ValueError).
    Attention is 'eager' so that attention probabilities can be returned.
    """
    import transformers

    from vit_common.system.io import read_json

    own_type = fmt == "hf_family" and model_type and not REGISTRY[fmt].cannot_hold(cfg, model_type)
    if not own_type:  # the source's own model type is kept for ViT-MAE and ViT-MSN (else a plain ViT)
        fmt, model_type = transformers_format(cfg, fmt), None
    kw = {} if cfg.num_classes or fmt != "hf" else {"add_pooling_layer": cfg.rep_size > 0}
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(f"{tmp}/hf", cfg, state, fmt, options=HfWriteOptions(spelling, model_type))
        cls = getattr(transformers, read_json(f"{tmp}/hf/config.json")["architectures"][0])
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


def transformers_outputs(model: torch.nn.Module, pixels: torch.Tensor, cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """A transformers vision model's outputs on ``pixels`` [B, C, H, W] under our intermediates' names:
    ``blockNN`` (hidden states after each block), ``attnNN`` (probabilities [B, heads, L, L]), ``logits``
    (the classifier's, CLIP's projection, else the pooled features: the pooler, RADIO's summary, or the
    class token / the mean of the tokens of ``last_hidden_state`` as ``cfg.pool`` says), ``norm`` (``last_hidden_state``
    of a backbone, except CLIP's, which is before its post-norm) and ``pos_embed`` (the embeddings, for
    ViT and DeiT). ViT-MAE runs with patch-order noise: with mask_ratio=0 its shuffle is the identity.
    A ViTModel without pooler and a model pooling nothing (``pool='none'``) give no ``logits``.
    """
    model_type = model.config.model_type
    kw = {}
    if model_type == "vit_mae":
        p = model.config.patch_size
        n = (pixels.shape[2] // p) * (pixels.shape[3] // p)
        kw["noise"] = torch.arange(pixels.shape[0] * n, dtype=torch.float32).reshape(pixels.shape[0], n)
    res = model(pixel_values=pixels, output_hidden_states=True, output_attentions=True, **kw)
    out = {f"block{i:02d}": h for i, h in enumerate(res.hidden_states[1:])}
    out |= {f"attn{i:02d}": a for i, a in enumerate(res.attentions)}
    if model_type in ("vit", "deit"):
        out["pos_embed"] = res.hidden_states[0]
    last = getattr(res, "last_hidden_state", None)
    if last is not None and model_type not in ("clip_vision_model", "clip"):
        out["norm"] = last
    for name in ("logits", "image_embeds", "pooler_output", "summary"):
        if getattr(res, name, None) is not None:
            out["logits"] = getattr(res, name)
            if name == "pooler_output" and cfg.rep_size:
                out["pre_logits"] = out["logits"]
            break
    else:
        if last is not None and model_type not in ("vit", "deit") and cfg.pool in ("token", "gap"):
            out["logits"] = last[:, 0] if cfg.pool == "token" else last.mean(1)
    return out


def library_logits(path, fmt: str, cfg: ViTConfig, batches) -> tuple[str, list[np.ndarray]]:
    """(library, logits float32 [B, K] per batch) of the checkpoint file ``path`` of format ``fmt`` as the
    library that defines the format reads it (the format's ``reference``), on ``batches`` of images
    float32 [B, H, W, C].

    Loader 'state_dict' (timm files): timm's ``VisionTransformer`` for ``cfg`` (a timm file stores no
    head count, so the architecture comes from ``cfg``) loading the file's own tensors strictly
    (safetensors, or torch's weights-only loader for .pth/.bin); a timm hub folder is
    ``timm.create_model("local-dir:PATH", pretrained=True)``, timm reading its own config.json. 'npz'
    (original_vit / big_vision): timm's .npz loader (``timm.models.vision_transformer._load_weights``).
    'from_pretrained' (hf and hf_family folders): ``from_pretrained`` of the transformers class the
    folder's config.json names (eager attention; ``transformers_outputs``' logits).

    Raises:
        ImportError: the library is not installed (``e.name`` names it).
        ValueError: the library cannot build this model, or the format has no defining library here.
    """
    from pathlib import Path

    reference = REGISTRY[fmt].reference if fmt in REGISTRY else None
    loader = reference.loader if reference is not None else None
    if loader == "from_pretrained":
        import transformers

        from vit_common.system.io import read_json

        arch = read_json(Path(path) / "config.json")["architectures"][0]
        model = getattr(transformers, arch).from_pretrained(str(path), attn_implementation="eager")
        run = lambda x: transformers_outputs(model, x, cfg)["logits"]  # noqa: E731
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
