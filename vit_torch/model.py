"""Vision Transformer in PyTorch; its state_dict is timm's ``VisionTransformer``'s.

Images are [B, C, H, W] (channels first). Shape alphabet: B batch, H/W pixels, C channels, P patch,
L tokens, D width, N heads, K classes, F MLP width. The JAX twin is ``vit_jax/model.py``: same classes,
same forward order, same intermediates. Layers compute in ``cfg.dtype`` whatever ``cfg.param_dtype``
is (flax's ``dtype``/``param_dtype`` semantics), instead of relying on autocast, whose op lists differ
between CPU and CUDA.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vit_common.config import ViTConfig
from vit_common.naflex import naflex_inputs
from vit_common.posemb import SINCOS_CONVENTIONS, resample_matrices, sincos2d
from vit_torch.layers import (
    DropPath,
    LayerScale,
    acc_dtype,
    condition_input,
    linear_layer,
    masked_drop,
    masked_max,
    masked_mean,
    norm_layer,
    sub_masks,
    torch_dtype,
)
from vit_torch.rope import RotaryEmbedding, apply_rope


class PatchEmbed(nn.Module):
    """Stride-P convolution, no padding (VALID), bias if cfg.patch_bias: [B, C, H, W] -> [B, D, H/P, W/P].

    ``norm`` (cfg.patch_norm) is applied by the model to the flattened tokens [B, h*w, D], as timm's;
    ``embed_flat`` applies the same kernel to NaFlex patches."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.proj = nn.Conv2d(
            cfg.in_chans,
            cfg.width,
            cfg.patch_size,
            stride=cfg.patch_size,
            padding=0,
            bias=cfg.patch_bias,
            dtype=torch_dtype(cfg.param_dtype),
        )
        self.norm = norm_layer(cfg, cfg.width) if cfg.patch_norm else None
        self.compute_dtype = torch_dtype(cfg.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cd = self.compute_dtype
        bias = None if self.proj.bias is None else self.proj.bias.to(cd)
        return F.conv2d(x.to(cd), self.proj.weight.to(cd), bias, stride=self.proj.stride)

    def embed_flat(self, x: torch.Tensor) -> torch.Tensor:
        """NaFlex patches [B, N, P*P*C], each flattened (P, P, C) -> [B, N, D]: the convolution as one
        linear map (its weight [D, C, P, P] as [D, P*P*C]; transformers Siglip2's ``patch_embedding``)."""
        cd = self.compute_dtype
        weight = self.proj.weight.to(cd).permute(0, 2, 3, 1).reshape(self.proj.weight.shape[0], -1)
        return F.linear(x.to(cd), weight, None if self.proj.bias is None else self.proj.bias.to(cd))


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    drop: nn.Module | None = None,
    token_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention written out: q [B, L, N, D/N], k and v [B, M, N, D/N] ->
    (out [B, L, N, D/N] in q's dtype, probabilities [B, N, L, M] in at least float32); ``token_mask``
    [B, M] bool: keys where it is False get probability 0 (NaFlex padding).

    Heads move in front of the tokens first, as in the JAX twin (where XLA needs that layout); q is
    scaled before the product, as timm's non-fused ``Attention`` does. ``drop`` (attention dropout)
    applies to the probabilities used for ``out``, not the ones returned.
    """
    acc = acc_dtype(q.dtype)
    qh, kh, vh = (t.to(acc).transpose(1, 2) for t in (q, k, v))  # [B, N, L|M, D/N]
    logits = torch.einsum("bnlh,bnmh->bnlm", qh * scale, kh)
    if token_mask is not None:
        logits = logits.masked_fill(~token_mask[:, None, None, :], float("-inf"))
    probs = logits.softmax(dim=-1)
    out = torch.einsum("bnlm,bnmh->bnlh", probs if drop is None else drop(probs), vh)
    return out.transpose(1, 2).to(q.dtype), probs


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection (rows [q; k; v], head-major).

    Two paths: fused (``F.scaled_dot_product_attention``) and explicit (logits and softmax written
    out), which alone returns probabilities. Both compute logits and softmax in at least float32.
    Without a key bias (cfg.k_bias False) the q and v biases are ``q_bias`` and ``v_bias`` (timm
    ``EvaAttention``); with RoPE the patch tokens of q and k are rotated after qk_norm; ``norm``
    (cfg.attn_inner_norm) normalises the heads' output before ``proj`` (timm ``scale_attn_inner``).
    """

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.num_prefix_tokens, self.rope_layout = cfg.num_prefix_tokens, cfg.rope_layout
        self.fused = cfg.attn_impl == "fused"
        self.qkv = linear_layer(cfg, cfg.width, 3 * cfg.width, bias=cfg.qkv_bias and cfg.k_bias)
        qv_bias = cfg.qkv_bias and not cfg.k_bias
        self.q_bias = nn.Parameter(torch.zeros(cfg.width, dtype=torch_dtype(cfg.param_dtype))) if qv_bias else None
        self.v_bias = nn.Parameter(torch.zeros(cfg.width, dtype=torch_dtype(cfg.param_dtype))) if qv_bias else None
        self.q_norm = norm_layer(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = norm_layer(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.attn_drop = nn.Dropout(cfg.attn_dropout)
        self.norm = norm_layer(cfg, cfg.width) if cfg.attn_inner_norm else None
        self.proj = linear_layer(cfg, cfg.width, cfg.width, bias=cfg.proj_bias)
        self.proj_drop = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: bool = False,
        masks: dict | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, L, D] -> ([B, L, D], probabilities [B, N, L, L] or None); ``masks`` {"attn_drop":
        [B, N, L, L], "proj_drop": [B, L, D]} the parity mode's dropout keep masks (explicit path);
        ``rope`` (sin, cos) [Np, hd] or [N, Np, hd] (``RotaryEmbedding``); ``token_mask`` [B, L] bool, the
        real tokens (NaFlex: ``vit_common.naflex.check_batch``): no token attends to the others."""
        b, l, d = x.shape
        qkv = self.qkv(x)  # [B, L, 3D]
        if self.q_bias is not None:
            qkv = qkv + torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias]).to(qkv.dtype)
        q, k, v = qkv.reshape(b, l, 3, self.num_heads, self.head_dim).unbind(2)  # each [B, L, N, D/N]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = (apply_rope(t, *rope, self.num_prefix_tokens, self.rope_layout) for t in (q, k))
        scale = self.head_dim**-0.5
        if self.fused and not return_attn and masks is None:
            p = self.attn_drop.p if self.training else 0.0
            attn_mask = None if token_mask is None else token_mask[:, None, None, :]  # [B, 1, 1, L]
            out = F.scaled_dot_product_attention(  # takes [B, N, L, D/N]
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask, dropout_p=p, scale=scale
            ).transpose(1, 2)
            probs = None
        else:
            drop = lambda p: masked_drop(self.attn_drop, p, masks, "attn_drop")  # noqa: E731
            out, probs = _attend(q, k, v, scale, drop, token_mask)
        out = out.reshape(b, l, d)
        if self.norm is not None:
            out = self.norm(out)
        x = masked_drop(self.proj_drop, self.proj(out), masks, "proj_drop")  # [B, L, D]
        return x, probs


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """x sigmoid(1.702 x): OpenAI CLIP's QuickGELU (timm ``QuickGELU``, HF ``quick_gelu``)."""
    return x * torch.sigmoid(1.702 * x)


class Mlp(nn.Module):
    """fc1 -> GELU (cfg.gelu: 'exact' erf, 'tanh' or 'quick') -> dropout -> (norm) -> fc2 -> dropout.

    ``hidden`` F (default cfg.mlp_dim); ``norm`` over F when ``inner_norm`` (timm ``scale_mlp``); ``bias`` on
    both layers (a block's: cfg.mlp_bias; the MAP head's always)."""

    def __init__(self, cfg: ViTConfig, hidden: int | None = None, inner_norm: bool = False, bias: bool = True):
        super().__init__()
        f = hidden or cfg.mlp_dim
        self.quick = cfg.gelu == "quick"
        self.approximate = "tanh" if cfg.gelu == "tanh" else "none"
        self.fc1 = linear_layer(cfg, cfg.width, f, bias)
        self.drop1 = nn.Dropout(cfg.dropout)
        self.norm = norm_layer(cfg, f) if inner_norm else None
        self.fc2 = linear_layer(cfg, f, cfg.width, bias)
        self.drop2 = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, masks: dict | None = None) -> torch.Tensor:
        """x [..., D] -> [..., D]; ``masks`` {"drop1": [..., F], "drop2": [..., D]} (parity mode)."""
        h = self.fc1(x)
        h = masked_drop(
            self.drop1, quick_gelu(h) if self.quick else F.gelu(h, approximate=self.approximate), masks, "drop1"
        )
        return masked_drop(self.drop2, self.fc2(h if self.norm is None else self.norm(h)), masks, "drop2")


class GluMlp(nn.Module):
    """Gated MLP (mlp_type='swiglu'): fc1 [2F, D] -> [g; v] -> silu(g) * v -> dropout -> fc2 -> dropout.

    The gate's rows come first in fc1 (timm ``SwiGLUPacked`` = ``GluMlp(act_layer=SiLU,
    gate_last=False)``; HF ``Dinov2SwiGLUFFN`` computes the same with ``gate_proj`` and ``up_proj``).
    """

    def __init__(self, cfg: ViTConfig, inner_norm: bool = False):
        super().__init__()
        self.fc1 = linear_layer(cfg, cfg.width, 2 * cfg.mlp_dim, cfg.mlp_bias)
        self.drop1 = nn.Dropout(cfg.dropout)
        self.norm = norm_layer(cfg, cfg.mlp_dim) if inner_norm else None  # timm SwiGLU scale_mlp
        self.fc2 = linear_layer(cfg, cfg.mlp_dim, cfg.width, cfg.mlp_bias)
        self.drop2 = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, masks: dict | None = None) -> torch.Tensor:
        """x [..., D] -> [..., D]; ``masks`` {"drop1": [..., F], "drop2": [..., D]} (parity mode)."""
        gate, value = self.fc1(x).chunk(2, dim=-1)  # each [..., F]
        h = masked_drop(self.drop1, F.silu(gate) * value, masks, "drop1")
        return masked_drop(self.drop2, self.fc2(h if self.norm is None else self.norm(h)), masks, "drop2")


class Block(nn.Module):
    """Pre-norm transformer block: x + drop_path(ls1(attn(norm1(x)))), then the same for the MLP.

    On CPU the JAX twin passes the residual stream through ``residual_barrier`` before each block
    (``vit_jax/platforms.py``), an identity that only changes how XLA compiles the backward pass;
    eager PyTorch needs no counterpart.
    """

    def __init__(self, cfg: ViTConfig, drop_path: float):
        super().__init__()
        self.norm1 = norm_layer(cfg, cfg.width)
        self.attn = Attention(cfg)
        self.ls1 = LayerScale(cfg) if cfg.layer_scale is not None else None
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = norm_layer(cfg, cfg.width)
        inner, bias = cfg.mlp_inner_norm, cfg.mlp_bias
        glu = cfg.mlp_type == "swiglu"
        self.mlp = GluMlp(cfg, inner_norm=inner) if glu else Mlp(cfg, inner_norm=inner, bias=bias)
        self.ls2 = LayerScale(cfg) if cfg.layer_scale is not None else None
        self.drop_path2 = DropPath(drop_path)

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: bool = False,
        drop_mask: torch.Tensor | None = None,
        masks: dict | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, L, D] -> ([B, L, D], probabilities or None); ``drop_mask`` [B, 2]: both branches' drop-path
        masks (parity mode), else drawn; ``masks`` the block's dropout masks by path ("attn.attn_drop",
        "attn.proj_drop", "mlp.drop1", "mlp.drop2"; parity mode), else drawn; ``rope`` this block's
        RoPE tables and ``token_mask`` [B, L] the real tokens (``Attention``)."""
        m1, m2 = (None, None) if drop_mask is None else (drop_mask[:, 0], drop_mask[:, 1])
        attn_masks = sub_masks(masks, "attn")
        y, probs = self.attn(self.norm1(x), return_attn=return_attn, masks=attn_masks, rope=rope, token_mask=token_mask)
        x = x + self.drop_path1(self.ls1(y) if self.ls1 is not None else y, m1)
        y = self.mlp(self.norm2(x), sub_masks(masks, "mlp"))
        x = x + self.drop_path2(self.ls2(y) if self.ls2 is not None else y, m2)
        return x, probs


def _query_attention(
    q: torch.Tensor, kv: torch.Tensor, fused: bool, return_attn: bool, token_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A pooling head's attention: queries q [B, 1, N, D/N] over kv [B, L, 2, N, D/N] (keys, values), scale
    (D/N)^-0.5 -> (out [B, 1, N, D/N], probabilities [B, N, 1, L] with ``return_attn``, else None);
    ``token_mask`` [B, L] bool: the tokens where it is False get no weight."""
    k, v = kv.unbind(2)  # each [B, L, N, D/N]
    scale = q.shape[-1] ** -0.5
    if fused and not return_attn:
        attn_mask = None if token_mask is None else token_mask[:, None, None, :]  # [B, 1, 1, L]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask, scale=scale
        )
        return out.transpose(1, 2), None
    return _attend(q, k, v, scale, token_mask=token_mask)


