"""The one ViT configuration and variant table, shared by both twins (numpy + stdlib only).

Shape alphabet used throughout the project: B batch, H/W image height/width (pixels), C input channels,
P patch size, L sequence length (prefix tokens + patches), D width, N attention heads, K classes,
F MLP hidden width.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from vit_common.accounting import Accounting
from vit_common.posemb import METHODS
from vit_common.rope import INDEXING, LAYOUTS, NORMALIZE, PERIODS, TYPES, check_config
from vit_common.system.validate import Range, check_fields, check_radio, check_sequence, int_in

# One row per width/depth/MLP/heads. Sources: big_vision `models/vit.py` decode_variant, ViT paper
# (Dosovitskiy et al. 2021) Table 1, So400m from Alabdulmohsin et al. 2023 ("Getting ViT in shape").
VARIANTS: dict[str, dict[str, int]] = {
    "mu": dict(width=32, depth=1, mlp_dim=128, num_heads=2),
    "Ti": dict(width=192, depth=12, mlp_dim=768, num_heads=3),
    "S": dict(width=384, depth=12, mlp_dim=1536, num_heads=6),
    "M": dict(width=512, depth=12, mlp_dim=2048, num_heads=8),
    "B": dict(width=768, depth=12, mlp_dim=3072, num_heads=12),
    "L": dict(width=1024, depth=24, mlp_dim=4096, num_heads=16),
    "So400m": dict(width=1152, depth=27, mlp_dim=4304, num_heads=16),
    "H": dict(width=1280, depth=32, mlp_dim=5120, num_heads=16),
    "g": dict(width=1408, depth=40, mlp_dim=6144, num_heads=16),
    "G": dict(width=1664, depth=48, mlp_dim=8192, num_heads=16),
}
# The demo model of `vit train` without --variant or --init: 28x28 inputs, 7x7 patches, 16 tokens (no
# class token: average pooling).
DEMO_MODEL = dict(image_size=28, patch_size=7, width=128, depth=4, num_heads=4, mlp_dim=256, pool="gap")


_FLAGS = (
    "patch_bias",
    "qkv_bias",
    "qk_norm",
    "pool_include_prefix",
    "class_token",
    "dist_token",
    "head_dist",
    "posemb_prefix",
    "norm_pre",
    "fc_norm",
    "dynamic_img_size",
    "dynamic_img_pad",
    "head_bias",
    "patch_norm",
    "proj_bias",
    "mlp_bias",
    "k_bias",
    "attn_inner_norm",
    "mlp_inner_norm",
    "final_norm",
)
# Training and execution choices: they do not change the function a set of weights computes at its
# image size (LayerScale's init value only matters before the gammas are loaded).
RUNTIME_FIELDS = frozenset(
    {
        "layer_scale",
        "dropout",
        "attn_dropout",
        "drop_path",
        "dynamic_img_size",
        "dynamic_img_pad",
        "posemb_resample",
        "attn_impl",
        "attn_backend",
        "dtype",
        "param_dtype",
    }
)


def _pair(v: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    if isinstance(v, bool):
        raise ValueError(f"{name}={v!r}: expected a positive int or (H, W) pair")
    if isinstance(v, int):
        v = (v, v)
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        raise ValueError(f"{name}={v!r}: expected a positive int or (H, W) pair of positive ints")
    return int_in(f"{name}[0]", v[0]), int_in(f"{name}[1]", v[1])


def _field(default: Any, text: str, **extra: Any) -> Any:
    """A config field whose metadata holds its help text (what it means, its source) and, where it
    has them, its ``choices`` and ``range`` (``vit_common.system.validate.Range``): ``ViTConfig`` checks
    them on construction and ``vit train`` generates its model flags from them."""
    return dataclasses.field(default=default, metadata={"help": text, **extra})


# The fields that are tuples in a config and lists in its JSON.
_SEQUENCES = ("image_size", "patch_size", "rope_ref_grid", "input_mean", "input_std", "summary_idxs")
POSITIVE = Range(1, integer=True)
COUNT = Range(0, integer=True)
RATE = Range(0, 1, hi_open=True)


@dataclass(frozen=True)
class ViTConfig(Accounting):
    """Every architectural choice of a ViT, as timm, big_vision and the original ViT need them.

    Defaults are timm's ``vit_base_patch16_224`` (exact GELU, LayerNorm eps 1e-6, class-token pooling).
    Each field's meaning and source is the help text in its metadata (``dataclasses.fields``; ``vit
    train --help`` lists them), with its ``choices`` or ``range`` where it has them.
    Fields that change the function a checkpoint computes are listed in ``FUNCTION_FIELDS``; the rest
    (``RUNTIME_FIELDS``) are training and execution choices.
    Derived values (``grid``, ``num_patches``, ``num_prefix_tokens``, ``seq_len``, ``head_dim``) are
    properties. An invalid combination raises ``ValueError`` naming the values.
    """

    image_size: int | tuple[int, int] = _field(224, "image size in pixels: an int (square) or (H, W)")
    patch_size: int | tuple[int, int] = _field(
        16, "patch size P, int or (P_h, P_w): the patch embedding is a stride-P convolution, VALID padding"
    )
    patch_bias: bool = _field(
        True, "the patch-embedding convolution has a bias (False in CLIP image towers: timm pre_norm=True)"
    )
    in_chans: int = _field(3, "input channels C", range=POSITIVE)
    num_classes: int = _field(
        1000, "classes K; 0 = backbone only (no head: the logits are the pre-logits)", range=COUNT
    )
    width: int = _field(768, "width D", range=POSITIVE)
    depth: int = _field(12, "number of blocks", range=POSITIVE)
    num_heads: int = _field(12, "attention heads N (must divide the width)", range=POSITIVE)
    mlp_dim: int = _field(3072, "MLP hidden width F", range=POSITIVE)
    qkv_bias: bool = _field(True, "bias on the fused qkv projection (timm default True)")
    qk_norm: bool = _field(False, "LayerNorm over head_dim on q and k (timm qk_norm)")
    ln_eps: float = _field(
        1e-6,
        "epsilon of every norm, LayerNorm or RMSNorm (timm/big_vision 1e-6, HF ViT 1e-12, torch default 1e-5, "
        "AIMv2 1e-5)",
        range=Range(0, 1, lo_open=True),
    )
    gelu: str = _field(
        "exact",
        "the MLP's GELU: exact x/2 (1 + erf(x / sqrt 2)) (timm, HF, torch default), tanh (the tanh "
        "approximation: big_vision, original ViT, jax default) or quick x sigmoid(1.702 x) (OpenAI CLIP's "
        "QuickGELU; timm act_layer='quick_gelu', HF hidden_act='quick_gelu')",
        choices=("exact", "tanh", "quick"),
    )
    mlp_type: str = _field(
        "plain",
        "the block MLP: plain (fc1 [F, D], GELU, fc2 [D, F]) or swiglu (Shazeer 2020, GLU Variants Improve "
        "Transformer: fc2(silu(g) * v), [g; v] = fc1(x), fc1 [2F, D] packed gate rows first as timm "
        "SwiGLUPacked (GluMlp(gate_last=False), vit_giant_patch14_dinov2) and HF Dinov2SwiGLUFFN; mlp_dim is "
        "F, the gated width, which HF DINOv2 rounds: (int(D * mlp_ratio * 2 / 3) + 7) // 8 * 8; gelu does not "
        "apply; not with pool map, whose MLP is plain)",
        choices=("plain", "swiglu"),
    )
    pool: str = _field(
        "token",
        "how the final tokens become one vector: token (the class token), gap (mean over tokens), max "
        "(per-channel max), avgmax ((max + mean) / 2; timm global_pool='avgmax'), map (attention-pooling "
        "head), token_gap (concat(class token, mean of the pooled tokens) [2D]: HF "
        "Dinov2ForImageClassification and Dinov2WithRegistersForImageClassification, whose mean leaves the "
        "class and register tokens out), probe (a learned query attending over the tokens with no query "
        "projection, then an output projection; no norm, no MLP: HF Aimv2AttentionPoolingHead), summary (the "
        "prefix tokens at summary_idxs, concatenated [len(summary_idxs) D]: RADIO's summary, transformers "
        "RadioModel), none (every token; the head, if any, applied per token)",
        choices=("token", "gap", "max", "avgmax", "map", "token_gap", "probe", "summary", "none"),
    )
    summary_idxs: tuple[int, ...] = _field(
        (), "pool summary: which prefix tokens (0 the class token) form the summary, in order (RADIO summary_idxs)"
    )
    pool_include_prefix: bool = _field(
        False,
        "gap, max, avgmax and map pool over the prefix tokens (class, distillation, register) too; off: "
        "the patch tokens only (timm pool_include_prefix, default False, which also applies to its MAP head)",
    )
    class_token: bool = _field(True, "prepend a learned class token")
    dist_token: bool = _field(
        False,
        "prepend a learned distillation token right after the class token (DeiT, Touvron et al. 2021; timm "
        "VisionTransformerDistilled, HF DeiTModel); needs class_token",
    )
    head_dist: bool = _field(
        False,
        "DeiT's distilled head: a second head head_dist reads the distillation token, the first the class "
        "token, and the output is their mean (timm's distilled model and HF "
        "DeiTForImageClassificationWithTeacher in eval mode; without a head, the mean of the two tokens); "
        "needs dist_token and pool token",
    )
    reg_tokens: int = _field(
        0, "register tokens (Darcet et al. 2024), after the class (and distillation) token", range=COUNT
    )
    posemb: str = _field(
        "learn",
        "position embedding: learn (a pos_embed parameter), sincos2d (fixed, big_vision posemb_sincos_2d), "
        "sincos2d_mae (fixed, MAE's get_2d_sincos_pos_embed frequencies: HF AIMv2 is_native; "
        "vit_common.posemb.sincos2d), none",
        choices=("learn", "sincos2d", "sincos2d_mae", "none"),
    )
    posemb_prefix: bool = _field(
        True,
        "pos_embed has rows for the prefix (class and register) tokens, added after they are prepended "
        "(timm default, original ViT); off: rows for the patches only, added before the prefix tokens are "
        "prepended (timm no_embed_class, big_vision, DeiT III)",
    )
    norm_pre: bool = _field(
        False, "a LayerNorm on the tokens before the first block (CLIP's ln_pre, timm pre_norm=True as norm_pre)"
    )
    fc_norm: bool = _field(False, "LayerNorm after pooling instead of before it (timm fc_norm; MAE/BEiT-style gap)")
    head_bias: bool = _field(
        True,
        "the head (and head_dist) has a bias; off for CLIP's visual_projection (HF "
        "CLIPVisionModelWithProjection), a bias-free projection used as the head",
    )
    # Norm kind and biases of AIMv2-style models (RMSNorm, a norm after the patch embedding, bias-free
    # projections); the defaults are every ViT's before them.
    norm: str = _field(
        "layernorm",
        "the kind of every norm of the model (blocks, final, fc_norm, norm_pre, patch_norm, qk_norm, MAP head; "
        "timm's one norm_layer): layernorm, or rmsnorm (x / sqrt(mean(x^2) + eps) * weight, no bias; Zhang & "
        "Sennrich 2019; timm RmsNorm, HF Aimv2RMSNorm), both with eps ln_eps",
        choices=("layernorm", "rmsnorm"),
    )
    input_mean: tuple[float, ...] | None = _field(
        None,
        "the model normalises its input itself, per channel, in float32: (x - input_mean) / input_std (RADIO's "
        "input conditioner, transformers RadioInputConditioner); unset = the input is taken as given",
    )
    input_std: tuple[float, ...] | None = _field(None, "the per-channel divisor of input_mean's normalisation")
    patch_norm: bool = _field(
        False,
        "a norm on the patch tokens right after the patch embedding, before the position embedding (timm "
        "embed_norm_layer, HF AIMv2's embeddings.rms_norm)",
    )
    proj_bias: bool = _field(
        True, "bias on each block's attention output projection (timm proj_bias, which sets mlp_bias too)"
    )
    mlp_bias: bool = _field(True, "bias on each block's MLP layers (HF AIMv2 mlp_bias)")
    rep_size: int = _field(
        0,
        "width of the pre-logits dense + tanh layer (original ViT representation_size, HF ViTModel pooler); 0 = none",
        range=COUNT,
    )
    rope: str = _field(
        "none",
        "rotary position embedding of the patch tokens' q and k (vit_common.rope): dinov3 (timm "
        "RotaryEmbeddingDinoV3: Meta DINOv3, HF dinov3_vit), cat (timm RotaryEmbeddingCat: EVA-02, Perception "
        "Encoder, RoPE-ViT axial), mixed (learned rope.freqs: RoPE-Mixed, timm RotaryEmbeddingMixed)",
        choices=TYPES,
    )
    rope_temperature: float = _field(
        10000.0,
        "RoPE temperature T: dinov3 periods T^(k/(hd/4)) (DINOv3 100), cat bands T^(-k/(hd/4)) (EVA-02 and PE "
        "10000, RoPE-ViT 100); timm rope_temperature, HF rope_theta",
        range=Range(0, lo_open=True),
    )
    rope_layout: str = _field(
        "interleaved",
        "rotated channel pairs: interleaved (2p, 2p+1; EVA-02, PE, RoPE-ViT) or half (p, p + hd/2; DINOv3, timm "
        "rope_rotate_half)",
        choices=LAYOUTS,
    )
    rope_grid_offset: float = _field(
        0.0,
        "added to each patch index before RoPE normalises or rescales it (timm rope_grid_offset; PE 1)",
        range=Range(),
    )
    rope_grid_indexing: str = _field(
        "ij",
        "which patch coordinate drives the first hd/4 rotated pairs: ij the row (EVA-02, DINOv3), xy the column "
        "(PE, RoPE-ViT); timm rope_grid_indexing",
        choices=INDEXING,
    )
    rope_ref_grid: tuple[int, int] | None = _field(
        None,
        "rope cat only: coordinate t on an axis of s patches becomes t * r / s for this (rows, columns) grid r "
        "(timm ref_feat_shape: EVA-02 (16, 16)); unset = integer positions",
    )
    rope_normalize: str = _field(
        "separate",
        "rope dinov3 only: the centred coordinates are divided by each axis' own size (separate), or by the "
        "smaller (min) or larger (max) one; timm normalize_coords",
        choices=NORMALIZE,
    )
    rope_periods: str = _field(
        "computed",
        "rope dinov3 only: periods recomputed from rope_temperature in float32 (timm, transformers), or the "
        "checkpoint's rope.periods tensor (stored: Meta's persistent buffer, rounded to bfloat16 in its files)",
        choices=PERIODS,
    )
    k_bias: bool = _field(
        True,
        "with qkv_bias: the key projection has a bias too (attn.qkv.bias [3D]); off: q and v biases only "
        "(attn.q_bias, attn.v_bias [D]: timm EvaAttention, EVA-02, DINOv3's masked k bias, HF key_bias=False)",
    )
    attn_inner_norm: bool = _field(
        False, "LayerNorm over D on the attention output before proj (attn.norm; timm scale_attn_inner, EVA-CLIP)"
    )
    mlp_inner_norm: bool = _field(
        False, "LayerNorm over F before fc2, after the (gated) activation (mlp.norm; timm scale_mlp, EVA-02)"
    )
    final_norm: bool = _field(
        True,
        "a LayerNorm after the last block (norm), or after pooling with fc_norm; off: neither (PE spatial: timm "
        "use_post_transformer_norm=False, use_fc_norm=False)",
    )
    map_heads: int = _field(0, "heads of the MAP head; 0 = num_heads (PE: 8; timm attn_pool_num_heads)", range=COUNT)
    map_mlp_dim: int = _field(
        0, "MLP width of the MAP head; 0 = mlp_dim (PE: 4 D; timm attn_pool_mlp_ratio)", range=COUNT
    )
    layer_scale: float | None = _field(
        None,
        "LayerScale initial value (ls1.gamma / ls2.gamma; Touvron et al. 2021, CaiT); unset = no LayerScale",
        range=Range(0, lo_open=True),
    )
    dropout: float = _field(
        0.0,
        "dropout rate after the position embedding, attention projection, MLP layers and before the head",
        range=RATE,
    )
    attn_dropout: float = _field(0.0, "dropout rate on the attention probabilities", range=RATE)
    drop_path: float = _field(
        0.0,
        "stochastic-depth rate of the last block; block i uses drop_path * i / (depth - 1) (timm); training only",
        range=RATE,
    )
    dynamic_img_size: bool = _field(
        False,
        "accept image sizes other than image_size: the position embedding is resampled to the new grid "
        "with posemb_resample (vit_common.posemb)",
    )
    dynamic_img_pad: bool = _field(False, "zero-pad images on the bottom/right to a multiple of the patch size")
    posemb_resample: str = _field(
        "bicubic_aa", "how the position embedding is resampled (vit_common.posemb.METHODS)", choices=tuple(METHODS)
    )
    attn_impl: str = _field(
        "fused",
        "fused (the platform's fastest attention kernel; torch scaled_dot_product_attention) or explicit "
        "(softmax written out: the only path that returns attention probabilities); attention dropout in "
        "training and float64 always take the explicit path (the fused kernels have no dropout, and JAX's "
        "rounds float64 logits to float32)",
        choices=("fused", "explicit"),
    )
    attn_backend: str | None = _field(
        None,
        "JAX only, the fused path's kernel: unset = the fastest one that supports the platform, dtype, head "
        "dim and mode (cuDNN flash attention on NVIDIA GPUs for bf16/fp16, the written-out softmax on CPU, "
        "else jax.nn.dot_product_attention's XLA form; vit_jax.platforms.choose_attention), xla or cudnn "
        "(taken as asked; cudnn fails where there is no cuDNN); the torch twin lets SDPA choose",
        choices=("xla", "cudnn"),
    )
    dtype: str = _field(
        "float32",
        "compute dtype; attention logits, softmax and LayerNorm statistics are always computed in at least float32",
        choices=("float32", "float64", "bfloat16", "float16"),
    )
    param_dtype: str = _field(
        "float32", "dtype of the stored parameters", choices=("float32", "float64", "bfloat16", "float16")
    )

    def __post_init__(self) -> None:
        # Normalise sizes to tuples so that equal configs compare (and hash) equal.
        object.__setattr__(self, "image_size", _pair(self.image_size, "image_size"))
        object.__setattr__(self, "patch_size", _pair(self.patch_size, "patch_size"))
        if self.rope_ref_grid is not None:
            object.__setattr__(self, "rope_ref_grid", _pair(self.rope_ref_grid, "rope_ref_grid"))
        for name in ("input_mean", "input_std", "summary_idxs"):
            object.__setattr__(self, name, check_sequence(self, name))
        self._validate()

    def _validate(self) -> None:
        for f in dataclasses.fields(self):
            value, allowed = getattr(self, f.name), f.metadata.get("choices")
            unset = value is None and f.default is None  # an optional choice left to the twin (attn_backend)
            if allowed and value not in allowed and not unset:
                raise ValueError(
                    f"{f.name}={value!r}: expected one of {allowed}{' or None' if f.default is None else ''}"
                )
        check_fields(self)
        if self.width % self.num_heads:
            raise ValueError(f"width={self.width} is not divisible by num_heads={self.num_heads}")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected True or False")
        if self.pool in ("token", "token_gap") and not self.class_token:
            raise ValueError(
                f"pool={self.pool!r} needs class_token=True; use pool='gap', 'max', 'avgmax', 'map' or 'none'"
            )
        if self.pool == "token_gap" and (self.fc_norm or self.rep_size):
            raise ValueError(
                f"pool='token_gap' (a [2D] feature, HF DINOv2's classifier input) takes neither fc_norm nor "
                f"rep_size; got fc_norm={self.fc_norm}, rep_size={self.rep_size}"
            )
        if self.fc_norm and not self.final_norm:
            raise ValueError("fc_norm=True needs final_norm=True: fc_norm is the final norm placed after pooling")
        if self.map_heads and self.width % self.map_heads:
            raise ValueError(f"map_heads={self.map_heads} does not divide width={self.width}")
        check_config(self)
        check_radio(self)
        if self.pool == "probe" and self.qkv_bias and not self.k_bias:
            raise ValueError(
                "pool='probe' with qkv_bias=True, k_bias=False: the probe's kv projection takes its k and v "
                "biases together from qkv_bias (HF AIMv2); a q/v-only bias has no probe"
            )
        if self.mlp_type == "swiglu" and self.pool == "map":
            raise ValueError("mlp_type='swiglu' with pool='map': the MAP head's MLP would be ambiguous; use one")
        if self.dist_token and not self.class_token:
            raise ValueError("dist_token=True needs class_token=True: the distillation token follows it (DeiT)")
        if self.head_dist:
            bad = [
                f"{name}={getattr(self, name)!r}"
                for name, ok in (
                    ("dist_token", self.dist_token),
                    ("pool", self.pool == "token"),
                    ("fc_norm", not self.fc_norm),
                    ("rep_size", not self.rep_size),
                )
                if not ok
            ]
            if bad:
                raise ValueError(
                    f"head_dist=True (DeiT's distilled head) needs dist_token=True, pool='token', fc_norm=False "
                    f"and rep_size=0; got {', '.join(bad)}"
                )
        if self.posemb in ("sincos2d", "sincos2d_mae"):
            if self.posemb_prefix and self.num_prefix_tokens:
                raise ValueError(
                    f"posemb={self.posemb!r} has no rows for prefix tokens: set posemb_prefix=False "
                    f"(class_token={self.class_token}, reg_tokens={self.reg_tokens})"
                )
            if self.width % 4 or self.width < 8:
                raise ValueError(f"posemb={self.posemb!r} needs width divisible by 4 and >= 8, got width={self.width}")
        (h, w), (ph, pw) = self.image_size, self.patch_size
        if (h % ph or w % pw) and not (self.dynamic_img_pad or self.dynamic_img_size):
            raise ValueError(
                f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}; "
                "set dynamic_img_pad=True to pad or dynamic_img_size=True to floor"
            )
        if min(h // ph, w // pw) < 1 and not self.dynamic_img_pad:
            raise ValueError(f"image_size={self.image_size} is smaller than patch_size={self.patch_size}")

    # ----------------------------------------------------------------------------------- derived

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid (H/P, W/P) at ``image_size`` (rounded up when dynamic_img_pad is on)."""
        return self.grid_for(self.image_size)

    def grid_for(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Patch grid for an (H, W) image under this config's rules.

        Raises:
            ValueError: if H or W is not a multiple of P and neither dynamic_img_pad nor
                dynamic_img_size allows it, or if (H, W) differs from image_size without
                dynamic_img_size.
        """
        h, w = int(hw[0]), int(hw[1])
        ph, pw = self.patch_size
        if self.dynamic_img_pad:
            return -(-h // ph), -(-w // pw)
        if (h, w) != tuple(self.image_size) and not self.dynamic_img_size:
            msg = f"image size ({h}, {w}) differs from the config's image_size {tuple(self.image_size)}"
            if h % ph or w % pw:
                msg += f" and is not a multiple of patch_size {tuple(self.patch_size)}"
            raise ValueError(msg + "; set dynamic_img_size=True to resample the position embedding")
        if h % ph or w % pw:
            if not self.dynamic_img_size:
                raise ValueError(f"image size ({h}, {w}) is not a multiple of patch_size {self.patch_size}")
            # dynamic size without padding: VALID (floor) semantics, as torch's conv and timm
        return h // ph, w // pw

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid
        return gh * gw

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: class, distillation, registers (in that order)."""
        return int(self.class_token) + int(self.dist_token) + self.reg_tokens

    @property
    def seq_len(self) -> int:
        """L = prefix tokens + patches."""
        return self.num_prefix_tokens + self.num_patches

    @property
    def posemb_len(self) -> int:
        """Rows of the learned ``pos_embed`` (prefix rows included when posemb_prefix)."""
        return self.num_patches + (self.num_prefix_tokens if self.posemb_prefix else 0)

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def map_num_heads(self) -> int:
        """Heads of the MAP head: map_heads, or num_heads when it is 0."""
        return self.map_heads or self.num_heads

    @property
    def map_mlp_width(self) -> int:
        """MLP width of the MAP head: map_mlp_dim, or mlp_dim when it is 0."""
        return self.map_mlp_dim or self.mlp_dim

    @property
    def features_dim(self) -> int:
        """Width of the head's input: rep_size, 2 D (pool 'token_gap'), len(summary_idxs) D (pool 'summary'), or D."""
        wide = {"token_gap": 2, "summary": len(self.summary_idxs)}.get(self.pool, 1)
        return self.rep_size or wide * self.width

    def inert_fields(self) -> frozenset[str]:
        """Fields whose value changes nothing given the others (e.g. pool_include_prefix without prefix
        tokens): a reader need not know them."""
        inert = set()
        if not self.num_prefix_tokens or self.pool in ("token", "none"):
            inert.add("pool_include_prefix")
        if not self.num_prefix_tokens or self.posemb != "learn":
            inert.add("posemb_prefix")
        if self.mlp_type == "swiglu":
            inert.add("gelu")
        if not self.num_classes:
            inert.add("head_bias")
        if self.rope == "none":
            inert |= {f.name for f in dataclasses.fields(self) if f.name.startswith("rope_")}
        if self.rope != "dinov3":
            inert |= {"rope_normalize", "rope_periods"}
        if self.rope != "cat":
            inert.add("rope_ref_grid")
        if self.rope == "mixed" or self.rope_periods == "stored":
            inert.add("rope_temperature")
        if not self.qkv_bias:
            inert.add("k_bias")
        if self.pool != "map":
            inert |= {"map_heads", "map_mlp_dim"}
        if self.pool != "summary":
            inert.add("summary_idxs")
        return frozenset(inert)

    # ------------------------------------------------------------------------------- constructors
    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> ViTConfig:
        """Build a config from a variant string such as ``"B/16"``, ``"So400m/14"`` or ``"Ti/16"``.

        The part before ``/`` is a VARIANTS row, the part after is the patch size. Keyword overrides
        replace any field (``num_classes=10``, ``image_size=384``, ...).

        Raises:
            ValueError: unknown variant, malformed string, or an invalid override.
        """
        m = re.fullmatch(r"\s*([A-Za-z0-9]+)\s*/\s*(\d+)\s*", name)
        if not m:
            raise ValueError(f"variant {name!r}: expected 'NAME/PATCH' such as 'B/16'")
        row, patch = m.group(1), int(m.group(2))
        if row not in VARIANTS:
            raise ValueError(f"variant {name!r}: unknown name {row!r}; known: {', '.join(VARIANTS)}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ViTConfig field(s): {sorted(unknown)}")
        return cls(**{**VARIANTS[row], "patch_size": patch, **overrides})

    def replace(self, **changes: Any) -> ViTConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in _SEQUENCES:
            if d[k] is not None:
                d[k] = list(d[k])
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        """Inverse of ``to_dict``; unknown keys raise ValueError naming them."""
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ViTConfig field(s): {sorted(unknown)}")
        d = dict(d)
        for k in _SEQUENCES:
            if isinstance(d.get(k), list):
                d[k] = tuple(d[k])
        return cls(**d)

    @classmethod
    def from_json(cls, s: str) -> ViTConfig:
        return cls.from_dict(json.loads(s))

    @property
    def variant(self) -> str | None:
        """The VARIANTS name whose width/depth/mlp/heads match, or None."""
        for name, row in VARIANTS.items():
            if all(getattr(self, k) == v for k, v in row.items()):
                return name
        return None


FUNCTION_FIELDS = tuple(f.name for f in dataclasses.fields(ViTConfig) if f.name not in RUNTIME_FIELDS)
