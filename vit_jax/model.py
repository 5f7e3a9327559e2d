"""Vision Transformer in Flax NNX; module paths are timm's so weights convert by leaf kind.

Images are [B, H, W, C] (channels last). Shape alphabet: B batch, H/W pixels, C channels, P patch,
L tokens, D width, N heads, K classes, F MLP width. The PyTorch twin is ``vit_torch/model.py``: same
classes, same forward order, same intermediates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_common.config import ViTConfig
from vit_common.naflex import check_weights, naflex_inputs
from vit_common.posemb import SINCOS_CONVENTIONS, resample_matrices, sincos2d
from vit_jax.layers import (
    DropPath,
    LayerScale,
    acc_dtype,
    condition_input,
    dropout_layer,
    dtypes,
    linear_layer,
    masked_drop,
    masked_max,
    masked_mean,
    norm_layer,
    sub_masks,
    trunc02,
)
from vit_jax.platforms import Platform, choose_attention, dot_product_attention, gelu
from vit_jax.rope import RotaryEmbedding, apply_rope


class PatchEmbed(nnx.Module):
    """Stride-P convolution with VALID padding, bias if cfg.patch_bias: [B, H, W, C] -> [B, H/P, W/P, D].

    ``norm`` (cfg.patch_norm) is applied by the model to the flattened tokens [B, h*w, D], as timm's;
    ``embed_flat`` applies the same kernel to NaFlex patches."""

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.proj = nnx.Conv(
            cfg.in_chans,
            cfg.width,
            kernel_size=cfg.patch_size,
            strides=cfg.patch_size,
            padding="VALID",
            use_bias=cfg.patch_bias,
            kernel_init=nnx.initializers.lecun_normal(),
            rngs=rngs,
            **dtypes(cfg),
        )
        self.norm = norm_layer(cfg, cfg.width, rngs) if cfg.patch_norm else None

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.proj(x)

    def embed_flat(self, x: jax.Array) -> jax.Array:
        """NaFlex patches [B, N, P*P*C], each flattened (P, P, C) -> [B, N, D]: the convolution as one
        linear map (its HWIO kernel flattened to [P*P*C, D]; transformers Siglip2's ``patch_embedding``)."""
        kernel = self.proj.kernel[...].astype(x.dtype)
        y = x @ kernel.reshape(-1, kernel.shape[-1])
        return y if self.proj.bias is None else y + self.proj.bias[...].astype(x.dtype)


def _attend(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, drop=None, token_mask: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """Softmax attention written out: q [B, L, N, D/N], k and v [B, M, N, D/N] ->
    (out [B, L, N, D/N] in q's dtype, probabilities [B, N, L, M] in at least float32); ``token_mask``
    [B, M] bool: keys where it is False get probability 0 (NaFlex padding).

    Heads move in front of the tokens first: XLA on CPU runs the two matmuls over [B, N, L, D/N]
    ~2.7x faster than einsums over [B, L, N, D/N]. q is scaled before the product (timm's non-fused
    ``Attention`` does the same): on CPU the forward and backward of attention for S/16 then took
    0.65x the time of scaling the [B, N, L, M] logits. ``drop`` (attention dropout) applies to the
    probabilities used for ``out``, not to the ones returned.
    """
    acc = acc_dtype(q.dtype)
    qh, kh, vh = (t.astype(acc).transpose(0, 2, 1, 3) for t in (q, k, v))  # [B, N, L|M, D/N]
    logits = jnp.einsum("bnlh,bnmh->bnlm", qh * scale, kh)
    if token_mask is not None:
        logits = jnp.where(token_mask[:, None, None, :], logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bnlm,bnmh->bnlh", probs if drop is None else drop(probs), vh)
    return out.transpose(0, 2, 1, 3).astype(q.dtype), probs


def _attention_kernel(cfg: ViTConfig) -> str:
    """The kernel of the fused path on this platform ('explicit', 'xla' or 'cudnn'; see
    ``vit_jax.platforms.choose_attention``); attn_impl='explicit' always writes the softmax out."""
    if cfg.attn_impl == "explicit":
        return "explicit"
    return choose_attention(Platform.current(), dtype=cfg.dtype, head_dim=cfg.head_dim, backend=cfg.attn_backend)


class Attention(nnx.Module):
    """Multi-head self-attention with a fused qkv projection (rows [q; k; v], head-major).

    Two paths: fused (the platform's fastest kernel, ``self.kernel``, chosen when the model is
    built: cuDNN flash attention on NVIDIA GPUs, XLA's ``jax.nn.dot_product_attention``, or on CPU
    ``_attend``) and explicit (logits and softmax written out, ``_attend``), which alone returns
    probabilities. Both compute logits and softmax in at least float32.
    Without a key bias (cfg.k_bias False) the q and v biases are ``q_bias`` and ``v_bias`` (timm
    ``EvaAttention``); with RoPE the patch tokens of q and k are rotated after qk_norm; ``norm``
    (cfg.attn_inner_norm) normalises the heads' output before ``proj`` (timm ``scale_attn_inner``).
    """

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.num_prefix_tokens, self.rope_layout = cfg.num_prefix_tokens, cfg.rope_layout
        self.kernel = _attention_kernel(cfg)
        self.qkv = linear_layer(cfg, cfg.width, 3 * cfg.width, rngs, bias=cfg.qkv_bias and cfg.k_bias)
        qv_bias, pd = cfg.qkv_bias and not cfg.k_bias, jnp.dtype(cfg.param_dtype)
        self.q_bias = nnx.Param(jnp.zeros((cfg.width,), pd)) if qv_bias else None
        self.v_bias = nnx.Param(jnp.zeros((cfg.width,), pd)) if qv_bias else None
        self.q_norm = norm_layer(cfg, cfg.head_dim, rngs) if cfg.qk_norm else None
        self.k_norm = norm_layer(cfg, cfg.head_dim, rngs) if cfg.qk_norm else None
        self.attn_drop = dropout_layer(cfg.attn_dropout, rngs)
        self.norm = norm_layer(cfg, cfg.width, rngs) if cfg.attn_inner_norm else None
        self.proj = linear_layer(cfg, cfg.width, cfg.width, rngs, bias=cfg.proj_bias)
        self.proj_drop = dropout_layer(cfg.dropout, rngs)

    def __call__(
        self,
        x: jax.Array,
        *,
        return_attn: bool = False,
        masks: dict | None = None,
        rope: tuple[jax.Array, jax.Array] | None = None,
        token_mask: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        """x [B, L, D] -> ([B, L, D], probabilities [B, N, L, L] if ``return_attn`` else None); ``masks``
        {"attn_drop": [B, N, L, L], "proj_drop": [B, L, D]} the parity mode's dropout keep masks;
        ``rope`` (sin, cos) [Np, hd] or [N, Np, hd] (``RotaryEmbedding``); ``token_mask`` [B, L] bool, the
        real tokens first (NaFlex: ``vit_common.naflex.check_batch``): no token attends to the others.

        ``return_attn=True`` takes the explicit path; so does training with attention dropout, which
        the fused kernels do not implement.
        """
        b, l, d = x.shape
        qkv = self.qkv(x)  # [B, L, 3D]
        if self.q_bias is not None:
            q_bias = self.q_bias[...]
            qkv = qkv + jnp.concatenate([q_bias, jnp.zeros_like(q_bias), self.v_bias[...]]).astype(qkv.dtype)
        qkv = qkv.reshape(b, l, 3, self.num_heads, self.head_dim)  # [B, L, 3, N, D/N]
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each [B, L, N, D/N]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = (apply_rope(t, *rope, self.num_prefix_tokens, self.rope_layout) for t in (q, k))
        scale = self.head_dim**-0.5
        live_drop = self.attn_drop.rate > 0 and not self.attn_drop.deterministic
        kernel = "explicit" if return_attn or live_drop else self.kernel
        if kernel == "explicit":
            drop = lambda p: masked_drop(self.attn_drop, p, masks, "attn_drop")  # noqa: E731
            out, probs = _attend(q, k, v, scale, drop, token_mask)
        else:
            out = dot_product_attention(q, k, v, scale=scale, implementation=kernel, token_mask=token_mask)
            probs = None
        out = out.reshape(b, l, d)
        if self.norm is not None:
            out = self.norm(out)
        x = masked_drop(self.proj_drop, self.proj(out), masks, "proj_drop")  # [B, L, D]
        return x, probs if return_attn else None


def quick_gelu(x: jax.Array) -> jax.Array:
    """x sigmoid(1.702 x): OpenAI CLIP's QuickGELU (timm ``QuickGELU``, HF ``quick_gelu``)."""
    return x * jax.nn.sigmoid(1.702 * x)


class Mlp(nnx.Module):
    """fc1 -> GELU (cfg.gelu: 'exact' erf, 'tanh' or 'quick') -> dropout -> (norm) -> fc2 -> dropout.

    ``hidden`` F (default cfg.mlp_dim); ``norm`` over F when ``inner_norm`` (timm ``scale_mlp``); ``bias`` on
    both layers (a block's: cfg.mlp_bias; the MAP head's always)."""

    def __init__(
        self, cfg: ViTConfig, hidden: int | None = None, inner_norm: bool = False, bias: bool = True, *, rngs: nnx.Rngs
    ):
        f = hidden or cfg.mlp_dim
        self.quick = cfg.gelu == "quick"
        self.approximate = cfg.gelu == "tanh"
        self.fc1 = linear_layer(cfg, cfg.width, f, rngs, bias)
        self.drop1 = dropout_layer(cfg.dropout, rngs)
        self.norm = norm_layer(cfg, f, rngs) if inner_norm else None
        self.fc2 = linear_layer(cfg, f, cfg.width, rngs, bias)
        self.drop2 = dropout_layer(cfg.dropout, rngs)

    def __call__(self, x: jax.Array, masks: dict | None = None) -> jax.Array:
        """x [..., D] -> [..., D]; ``masks`` {"drop1": [..., F], "drop2": [..., D]} (parity mode)."""
        h = self.fc1(x)
        h = masked_drop(self.drop1, quick_gelu(h) if self.quick else gelu(h, self.approximate), masks, "drop1")
        return masked_drop(self.drop2, self.fc2(h if self.norm is None else self.norm(h)), masks, "drop2")


class GluMlp(nnx.Module):
    """Gated MLP (mlp_type='swiglu'): fc1 [D, 2F] -> [g; v] -> silu(g) * v -> dropout -> fc2 -> dropout.

    The gate's columns come first in fc1 (timm ``SwiGLUPacked`` = ``GluMlp(act_layer=SiLU,
    gate_last=False)``; HF ``Dinov2SwiGLUFFN`` computes the same with ``gate_proj`` and ``up_proj``).
    """

    def __init__(self, cfg: ViTConfig, inner_norm: bool = False, *, rngs: nnx.Rngs):
        self.fc1 = linear_layer(cfg, cfg.width, 2 * cfg.mlp_dim, rngs, cfg.mlp_bias)
        self.drop1 = dropout_layer(cfg.dropout, rngs)
        self.norm = norm_layer(cfg, cfg.mlp_dim, rngs) if inner_norm else None  # timm SwiGLU scale_mlp
        self.fc2 = linear_layer(cfg, cfg.mlp_dim, cfg.width, rngs, cfg.mlp_bias)
        self.drop2 = dropout_layer(cfg.dropout, rngs)

    def __call__(self, x: jax.Array, masks: dict | None = None) -> jax.Array:
        """x [..., D] -> [..., D]; ``masks`` {"drop1": [..., F], "drop2": [..., D]} (parity mode)."""
        gate, value = jnp.split(self.fc1(x), 2, axis=-1)  # each [..., F]
        h = masked_drop(self.drop1, jax.nn.silu(gate) * value, masks, "drop1")
        return masked_drop(self.drop2, self.fc2(h if self.norm is None else self.norm(h)), masks, "drop2")


class Block(nnx.Module):
    """Pre-norm transformer block: x + drop_path(ls1(attn(norm1(x)))), then the same for the MLP."""

    def __init__(self, cfg: ViTConfig, drop_path: float, *, rngs: nnx.Rngs):
        self.norm1 = norm_layer(cfg, cfg.width, rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.ls1 = LayerScale(cfg) if cfg.layer_scale is not None else None
        self.drop_path1 = DropPath(drop_path, rngs=rngs)
        self.norm2 = norm_layer(cfg, cfg.width, rngs)
        inner, bias = cfg.mlp_inner_norm, cfg.mlp_bias
        glu = cfg.mlp_type == "swiglu"
        self.mlp = GluMlp(cfg, inner, rngs=rngs) if glu else Mlp(cfg, inner_norm=inner, bias=bias, rngs=rngs)
        self.ls2 = LayerScale(cfg) if cfg.layer_scale is not None else None
        self.drop_path2 = DropPath(drop_path, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,
        *,
        return_attn: bool = False,
        drop_mask: jax.Array | None = None,
        masks: dict | None = None,
        rope: tuple[jax.Array, jax.Array] | None = None,
        token_mask: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
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
    q: jax.Array, kv: jax.Array, kernel: str, return_attn: bool, token_mask: jax.Array | None = None
) -> tuple[jax.Array, jax.Array | None]:
    """A pooling head's attention: queries q [B, 1, N, D/N] over kv [B, L, 2, N, D/N] (keys, values), scale
    (D/N)^-0.5 -> (out [B, 1, N, D/N], probabilities [B, N, 1, L] with ``return_attn``, else None);
    ``token_mask`` [B, L] bool, the real tokens first: the others get no weight."""
    k, v = kv[:, :, 0], kv[:, :, 1]
    scale = q.shape[-1] ** -0.5
    if return_attn or kernel == "explicit":
        out, probs = _attend(q, k, v, scale, token_mask=token_mask)
        return out, probs if return_attn else None
    return dot_product_attention(q, k, v, scale=scale, implementation=kernel, token_mask=token_mask), None


class MAPHead(nnx.Module):
    """Multihead attention pooling (big_vision ``MAPHead``, timm ``AttentionPoolLatent``).

    A learned probe ``latent`` [1, 1, D] attends over the tokens it is given (the patch tokens, or all of
    them with cfg.pool_include_prefix, as timm); then x + mlp(norm(x)). Heads cfg.map_num_heads, MLP
    width cfg.map_mlp_width (PE: 8 heads, 4 D).
    [B, L', D] -> ([B, D], probe attention [B, N, 1, L'] or None).
    """

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.num_heads = cfg.map_num_heads
        self.head_dim = cfg.width // self.num_heads
        pd = jnp.dtype(cfg.param_dtype)
        self.latent = nnx.Param(trunc02(rngs.params(), (1, 1, cfg.width), pd))
        self.q = linear_layer(cfg, cfg.width, cfg.width, rngs)
        self.kv = linear_layer(cfg, cfg.width, 2 * cfg.width, rngs)
        self.proj = linear_layer(cfg, cfg.width, cfg.width, rngs)
        self.norm = norm_layer(cfg, cfg.width, rngs)
        self.mlp = Mlp(cfg, cfg.map_mlp_width, rngs=rngs)
        self.kernel = _attention_kernel(cfg)

    def __call__(
        self, x: jax.Array, *, return_attn: bool = False, masks: dict | None = None, token_mask: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array | None]:
        """``masks`` {"mlp.drop1": [B, 1, F], "mlp.drop2": [B, 1, D]}: the MLP's dropout (parity mode);
        ``token_mask`` [B, L'] bool: the tokens the probe may attend to (NaFlex padding left out)."""
        b, l, d = x.shape
        nh, hd = self.num_heads, self.head_dim
        q = self.q(jnp.broadcast_to(self.latent[...].astype(x.dtype), (b, 1, d))).reshape(b, 1, nh, hd)
        kv = self.kv(x).reshape(b, l, 2, nh, hd)
        out, probs = _query_attention(q, kv, self.kernel, return_attn, token_mask)
        x = self.proj(out.reshape(b, 1, d))
        x = x + self.mlp(self.norm(x), sub_masks(masks, "mlp"))
        return x[:, 0], probs


class ProbeHead(nnx.Module):
    """Attention probe (pool='probe'; HF ``Aimv2AttentionPoolingHead``): a learned query ``latent`` [1, 1, D]
    used as is (no q projection) attends over the tokens through ``kv`` (bias as cfg.qkv_bias), then
    ``proj``; no norm, no MLP, no residual. [B, L', D] -> ([B, D], attention [B, N, 1, L'] or None)."""

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.latent = nnx.Param(trunc02(rngs.params(), (1, 1, cfg.width), jnp.dtype(cfg.param_dtype)))
        self.kv = linear_layer(cfg, cfg.width, 2 * cfg.width, rngs, bias=cfg.qkv_bias)
        self.proj = linear_layer(cfg, cfg.width, cfg.width, rngs)
        self.kernel = _attention_kernel(cfg)

    def __call__(
        self, x: jax.Array, *, return_attn: bool = False, token_mask: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array | None]:
        b, l, d = x.shape
        nh, hd = self.num_heads, self.head_dim
        q = jnp.broadcast_to(self.latent[...].astype(x.dtype), (b, 1, d)).reshape(b, 1, nh, hd)
        kv = self.kv(x).reshape(b, l, 2, nh, hd)
        out, probs = _query_attention(q, kv, self.kernel, return_attn, token_mask)
        return self.proj(out.reshape(b, d)), probs


class PreLogits(nnx.Module):
    """Dense + tanh before the head (original ViT ``pre_logits``, HF ``ViTModel`` pooler)."""

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.fc = linear_layer(cfg, cfg.width, cfg.rep_size, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.fc(x))


class VisionTransformer(nnx.Module):
    """ViT (Dosovitskiy et al. 2021) for images [B, H, W, C]; every option comes from ``cfg``.

    ``model(images)`` gives logits [B, K] ([B, L, K] with pool='none'; features when K=0; with
    head_dist the mean of both heads, in training too). ``forward_intermediates(images)`` gives
    (logits, dict of named tensors), attention and each head's logits included.
    Freshly built modules are in training mode (NNX convention); call ``.eval()`` for inference.
    ``set_grad_checkpointing()`` recomputes each block in the backward pass (timm's name).
    """

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.platform = Platform.current()  # how XLA computes it here: vit_jax/platforms.py
        self.grad_checkpointing = False
        pd = jnp.dtype(cfg.param_dtype)
        self.patch_embed = PatchEmbed(cfg, rngs=rngs)
        self.cls_token = (
            nnx.Param(1e-6 * jax.random.normal(rngs.params(), (1, 1, cfg.width), pd)) if cfg.class_token else None
        )
        self.reg_token = (
            nnx.Param(1e-6 * jax.random.normal(rngs.params(), (1, cfg.reg_tokens, cfg.width), pd))
            if cfg.reg_tokens
            else None
        )
        self.pos_embed = (
            nnx.Param(trunc02(rngs.params(), (1, cfg.posemb_len, cfg.width), pd)) if cfg.posemb == "learn" else None
        )
        self.dist_token = nnx.Param(trunc02(rngs.params(), (1, 1, cfg.width), pd)) if cfg.dist_token else None
        self.pos_drop = dropout_layer(cfg.dropout, rngs)
        self.rope = RotaryEmbedding(cfg) if cfg.rope != "none" else None
        self.norm_pre = norm_layer(cfg, cfg.width, rngs) if cfg.norm_pre else None
        rates = np.linspace(0.0, cfg.drop_path, cfg.depth) if cfg.depth > 1 else [cfg.drop_path]
        self.blocks = nnx.List([Block(cfg, float(r), rngs=rngs) for r in rates])
        self.norm = norm_layer(cfg, cfg.width, rngs) if cfg.final_norm and not cfg.fc_norm else None
        pools = {"map": MAPHead, "probe": ProbeHead}
        self.attn_pool = pools[cfg.pool](cfg, rngs=rngs) if cfg.pool in pools else None
        self.fc_norm = norm_layer(cfg, cfg.width, rngs) if cfg.fc_norm else None
        self.pre_logits = PreLogits(cfg, rngs=rngs) if cfg.rep_size else None
        self.head_drop = dropout_layer(cfg.dropout, rngs)
        k, bias = cfg.num_classes, cfg.head_bias
        self.head = linear_layer(cfg, cfg.features_dim, k, rngs, bias) if k else None
        self.head_dist = linear_layer(cfg, cfg.features_dim, k, rngs, bias) if k and cfg.head_dist else None

    def no_weight_decay(self) -> frozenset[str]:
        """Canonical names exempt from weight decay besides rank <= 1 tensors: timm's
        ``VisionTransformer.no_weight_decay`` (``timm/models/vision_transformer.py``). Which tensors a run
        decays is its recipe's choice (``vit_common.training.recipes.decays``)."""
        return frozenset({"pos_embed", "cls_token", "reg_token", "dist_token", "rope.freqs"})

    def _embed(self, x: jax.Array, weights=None) -> tuple[jax.Array, jax.Array, tuple[int, int] | None]:
        """Images [B, H, W, C] -> (patch tokens [B, h*w, D], tokens with prefix and posemb [B, L, D], (h, w));
        with ``weights`` [B, N, Gh*Gw] (``vit_common.naflex.position_weights``) NaFlex patches [B, N, P*P*C]
        -> (patch tokens [B, N, D], tokens [B, L, D], None), the position table resized to each image's grid."""
        cfg = self.cfg
        b = x.shape[0]
        x = condition_input(cfg, x, weights is not None).astype(cfg.dtype)
        if weights is not None:
            gh, gw = None, None
            patches = self.patch_embed.embed_flat(x)  # [B, N, D]
        else:
            if x.ndim != 4 or x.shape[-1] != cfg.in_chans:
                raise ValueError(f"images of shape {x.shape}: expected [B, H, W, C={cfg.in_chans}] (channels last)")
            gh, gw = cfg.grid_for(x.shape[1:3])  # raises ValueError on a size the config does not allow
            ph, pw = cfg.patch_size
            if cfg.dynamic_img_pad:  # zero-pad bottom/right to a multiple of the patch, as timm
                x = jnp.pad(x, ((0, 0), (0, gh * ph - x.shape[1]), (0, gw * pw - x.shape[2]), (0, 0)))
            patches = self.patch_embed(x).reshape(b, gh * gw, cfg.width)  # [B, h, w, D] -> [B, h*w, D]
        if self.patch_embed.norm is not None:
            patches = self.patch_embed.norm(patches)
        tokens = (self.cls_token, self.dist_token, self.reg_token)
        prefix = [p[...].astype(cfg.dtype) for p in tokens if p is not None]
        prefix = [jnp.broadcast_to(p, (b,) + p.shape[1:]) for p in prefix]
        npt = cfg.num_prefix_tokens
        if cfg.posemb == "learn":
            pe = self.pos_embed[...].astype(cfg.dtype)
            pe_prefix, pe_grid = (pe[:, :npt], pe[:, npt:]) if cfg.posemb_prefix else (None, pe)
            if weights is not None:  # NaFlex: each image's own grid, padding rows zero
                pe_grid = jnp.einsum("bng,gd->bnd", jnp.asarray(weights, cfg.dtype), pe_grid[0])  # [B, N, D]
                pe_prefix = None if pe_prefix is None else jnp.broadcast_to(pe_prefix, (b,) + pe_prefix.shape[1:])
            elif (gh, gw) != cfg.grid:  # dynamic image size: the same matrices as vit_common.posemb
                wh, ww = (jnp.asarray(m, cfg.dtype) for m in resample_matrices(cfg.grid, (gh, gw), cfg.posemb_resample))
                grid = pe_grid.reshape(*cfg.grid, cfg.width)  # [h0, w0, D]
                pe_grid = jnp.einsum("yh,hwd,xw->yxd", wh, grid, ww).reshape(1, gh * gw, cfg.width)
        elif cfg.posemb in SINCOS_CONVENTIONS:
            table = sincos2d((gh, gw), cfg.width, convention=SINCOS_CONVENTIONS[cfg.posemb])
            pe_prefix, pe_grid = None, jnp.asarray(table[None], cfg.dtype)
        else:
            pe_prefix, pe_grid = None, None
        if pe_prefix is not None:  # timm default / original ViT: concatenate, then add
            tokens = jnp.concatenate(prefix + [patches], axis=1) + jnp.concatenate([pe_prefix, pe_grid], 1)
        else:  # no_embed_class / big_vision: add to patches, then concatenate
            tokens = jnp.concatenate(prefix + [patches + pe_grid if pe_grid is not None else patches], 1)
        return patches, tokens, None if gh is None else (gh, gw)

    def _forward(
        self,
        x: jax.Array,
        out: dict | None,
        drop_masks: jax.Array | None = None,
        dropout_masks: dict | None = None,
        patch_mask=None,
        spatial_shapes=None,
        position_weights=None,
    ) -> jax.Array:
        """The one forward pass; records named intermediates into ``out`` when it is a dict; ``drop_masks``
        [B, depth, 2] the blocks' drop-path masks, ``dropout_masks`` the dropout masks, ``patch_mask``,
        ``spatial_shapes`` and ``position_weights`` a NaFlex batch's (``__call__``)."""
        cfg = self.cfg
        record = out is not None
        token_mask = weights = None
        if position_weights is not None:  # NaFlex, arrays that may be traced: checked by their shapes
            check_weights(cfg, x.shape, patch_mask, spatial_shapes, position_weights)
            prefix = jnp.ones((x.shape[0], cfg.num_prefix_tokens), bool)
            token_mask = jnp.concatenate([prefix, jnp.asarray(patch_mask).astype(bool)], axis=1)  # [B, L]
            weights = position_weights
        elif spatial_shapes is not None or patch_mask is not None:  # NaFlex from host arrays
            token_mask, weights = naflex_inputs(cfg, x.shape, patch_mask, spatial_shapes)
            token_mask = jnp.asarray(token_mask)  # [B, L]
        patches, x, grid = self._embed(x, weights)
        rope = self.rope(grid) if self.rope is not None else None  # (sin, cos), once per forward
        x = masked_drop(self.pos_drop, x, dropout_masks, "pos_drop")
        if record:
            out["patch_embed"], out["pos_embed"] = patches, x
        if self.norm_pre is not None:
            x = self.norm_pre(x)
            if record:
                out["norm_pre"] = x
        for i, block in enumerate(self.blocks):
            x = self.platform.residual(x)  # identity but on CPU
            mask = None if drop_masks is None else drop_masks[:, i]
            sub = sub_masks(dropout_masks, f"blocks.{i}")
            tab = None if rope is None else (rope[0][i], rope[1][i]) if cfg.rope == "mixed" else rope
            if self.grad_checkpointing and not record:  # recomputed in the backward pass
                remat = nnx.remat(lambda blk, h, m, d, r, t: blk(h, drop_mask=m, masks=d, rope=r, token_mask=t))
                x, probs = remat(block, x, mask, sub, tab, token_mask)
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
            x = jnp.concatenate([x[:, 0], masked_mean(pooled, keep)], axis=-1)
        elif cfg.pool == "summary":  # RADIO: the chosen prefix tokens, concatenated
            x = x[:, np.asarray(cfg.summary_idxs)].reshape(x.shape[0], -1)
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
        """Recompute each block in the backward pass instead of keeping its activations (``nnx.remat``;
        timm's ``set_grad_checkpointing``, big_vision's ``remat_policy``): the same values and gradients
        for less memory and about a third more compute. ``forward_intermediates`` is never recomputed."""
        self.grad_checkpointing = bool(enable)

    def __call__(
        self,
        images: jax.Array,
        *,
        patch_mask=None,
        spatial_shapes=None,
        position_weights=None,
        drop_masks: jax.Array | None = None,
        dropout_masks: dict | None = None,
    ) -> jax.Array:
        """Images [B, H, W, C] -> logits [B, K] (features [B, D'] when num_classes=0).

        NaFlex (``vit_common.naflex``): with ``spatial_shapes`` [B, 2] and ``patch_mask`` [B, N] (host
        arrays: numpy, not traced), ``images`` are flattened patches [B, N, P*P*C] of images of different
        sizes; the position table is resized to each image's grid with cfg.posemb_resample and padding
        patches reach no attention and no pooling. A bad batch raises ValueError (``check_batch``).
        Or ``position_weights`` [B, N, Gh*Gw] instead of ``spatial_shapes`` (``vit_common.naflex.naflex_inputs``):
        then it and ``patch_mask`` may be traced (one compilation for all batches of N patches).

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
        self, images: jax.Array, *, patch_mask=None, spatial_shapes=None
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Logits and every named intermediate; attention always takes the explicit path. NaFlex input as
        ``__call__``; then the token axes are N long, padding included.

        Keys: 'patch_embed' [B, h*w, D], 'pos_embed' [B, L, D], 'norm_pre' (norm_pre only; the block
        input) [B, L, D], 'blockNN' [B, L, D], 'attnNN' [B, N, L, L] (rows sum to 1), 'norm' [B, L, D],
        'attn_pool' [B, N, 1, L'] (MAP and probe only; L' = L, or the patches without pool_include_prefix),
        'pre_logits' [B, D'] (D' = cfg.features_dim), with head_dist also 'pre_logits_dist' [B, D] and, with a
        head, 'head' and 'head_dist' [B, K] (each head's logits), 'logits' [B, K]. The same keys as the torch twin.
        """
        out: dict[str, jax.Array] = {}
        logits = self._forward(images, out, patch_mask=patch_mask, spatial_shapes=spatial_shapes)
        return logits, out
