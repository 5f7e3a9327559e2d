"""Parameter and FLOP counts of a ``ViTConfig``, from the architecture alone (both twins match them):
``ViTConfig.param_count`` and ``ViTConfig.flops``, the methods of this mixin."""

from __future__ import annotations


class Accounting:
    """``param_count`` and ``flops`` of the ``ViTConfig`` that inherits them (its fields and properties)."""

    def param_count(self) -> int:
        """Number of trainable parameters, counted from the architecture (matches both twins)."""
        cfg = self
        d, f, k = cfg.width, cfg.mlp_dim, cfg.num_classes
        ph, pw = cfg.patch_size
        per = 1 if cfg.norm == "rmsnorm" else 2  # RMSNorm: a weight; LayerNorm: weight and bias
        ln = per * d
        linear = lambda i, o, bias=True: i * o + (o if bias else 0)  # noqa: E731
        n = linear(cfg.in_chans * ph * pw, d, cfg.patch_bias)  # patch_embed.proj
        if cfg.patch_norm:
            n += ln
        n += d * cfg.num_prefix_tokens  # cls_token, reg_token
        if cfg.posemb == "learn":
            n += cfg.posemb_len * d
        fc1 = 2 * f if cfg.mlp_type == "swiglu" else f
        mlp = linear(d, fc1, cfg.mlp_bias) + linear(f, d, cfg.mlp_bias)
        qkv_bias = 3 * d if cfg.qkv_bias and cfg.k_bias else 2 * d if cfg.qkv_bias else 0  # [q; k; v] or q, v
        block = ln + 3 * d * d + qkv_bias + linear(d, d, cfg.proj_bias) + ln + mlp
        if cfg.attn_inner_norm:
            block += ln
        if cfg.mlp_inner_norm:
            block += per * f
        if cfg.qk_norm:
            block += 2 * per * cfg.head_dim
        if cfg.layer_scale is not None:
            block += 2 * d
        n += cfg.depth * block
        if cfg.final_norm:
            n += ln  # norm or fc_norm
        if cfg.rope == "mixed":
            n += 2 * cfg.depth * d // 2  # rope.freqs [2, depth, N, hd/2]
        if cfg.norm_pre:
            n += ln
        if cfg.pool == "map":  # latent, q, kv, proj, norm, mlp (timm AttentionPoolLatent)
            fm = cfg.map_mlp_width
            n += d + linear(d, d) + linear(d, 2 * d) + linear(d, d) + ln + linear(d, fm) + linear(fm, d)
        if cfg.pool == "probe":  # latent, kv (bias as qkv's), proj (HF Aimv2AttentionPoolingHead)
            n += d + linear(d, 2 * d, cfg.qkv_bias) + linear(d, d)
        if cfg.rep_size:
            n += linear(d, cfg.rep_size)
        if k:
            n += linear(cfg.features_dim, k, cfg.head_bias) * (2 if cfg.head_dist else 1)  # head (and head_dist)
        return n

    def flops(self, image_size: tuple[int, int] | int | None = None, patches: int | None = None) -> int:
        """Forward FLOPs per image (at ``image_size`` if given, or at ``patches`` patch tokens: a NaFlex
        model's patch budget, whatever their grid), 2 per multiply-accumulate of every matmul.

        Formula (L tokens, D width, F mlp_dim, N' patches, K classes, P patch):
            patch embedding 2 N' C P^2 D
            per block       2 L (3D^2 + D^2 + 2 D F)  (qkv, proj, mlp; 3 D F for swiglu's 2F-row fc1)
                            + 4 L^2 D (q k^T and attn v)
            MAP head        2 D^2 + 2 L' D (2D) + 4 L' D + 2 D^2 + 4 D F'  (q, kv, attention, proj, mlp;
                            L' the tokens it pools: L, or the patches without pool_include_prefix;
                            F' its MLP width, map_mlp_dim or F)
            probe head      2 L' D (2D) + 4 L' D + 2 D^2  (kv, attention, proj)
            pre-logits      2 D R;  head 2 R K  (per token when pool='none'; twice with head_dist)
        Elementwise work (LayerNorm, RMSNorm, GELU, softmax, the RoPE rotation, residual adds) is left out, as in the
        ViT, DeiT and timm/fvcore conventions; it is under 1% of the total for B/16 at 224.
        """
        cfg = self
        if patches is None:
            size = cfg if image_size is None else cfg.replace(image_size=image_size)
            gh, gw = size.grid
            n_patch = gh * gw
        else:
            n_patch = patches
        seq = n_patch + cfg.num_prefix_tokens
        pooled = seq if cfg.pool_include_prefix else n_patch  # tokens the MAP head attends over
        d, f = cfg.width, cfg.mlp_dim
        ph, pw = cfg.patch_size
        total = 2 * n_patch * cfg.in_chans * ph * pw * d
        mlp_macs = (3 if cfg.mlp_type == "swiglu" else 2) * d * f
        total += cfg.depth * (2 * seq * (4 * d * d + mlp_macs) + 4 * seq * seq * d)
        if cfg.pool == "map":
            total += 2 * d * d + 2 * pooled * d * 2 * d + 4 * pooled * d + 2 * d * d + 4 * d * cfg.map_mlp_width
        if cfg.pool == "probe":
            total += 2 * pooled * d * 2 * d + 4 * pooled * d + 2 * d * d
        rows = seq if cfg.pool == "none" else 1
        if cfg.rep_size:
            total += rows * 2 * d * cfg.rep_size
        if cfg.num_classes:
            total += rows * 2 * cfg.features_dim * cfg.num_classes * (2 if cfg.head_dist else 1)
        return total