class MAPHead(nn.Module):
    """Multihead attention pooling (big_vision ``MAPHead``, timm ``AttentionPoolLatent``).

    A learned probe ``latent`` [1, 1, D] attends over the tokens it is given (the patch tokens, or all of
    them with cfg.pool_include_prefix, as timm); then x + mlp(norm(x)). Heads cfg.map_num_heads, MLP
    width cfg.map_mlp_width (PE: 8 heads, 4 D).
    [B, L', D] -> ([B, D], probe attention [B, N, 1, L'] or None).
    """

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.num_heads = cfg.map_num_heads
        self.head_dim = cfg.width // self.num_heads
        self.latent = nn.Parameter(torch.empty(1, 1, cfg.width, dtype=torch_dtype(cfg.param_dtype)))
        if not self.latent.is_meta:
            nn.init.trunc_normal_(self.latent, std=0.02)
        self.q = linear_layer(cfg, cfg.width, cfg.width)
        self.kv = linear_layer(cfg, cfg.width, 2 * cfg.width)
        self.proj = linear_layer(cfg, cfg.width, cfg.width)
        self.norm = norm_layer(cfg, cfg.width)
        self.mlp = Mlp(cfg, cfg.map_mlp_width)
        self.fused = cfg.attn_impl == "fused"

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: bool = False,
        masks: dict | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``masks`` {"mlp.drop1": [B, 1, F], "mlp.drop2": [B, 1, D]}: the MLP's dropout (parity mode);
        ``token_mask`` [B, L'] bool: the tokens the probe may attend to (NaFlex padding left out)."""
        b, l, d = x.shape
        nh, hd = self.num_heads, self.head_dim
        q = self.q(self.latent.to(x.dtype).expand(b, 1, d)).reshape(b, 1, nh, hd)
        kv = self.kv(x).reshape(b, l, 2, nh, hd)
        out, probs = _query_attention(q, kv, self.fused, return_attn, token_mask)
        x = self.proj(out.reshape(b, 1, d))
        x = x + self.mlp(self.norm(x), sub_masks(masks, "mlp"))
        return x[:, 0], probs


class ProbeHead(nn.Module):
    """Attention probe (pool='probe'; HF ``Aimv2AttentionPoolingHead``): a learned query ``latent`` [1, 1, D]
    used as is (no q projection) attends over the tokens through ``kv`` (bias as cfg.qkv_bias), then
    ``proj``; no norm, no MLP, no residual. [B, L', D] -> ([B, D], attention [B, N, 1, L'] or None)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.latent = nn.Parameter(torch.empty(1, 1, cfg.width, dtype=torch_dtype(cfg.param_dtype)))
        if not self.latent.is_meta:
            nn.init.trunc_normal_(self.latent, std=0.02)
        self.kv = linear_layer(cfg, cfg.width, 2 * cfg.width, bias=cfg.qkv_bias)
        self.proj = linear_layer(cfg, cfg.width, cfg.width)
        self.fused = cfg.attn_impl == "fused"

    def forward(
        self, x: torch.Tensor, *, return_attn: bool = False, token_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, l, d = x.shape
        nh, hd = self.num_heads, self.head_dim
        q = self.latent.to(x.dtype).expand(b, 1, d).reshape(b, 1, nh, hd)
        kv = self.kv(x).reshape(b, l, 2, nh, hd)
        out, probs = _query_attention(q, kv, self.fused, return_attn, token_mask)
        return self.proj(out.reshape(b, d)), probs


class PreLogits(nn.Module):
    """Dense + tanh before the head (original ViT ``pre_logits``, HF ``ViTModel`` pooler)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.fc = linear_layer(cfg, cfg.width, cfg.rep_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al. 2021) for images [B, C, H, W]; every option comes from ``cfg``.

    ``model(images)`` gives logits [B, K] ([B, L, K] with pool='none'; features when K=0; with
    head_dist the mean of both heads, in training too). ``forward_intermediates(images)`` gives
    (logits, dict of named tensors), attention and each head's logits included.
    Freshly built modules are in training mode (torch convention); call ``.eval()`` for inference.
    ``set_grad_checkpointing()`` recomputes each block in the backward pass (timm's name).
    """

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        self.grad_checkpointing = False
        pd = torch_dtype(cfg.param_dtype)
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.empty(1, 1, cfg.width, dtype=pd)) if cfg.class_token else None
        self.reg_token = nn.Parameter(torch.empty(1, cfg.reg_tokens, cfg.width, dtype=pd)) if cfg.reg_tokens else None
        self.pos_embed = (
            nn.Parameter(torch.empty(1, cfg.posemb_len, cfg.width, dtype=pd)) if cfg.posemb == "learn" else None
        )
        self.dist_token = nn.Parameter(torch.empty(1, 1, cfg.width, dtype=pd)) if cfg.dist_token else None
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.rope = RotaryEmbedding(cfg) if cfg.rope != "none" else None
        self.norm_pre = norm_layer(cfg, cfg.width) if cfg.norm_pre else None
        rates = np.linspace(0.0, cfg.drop_path, cfg.depth) if cfg.depth > 1 else [cfg.drop_path]
        self.blocks = nn.ModuleList([Block(cfg, float(r)) for r in rates])
        self.norm = norm_layer(cfg, cfg.width) if cfg.final_norm and not cfg.fc_norm else None
        pools = {"map": MAPHead, "probe": ProbeHead}
        self.attn_pool = pools[cfg.pool](cfg) if cfg.pool in pools else None
        self.fc_norm = norm_layer(cfg, cfg.width) if cfg.fc_norm else None
        self.pre_logits = PreLogits(cfg) if cfg.rep_size else None
        self.head_drop = nn.Dropout(cfg.dropout)
        k, bias = cfg.num_classes, cfg.head_bias
        self.head = linear_layer(cfg, cfg.features_dim, k, bias) if k else None
        self.head_dist = linear_layer(cfg, cfg.features_dim, k, bias) if k and cfg.head_dist else None
        if self.dist_token is not None and not self.dist_token.is_meta:
            nn.init.trunc_normal_(self.dist_token, std=0.02)  # timm VisionTransformerDistilled
        for p in (self.cls_token, self.reg_token):
            if p is not None and not p.is_meta:
                nn.init.normal_(p, std=1e-6)
        if self.pos_embed is not None and not self.pos_embed.is_meta:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def no_weight_decay(self) -> frozenset[str]:
        """Canonical names exempt from weight decay besides rank <= 1 tensors: timm's
        ``VisionTransformer.no_weight_decay`` (``timm/models/vision_transformer.py``). Which tensors a run
        decays is its recipe's choice (``vit_common.training.recipes.decays``)."""
        return frozenset({"pos_embed", "cls_token", "reg_token", "dist_token", "rope.freqs"})

    def _embed(self, x: torch.Tensor, weights=None) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int] | None]:
        """Images [B, C, H, W] -> (patch tokens [B, h*w, D], tokens with prefix and posemb [B, L, D], (h, w));
        with ``weights`` [B, N, Gh*Gw] (``vit_common.naflex.position_weights``) NaFlex patches [B, N, P*P*C]
        -> (patch tokens [B, N, D], tokens [B, L, D], None), the position table resized to each image's grid."""
        cfg = self.cfg
        cd = torch_dtype(cfg.dtype)
        b = x.shape[0]
        x = condition_input(cfg, x, weights is not None).to(cd)
        if weights is not None:
            gh, gw = None, None
            patches = self.patch_embed.embed_flat(x)  # [B, N, D]
        else:
            if x.ndim != 4 or x.shape[1] != cfg.in_chans:
                raise ValueError(
                    f"images of shape {tuple(x.shape)}: expected [B, C={cfg.in_chans}, H, W] (channels first)"
                )
            gh, gw = cfg.grid_for(x.shape[2:4])  # raises ValueError on a size the config does not allow
            ph, pw = cfg.patch_size
            if cfg.dynamic_img_pad:  # zero-pad bottom/right to a multiple of the patch, as timm
                x = F.pad(x, (0, gw * pw - x.shape[3], 0, gh * ph - x.shape[2]))
            patches = self.patch_embed(x).flatten(2).transpose(1, 2)  # [B, D, h, w] -> [B, h*w, D]
        if self.patch_embed.norm is not None:
            patches = self.patch_embed.norm(patches)
        tokens = (self.cls_token, self.dist_token, self.reg_token)
        prefix = [p.to(cd).expand(b, -1, -1) for p in tokens if p is not None]
        npt = cfg.num_prefix_tokens
        if cfg.posemb == "learn":
            pe = self.pos_embed.to(cd)
            pe_prefix, pe_grid = (pe[:, :npt], pe[:, npt:]) if cfg.posemb_prefix else (None, pe)
            if weights is not None:  # NaFlex: each image's own grid, padding rows zero
                pe_grid = torch.einsum("bng,gd->bnd", torch.as_tensor(weights, dtype=cd, device=x.device), pe_grid[0])
                pe_prefix = None if pe_prefix is None else pe_prefix.expand(b, -1, -1)
            elif (gh, gw) != cfg.grid:  # dynamic image size: the same matrices as vit_common.posemb
                wh, ww = (
                    torch.as_tensor(m, dtype=cd, device=x.device)
                    for m in resample_matrices(cfg.grid, (gh, gw), cfg.posemb_resample)
                )
                grid = pe_grid.reshape(*cfg.grid, cfg.width)  # [h0, w0, D]
                pe_grid = torch.einsum("yh,hwd,xw->yxd", wh, grid, ww).reshape(1, gh * gw, cfg.width)
        elif cfg.posemb in SINCOS_CONVENTIONS:
            table = sincos2d((gh, gw), cfg.width, convention=SINCOS_CONVENTIONS[cfg.posemb])[None]
            pe_prefix, pe_grid = None, torch.as_tensor(table, dtype=cd, device=x.device)
        else:
            pe_prefix, pe_grid = None, None
        if pe_prefix is not None:  # timm default / original ViT: concatenate, then add
            tokens = torch.cat(prefix + [patches], dim=1) + torch.cat([pe_prefix, pe_grid], dim=1)
        else:  # no_embed_class / big_vision: add to patches, then concatenate
            tokens = torch.cat(prefix + [patches + pe_grid if pe_grid is not None else patches], dim=1)
        return patches, tokens, None if gh is None else (gh, gw)

    def _forward(
        self,
        x: torch.Tensor,
        out: dict | None,
        drop_masks: torch.Tensor | None = None,
        dropout_masks: dict | None = None,
        patch_mask=None,
        spatial_shapes=None,
        position_weights=None,
    ) -> torch.Tensor:
        """The one forward pass; records named intermediates into ``out`` when it is a dict; ``drop_masks``
        [B, depth, 2] the blocks' drop-path masks, ``dropout_masks`` the dropout masks, ``patch_mask``,
        ``spatial_shapes`` and ``position_weights`` a NaFlex batch's (``forward``)."""
        cfg = self.cfg
        record = out is not None
        token_mask, weights, naflex = None, None, (patch_mask, spatial_shapes, position_weights)
        if any(t is not None for t in naflex):  # NaFlex
            host = [t.cpu().numpy() if isinstance(t, torch.Tensor) else t for t in naflex]
            token_mask, weights = naflex_inputs(cfg, tuple(x.shape), *host)
            token_mask = torch.as_tensor(token_mask, device=x.device)  # [B, L]
        patches, x, grid = self._embed(x, weights)
        rope = self.rope(grid, x.device) if self.rope is not None else None  # (sin, cos), once per forward
        x = masked_drop(self.pos_drop, x, dropout_masks, "pos_drop")
        if record:
            out["patch_embed"], out["pos_embed"] = patches, x
        if self.norm_pre is not None:
            x = self.norm_pre(x)
            if record:
                out["norm_pre"] = x
        for i, block in enumerate(self.blocks):
            mask = None if drop_masks is None else drop_masks[:, i]
            sub = sub_masks(dropout_masks, f"blocks.{i}")
            tab = None if rope is None else (rope[0][i], rope[1][i]) if self.cfg.rope == "mixed" else rope
            if self.grad_checkpointing and not record and torch.is_grad_enabled():  # recomputed in backward
                x, probs = checkpoint(
                    block, x, drop_mask=mask, masks=sub, rope=tab, token_mask=token_mask, use_reentrant=False
                )
            else:
                x, probs = block(x, return_attn=record, drop_mask=mask, masks=sub, rope=tab, token_mask=token_mask)
            if record:
                out[f"block{i:02d}"], out[f"attn{i:02d}"] = x, probs
        if self.norm is not None:
            x = self.norm(x)
        if record:
            out["norm"] = x
        x_dist = x[:, 1] if cfg.head_dist else None  # DeiT: the distillation token's own head
        pooled = x if cfg.pool_include_prefix else x[:, cfg.num_prefix_tokens :]  # [B, L', D]
        keep = None  # NaFlex: the pooled tokens that are not padding, [B, L'] bool
        if token_mask is not None:
            keep = token_mask if cfg.pool_include_prefix else token_mask[:, cfg.num_prefix_tokens :]
        if cfg.pool == "token":
            x = x[:, 0]
        elif cfg.pool == "gap":
            x = masked_mean(pooled, keep)
        elif cfg.pool == "max":
            x = masked_max(pooled, keep)
        elif cfg.pool == "avgmax":
            x = 0.5 * (masked_max(pooled, keep) + masked_mean(pooled, keep))
        elif cfg.pool == "token_gap":  # HF Dinov2ForImageClassification: [class token, mean of patches]
            x = torch.cat([x[:, 0], masked_mean(pooled, keep)], dim=-1)
        elif cfg.pool == "summary":  # RADIO: the chosen prefix tokens, concatenated
            x = x[:, list(cfg.summary_idxs)].flatten(1)
        elif cfg.pool == "map":
            map_masks = sub_masks(dropout_masks, "attn_pool")
            x, probs = self.attn_pool(pooled, return_attn=record, masks=map_masks, token_mask=keep)
            if record:
                out["attn_pool"] = probs
        elif cfg.pool == "probe":
            x, probs = self.attn_pool(pooled, return_attn=record, token_mask=keep)
            if record:
                out["attn_pool"] = probs
        if self.fc_norm is not None:
            x = self.fc_norm(x)
        if self.pre_logits is not None:
            x = self.pre_logits(x)
        if record:
            out["pre_logits"] = x
        x = masked_drop(self.head_drop, x, dropout_masks, "head_drop")
        if self.head is not None:
            x = self.head(x)
        if x_dist is not None:
            if record:
                out["pre_logits_dist"] = x_dist
            x_dist = masked_drop(self.head_drop, x_dist, dropout_masks, "head_drop_dist")
            if self.head_dist is not None:
                x_dist = self.head_dist(x_dist)
                if record:
                    out["head"], out["head_dist"] = x, x_dist
            x = (x + x_dist) / 2  # timm VisionTransformerDistilled.forward_head in eval mode
        if record:
            out["logits"] = x
        return x

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass instead of keeping its activations
        (``torch.utils.checkpoint``, non-reentrant, RNG state preserved; timm's
        ``set_grad_checkpointing``): the same values and gradients for less memory. Only while
        gradients are recorded; ``forward_intermediates`` is never recomputed."""
        self.grad_checkpointing = bool(enable)

    def forward(
        self,
        images: torch.Tensor,
        *,
        patch_mask=None,
        spatial_shapes=None,
        position_weights=None,
        drop_masks: torch.Tensor | None = None,
        dropout_masks: dict | None = None,
    ) -> torch.Tensor:
        """Images [B, C, H, W] -> logits [B, K] (features [B, D'] when num_classes=0).

        NaFlex (``vit_common.naflex``): with ``spatial_shapes`` [B, 2] and ``patch_mask`` [B, N] (tensors or
        numpy; read on the host), ``images`` are flattened patches [B, N, P*P*C] of images of different
        sizes; the position table is resized to each image's grid with cfg.posemb_resample and padding
        patches reach no attention and no pooling. A bad batch raises ValueError (``check_batch``).
        Or ``position_weights`` [B, N, Gh*Gw] instead of ``spatial_shapes`` (``vit_common.naflex.naflex_inputs``).

        ``drop_masks`` float [B, depth, 2] (1 keep, 0 drop): in training, block i's two drop-path
        branches take rows [:, i, 0] and [:, i, 1] instead of drawing their own, so that both twins drop
        the same samples (the parity mode of twin training); ignored where drop_path is 0 or in eval.
        ``dropout_masks`` {module path: keep mask of that dropout's input shape} does the same for
        dropout and attention dropout (paths as ``vit_compare.training.dropout_masks`` names them:
        "pos_drop", "blocks.{i}.attn.attn_drop", ..., "head_drop"); every live dropout needs its mask
        (KeyError otherwise); ignored in eval.
        """
        return self._forward(images, None, drop_masks, dropout_masks, patch_mask, spatial_shapes, position_weights)

    def forward_intermediates(
        self, images: torch.Tensor, *, patch_mask=None, spatial_shapes=None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Logits and every named intermediate; attention always takes the explicit path. NaFlex input as
        ``forward``; then the token axes are N long, padding included.

        Keys: 'patch_embed' [B, h*w, D], 'pos_embed' [B, L, D], 'norm_pre' (norm_pre only; the block
        input) [B, L, D], 'blockNN' [B, L, D], 'attnNN' [B, N, L, L] (rows sum to 1), 'norm' [B, L, D],
        'attn_pool' [B, N, 1, L'] (MAP and probe only; L' = L, or the patches without pool_include_prefix),
        'pre_logits' [B, D'] (D' = cfg.features_dim), with head_dist also 'pre_logits_dist' [B, D] and, with a
        head, 'head' and 'head_dist' [B, K] (each head's logits), 'logits' [B, K]. The same keys as the JAX twin.
        """
        out: dict[str, torch.Tensor] = {}
        logits = self._forward(images, out, patch_mask=patch_mask, spatial_shapes=spatial_shapes)
        return logits, out
