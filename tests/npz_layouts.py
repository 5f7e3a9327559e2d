"""Test helper: write the .npz layouts of the original ViT and big_vision from a canonical state.

Written independently of ``vit_common.formats.npz`` (plain numpy, one line per parameter), from the
parameter paths the real files hold: google-research/vision_transformer ``models_vit.py`` checkpoints
(pre-linen global counters LayerNorm_0 / MultiHeadDotProductAttention_1 / LayerNorm_2 / MlpBlock_3,
``Transformer/posembed_input/pos_embedding`` with a class row, optional ``opt/target/`` prefix of
flax.optim, ``pre_logits``, ImageNet-21k heads zeroed) and google-research/big_vision ``models/vit.py``
(linen counters LayerNorm_0 / MultiHeadDotProductAttention_0 / LayerNorm_1 / MlpBlock_0, top-level
``pos_embedding`` without class row, ``params/`` or ``params/img/`` prefix, ``MAPHead_0``, ``nn.scan``
stacking under ``Transformer/encoderblock``).
"""

from __future__ import annotations

import numpy as np

from vit_common.config import ViTConfig


def _block(cfg: ViTConfig, s: dict, i: int, counters: str) -> dict[str, np.ndarray]:
    d, n = cfg.width, cfg.num_heads
    hd = d // n
    ln1, mha, ln2, mlp = (
        ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
        if counters == "old"
        else ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
    )
    b = f"blocks.{i}."
    qkv_w, qkv_b = s[b + "attn.qkv.weight"], s[b + "attn.qkv.bias"]
    out = {
        f"{ln1}/scale": s[b + "norm1.weight"],
        f"{ln1}/bias": s[b + "norm1.bias"],
        f"{ln2}/scale": s[b + "norm2.weight"],
        f"{ln2}/bias": s[b + "norm2.bias"],
        f"{mha}/out/kernel": s[b + "attn.proj.weight"].T.reshape(n, hd, d),  # (N, D/N, D)
        f"{mha}/out/bias": s[b + "attn.proj.bias"],
        f"{mlp}/Dense_0/kernel": s[b + "mlp.fc1.weight"].T,
        f"{mlp}/Dense_0/bias": s[b + "mlp.fc1.bias"],
        f"{mlp}/Dense_1/kernel": s[b + "mlp.fc2.weight"].T,
        f"{mlp}/Dense_1/bias": s[b + "mlp.fc2.bias"],
    }
    for j, name in enumerate(("query", "key", "value")):
        out[f"{mha}/{name}/kernel"] = qkv_w[j * d : (j + 1) * d].T.reshape(d, n, hd)  # (D, N, D/N)
        out[f"{mha}/{name}/bias"] = qkv_b[j * d : (j + 1) * d].reshape(n, hd)
    return out


def layout_arrays(
    cfg: ViTConfig,
    s: dict,
    *,
    layout: str,
    prefix: str = "",
    scan: bool = False,
    posemb_key: str | None = None,
) -> dict[str, np.ndarray]:
    """The flat {path: array} an .npz of ``layout`` ('vit' | 'big_vision') holds for state ``s``."""
    counters = "old" if layout == "vit" else "new"
    if posemb_key is None:
        posemb_key = "Transformer/posembed_input/pos_embedding" if layout == "vit" else "pos_embedding"
    d = cfg.width
    out = {
        "embedding/kernel": s["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # OIHW -> HWIO
        "embedding/bias": s["patch_embed.proj.bias"],
        "Transformer/encoder_norm/scale": s["norm.weight"],
        "Transformer/encoder_norm/bias": s["norm.bias"],
    }
    if "cls_token" in s:
        out["cls"] = s["cls_token"]
    if "pos_embed" in s:
        out[posemb_key] = s["pos_embed"]
    blocks = [_block(cfg, s, i, counters) for i in range(cfg.depth)]
    if scan:
        out |= {f"Transformer/encoderblock/{k}": np.stack([b[k] for b in blocks]) for k in blocks[0]}
    else:
        out |= {f"Transformer/encoderblock_{i}/{k}": v for i, b in enumerate(blocks) for k, v in b.items()}
    if "attn_pool.latent" in s:
        n, hd = cfg.num_heads, d // cfg.num_heads
        kv_w, kv_b = s["attn_pool.kv.weight"], s["attn_pool.kv.bias"]
        m = "MAPHead_0/MultiHeadDotProductAttention_0"
        out |= {
            "MAPHead_0/probe": s["attn_pool.latent"],
            f"{m}/query/kernel": s["attn_pool.q.weight"].T.reshape(d, n, hd),
            f"{m}/query/bias": s["attn_pool.q.bias"].reshape(n, hd),
            f"{m}/key/kernel": kv_w[:d].T.reshape(d, n, hd),
            f"{m}/key/bias": kv_b[:d].reshape(n, hd),
            f"{m}/value/kernel": kv_w[d:].T.reshape(d, n, hd),
            f"{m}/value/bias": kv_b[d:].reshape(n, hd),
            f"{m}/out/kernel": s["attn_pool.proj.weight"].T.reshape(n, hd, d),
            f"{m}/out/bias": s["attn_pool.proj.bias"],
            "MAPHead_0/LayerNorm_0/scale": s["attn_pool.norm.weight"],
            "MAPHead_0/LayerNorm_0/bias": s["attn_pool.norm.bias"],
            "MAPHead_0/MlpBlock_0/Dense_0/kernel": s["attn_pool.mlp.fc1.weight"].T,
            "MAPHead_0/MlpBlock_0/Dense_0/bias": s["attn_pool.mlp.fc1.bias"],
            "MAPHead_0/MlpBlock_0/Dense_1/kernel": s["attn_pool.mlp.fc2.weight"].T,
            "MAPHead_0/MlpBlock_0/Dense_1/bias": s["attn_pool.mlp.fc2.bias"],
        }
    if "pre_logits.fc.weight" in s:
        out |= {"pre_logits/kernel": s["pre_logits.fc.weight"].T, "pre_logits/bias": s["pre_logits.fc.bias"]}
    if "head.weight" in s:
        out |= {"head/kernel": s["head.weight"].T, "head/bias": s["head.bias"]}
    return {prefix + k: np.ascontiguousarray(v) for k, v in out.items()}


def write_layout(path, cfg: ViTConfig, s: dict, *, extra: dict | None = None, **kw) -> None:
    """Write ``layout_arrays(cfg, s, **kw)`` plus ``extra`` arrays (e.g. optimizer state) to ``path``."""
    with open(path, "wb") as fh:
        np.savez(fh, **layout_arrays(cfg, s, **kw), **(extra or {}))
