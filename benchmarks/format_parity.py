"""Measure, per checkpoint format, how far the twins' float32 logits are from the format's own library.

Writes random-weight checkpoints (nothing is downloaded) with timm, transformers and our .npz writers
into a temporary folder, runs ``run_parity`` (``vit parity``) on each with the library as the third
column (for .npz files: timm's own .npz loader), and prints a markdown table: max |JAX - torch twin|
and max |library - torch twin| over the logits, relative to max |logits|.
Run: ``python -m benchmarks.format_parity`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import timm
import torch
import transformers
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer

from vit_common.checkpoints.convert import save_checkpoint
from vit_common.checkpoints.formats.npz import NpzWriteOptions
from vit_common.config import ViTConfig
from vit_common.state import random_state
from vit_compare.inference import run_parity


def _randomize(model: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return model.eval()


def _timm_file(folder: Path, name: str, model: torch.nn.Module) -> Path:
    path = folder / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in _randomize(model).state_dict().items()}, path)
    return path


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="vit-format-parity-"))
    small = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)
    cases = []  # (label, path, against, load options)
    for name in ("vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224"):
        cases.append((f"timm {name}", _timm_file(folder, name, timm.create_model(name)), "timm", {}))
    for label, kw in (
        ("registers", dict(reg_tokens=4, no_embed_class=True)),
        ("LayerScale", dict(init_values=1e-5)),
        ("MAP head", dict(global_pool="map", class_token=False)),
    ):
        path = _timm_file(folder, label.replace(" ", "_"), VisionTransformer(**small, **kw))
        cases.append((f"timm small, {label}", path, "timm", {"num_heads": 4}))
    hf_cfg = transformers.ViTConfig(
        hidden_size=192,
        num_hidden_layers=12,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=1000,
        pooler_output_size=192,
    )
    for arch in (transformers.ViTForImageClassification, transformers.ViTModel):
        _randomize(arch(hf_cfg)).save_pretrained(folder / arch.__name__)
        cases.append((f"HF {arch.__name__} (Ti/16 shape)", folder / arch.__name__, "transformers", {}))
    cfg = ViTConfig(
        image_size=224, patch_size=16, width=192, depth=12, num_heads=3, mlp_dim=768, num_classes=1000, gelu="tanh"
    )
    state = random_state(cfg, scale=0.05)
    save_checkpoint(folder / "orig.npz", cfg, state, "original_vit")
    cases.append(("original ViT .npz (Ti/16)", folder / "orig.npz", "timm _load_weights", {}))
    bv = cfg.replace(posemb_prefix=False)
    save_checkpoint(
        folder / "bv.npz",
        bv,
        state | {"pos_embed": state["pos_embed"][:, 1:]},
        "big_vision",
        options=NpzWriteOptions(scan=True),
    )
    cases.append(("big_vision .npz, scan (Ti/16)", folder / "bv.npz", "timm _load_weights", {}))
    print("| checkpoint | JAX vs torch twin (rel) | library vs torch twin (rel) | attention max abs | top-1 |")
    print("| --- | --- | --- | --- | --- |")
    for label, path, against, options in cases:
        npz = against == "timm _load_weights"
        res = run_parity(path, num_generated=2, against=None if npz else against, keep_outputs=npz, **options)
        logits = next(r for r in res.rows if r.name == "logits")
        attn = max((r.twins.max_abs for r in res.rows if r.what == "attention"), default=0.0)
        lib = logits.against.rel if logits.against else _timm_npz_rel(path, res) if npz else None
        lib = f"{lib:.1e} ({against})" if lib is not None else "-"
        print(f"| {label} | {logits.twins.rel:.1e} | {lib} | {attn:.1e} | {res.agreement:.0%} |")


def _timm_npz_rel(path: Path, res) -> float:
    """Logits of timm's own .npz loader (``_load_weights``) vs the torch twin's, relative."""
    from timm.models.vision_transformer import _load_weights

    from vit_common.checkpoints.convert import load_checkpoint
    from vit_torch.oracles import timm_model

    cfg = load_checkpoint(path).cfg
    model = timm_model(cfg)
    _load_weights(model, str(path))
    x = np.random.default_rng(0).standard_normal((2, cfg.in_chans, *cfg.image_size)).astype(np.float32)
    with torch.no_grad():
        got = model(torch.from_numpy(x)).numpy()
    ref = res.outputs["torch"]["logits"]
    return float(np.abs(got - ref).max() / np.abs(ref).max())


if __name__ == "__main__":
    main()
