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

from vit_common.posemb import METHODS
from vit_common.system.validate import float_in, int_in

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

_CHOICES = {
    "gelu": ("exact", "tanh", "quick"),
    "mlp_type": ("plain", "swiglu"),
    "pool": ("token", "gap", "max", "avgmax", "map", "token_gap", "none"),
    "posemb": ("learn", "sincos2d", "none"),
    "attn_impl": ("fused", "explicit"),
    "dtype": ("float32", "float64", "bfloat16", "float16"),
    "param_dtype": ("float32", "float64", "bfloat16", "float16"),
}


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


@dataclass(frozen=True)
class ViTConfig:
    """Every architectural choice of a ViT, as timm, big_vision and the original ViT need them.

    Defaults are timm's ``vit_base_patch16_224`` (exact GELU, LayerNorm eps 1e-6, class-token pooling).
    Fields that change the function a checkpoint computes are listed in ``FUNCTION_FIELDS``; the rest
    (``RUNTIME_FIELDS``) are training and execution choices.
    Derived values (``grid``, ``num_patches``, ``num_prefix_tokens``, ``seq_len``, ``head_dim``) are
    properties. An invalid combination raises ``ValueError`` naming the values.

    Fields:
        image_size: int or (H, W) in pixels; an int means square.
        patch_size: P, int or (P_h, P_w); the patch embedding is a stride-P convolution with VALID padding.
        patch_bias: the patch-embedding convolution has a bias (False in CLIP image towers, where timm's
            ``pre_norm=True`` drops it).
        in_chans: C.
        num_classes: K; 0 means backbone only (no head, logits are the pre-logits features).
        width, depth, num_heads, mlp_dim: D, number of blocks, N, F.
        qkv_bias: bias on the fused qkv projection (timm default True).
        qk_norm: LayerNorm over head_dim on q and k (timm ``qk_norm``).
        ln_eps: epsilon of every LayerNorm (timm/big_vision 1e-6, HF ViT 1e-12, torch default 1e-5).
        mlp_type: the block MLP. 'plain': fc1 [F, D] -> GELU -> fc2 [D, F]. 'swiglu': the gated unit of
            Shazeer 2020 ("GLU Variants Improve Transformer"), fc2(silu(g) * v) with [g; v] = fc1(x), fc1
            [2F, D] packed gate rows first, fc2 [D, F]: timm ``SwiGLUPacked`` (``GluMlp(gate_last=False)``,
            ``vit_giant_patch14_dinov2``), HF ``Dinov2SwiGLUFFN``. mlp_dim is F, the gated width (HF
            DINOv2 rounds it: ``(int(D * mlp_ratio * 2 / 3) + 7) // 8 * 8``); gelu does not apply to it.
            Not combined with pool='map' (timm's MAP head has its own plain MLP).
        gelu: the MLP's GELU: 'exact' x/2 (1 + erf(x / sqrt 2)) (timm, HF, torch default), 'tanh' (the tanh
            approximation: big_vision, original ViT, jax default) or 'quick' x sigmoid(1.702 x) (OpenAI
            CLIP's QuickGELU; timm ``act_layer='quick_gelu'``, HF ``hidden_act='quick_gelu'``).
        pool: how the final tokens become one vector: 'token' (class token), 'gap' (mean over tokens),
            'max' (per-channel max), 'avgmax' ((max + mean) / 2; timm ``global_pool='avgmax'``), 'map'
            (attention-pooling head), 'token_gap' (concat(class token, mean of the pooled tokens) [2D]: HF
            ``Dinov2ForImageClassification`` and ``Dinov2WithRegistersForImageClassification``, whose mean
            leaves the class and register tokens out), 'none' (every token; the head, if any, is applied
            per token).
        pool_include_prefix: 'gap', 'max', 'avgmax' and 'map' pool over the prefix tokens (class,
            distillation, register) too; False pools the patch tokens only (timm ``pool_include_prefix``,
            default False, which also applies to its MAP head).
        class_token: prepend a learned class token.
        dist_token: prepend a learned distillation token right after the class token (DeiT, Touvron et
            al. 2021; timm ``VisionTransformerDistilled``, HF ``DeiTModel``). Needs class_token.
        head_dist: DeiT's distilled head: a second head ``head_dist`` reads the distillation token, the
            first reads the class token, and the output is the mean of the two (what timm's distilled
            model and HF ``DeiTForImageClassificationWithTeacher`` return in eval mode; without a head,
            the mean of the two tokens). Needs dist_token and pool='token'.
        reg_tokens: number of register tokens (Darcet et al. 2024), after the class (and distillation)
            token.
        posemb: 'learn' (a ``pos_embed`` parameter), 'sincos2d' (fixed, big_vision
            ``posemb_sincos_2d``), 'none'.
        posemb_prefix: ``pos_embed`` has rows for the prefix (class and register) tokens, added after
            they are prepended (timm default, original ViT). False: rows for patches only, added before
            the prefix tokens are prepended (timm ``no_embed_class``, big_vision, DeiT III).
        norm_pre: a LayerNorm on the tokens before the first block (CLIP's ``ln_pre``, timm
            ``pre_norm=True`` as ``norm_pre``).
        fc_norm: LayerNorm after pooling instead of before it (timm ``fc_norm``; MAE/BEiT-style gap).
        head_bias: the head (and head_dist) has a bias; False for CLIP's ``visual_projection`` (HF
            ``CLIPVisionModelWithProjection``), a bias-free projection used as the head.
        rep_size: width of the pre-logits dense + tanh layer (original ViT ``representation_size``,
            HF ``ViTModel`` pooler); 0 means none.
        layer_scale: LayerScale initial value (``ls1.gamma``/``ls2.gamma``); None means no LayerScale.
        dropout: dropout rate after position embedding, attention projection, MLP layers and before
            the head.
        attn_dropout: dropout rate on attention probabilities.
        drop_path: stochastic-depth rate of the last block; block i uses ``drop_path * i / (depth-1)``
            (timm). Active in training mode only.
        dynamic_img_size: accept image sizes other than ``image_size``; the position embedding is
            resampled to the new grid with ``posemb_resample`` (see ``vit_common.posemb``).
        dynamic_img_pad: zero-pad images on the bottom/right to a multiple of the patch size.
        posemb_resample: resampling method name from ``vit_common.posemb.METHODS``.
        attn_impl: 'fused' (the platform's fastest attention kernel; torch scaled_dot_product_attention)
            or 'explicit' (softmax written out; the only path that can return attention probabilities).
            Attention dropout in training, and float64, always take the explicit path: the fused
            kernels have no dropout, and JAX's rounds float64 logits to float32.
        attn_backend: JAX only, the fused path's kernel: None (the fastest one that supports the
            platform, dtype, head dim and mode: cuDNN flash attention on NVIDIA GPUs for bf16/fp16,
            the written-out softmax on CPU, else ``jax.nn.dot_product_attention``'s XLA form; see
            ``vit_jax.platforms.choose_attention``), 'xla' or 'cudnn' (taken as asked; 'cudnn' fails
            where there is no cuDNN). The torch twin lets SDPA choose.
        dtype: compute dtype. Attention logits, softmax and LayerNorm statistics are always computed
            in at least float32.
        param_dtype: dtype of stored parameters.
    """

    image_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    patch_bias: bool = True
    in_chans: int = 3
    num_classes: int = 1000
    width: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    qkv_bias: bool = True
    qk_norm: bool = False
    ln_eps: float = 1e-6
    gelu: str = "exact"
    mlp_type: str = "plain"
    pool: str = "token"
    pool_include_prefix: bool = False
    class_token: bool = True
    dist_token: bool = False
    head_dist: bool = False
    reg_tokens: int = 0
    posemb: str = "learn"
    posemb_prefix: bool = True
    norm_pre: bool = False
    fc_norm: bool = False
    head_bias: bool = True
    rep_size: int = 0
    layer_scale: float | None = None
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    dynamic_img_size: bool = False
    dynamic_img_pad: bool = False
    posemb_resample: str = "bicubic_aa"
    attn_impl: str = "fused"
    attn_backend: str | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self) -> None:
        # Normalise sizes to tuples so that equal configs compare (and hash) equal.
        object.__setattr__(self, "image_size", _pair(self.image_size, "image_size"))
        object.__setattr__(self, "patch_size", _pair(self.patch_size, "patch_size"))
        self._validate()

    def _validate(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected one of {allowed}")
        for name in ("in_chans", "width", "depth", "num_heads", "mlp_dim"):
            int_in(name, getattr(self, name), 1)
        for name in ("num_classes", "reg_tokens", "rep_size"):
            int_in(name, getattr(self, name), 0)
        if self.width % self.num_heads:
            raise ValueError(f"width={self.width} is not divisible by num_heads={self.num_heads}")
        float_in("ln_eps", self.ln_eps, 0, 1, lo_open=True)
        for name in ("dropout", "attn_dropout", "drop_path"):
            float_in(name, getattr(self, name), 0, 1, hi_open=True)
        if self.layer_scale is not None:
            float_in("layer_scale", self.layer_scale, 0, lo_open=True)
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
        if self.posemb == "sincos2d":
            if self.posemb_prefix and self.num_prefix_tokens:
                raise ValueError(
                    "posemb='sincos2d' has no rows for prefix tokens: set posemb_prefix=False "
                    f"(class_token={self.class_token}, reg_tokens={self.reg_tokens})"
                )
            if self.width % 4:
                raise ValueError(f"posemb='sincos2d' needs width divisible by 4, got width={self.width}")
        if self.attn_backend not in (None, "xla", "cudnn"):
            raise ValueError(f"attn_backend={self.attn_backend!r}: expected None, 'xla' or 'cudnn'")
        if self.posemb_resample not in METHODS:
            raise ValueError(f"posemb_resample={self.posemb_resample!r}: expected one of {tuple(METHODS)}")
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
    def features_dim(self) -> int:
        """Width of the head's input (pre-logits): rep_size, 2 D for pool='token_gap', else D."""
        return self.rep_size or (2 * self.width if self.pool == "token_gap" else self.width)

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
        d["image_size"], d["patch_size"] = list(self.image_size), list(self.patch_size)
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
        for k in ("image_size", "patch_size"):
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

    # ------------------------------------------------------------------------------ accounting
    def param_count(self) -> int:
        """Number of trainable parameters, counted from the architecture (matches both twins)."""
        d, f, k = self.width, self.mlp_dim, self.num_classes
        ph, pw = self.patch_size
        ln = 2 * d
        linear = lambda i, o, bias=True: i * o + (o if bias else 0)  # noqa: E731
        n = linear(self.in_chans * ph * pw, d, self.patch_bias)  # patch_embed.proj
        n += d * self.num_prefix_tokens  # cls_token, reg_token
        if self.posemb == "learn":
            n += self.posemb_len * d
        mlp = linear(d, 2 * f if self.mlp_type == "swiglu" else f) + linear(f, d)
        block = ln + linear(d, 3 * d, self.qkv_bias) + linear(d, d) + ln + mlp
        if self.qk_norm:
            block += 2 * 2 * self.head_dim
        if self.layer_scale is not None:
            block += 2 * d
        n += self.depth * block
        n += ln  # norm or fc_norm
        if self.norm_pre:
            n += ln
        if self.pool == "map":  # latent, q, kv, proj, norm, mlp (timm AttentionPoolLatent)
            n += d + linear(d, d) + linear(d, 2 * d) + linear(d, d) + ln + linear(d, f) + linear(f, d)
        if self.rep_size:
            n += linear(d, self.rep_size)
        if k:
            n += linear(self.features_dim, k, self.head_bias) * (2 if self.head_dist else 1)  # head (and head_dist)
        return n

    def flops(self, image_size: tuple[int, int] | int | None = None) -> int:
        """Forward FLOPs per image (at ``image_size`` if given), 2 per multiply-accumulate of every matmul.

        Formula (L tokens, D width, F mlp_dim, N' patches, K classes, P patch):
            patch embedding 2 N' C P^2 D
            per block       2 L (3D^2 + D^2 + 2 D F)  (qkv, proj, mlp; 3 D F for swiglu's 2F-row fc1)
                            + 4 L^2 D (q k^T and attn v)
            MAP head        2 D^2 + 2 L' D (2D) + 4 L' D + 2 D^2 + 4 D F  (q, kv, attention, proj, mlp;
                            L' the tokens it pools: L, or the patches without pool_include_prefix)
            pre-logits      2 D R;  head 2 R K  (per token when pool='none'; twice with head_dist)
        Elementwise work (LayerNorm, GELU, softmax, residual adds) is left out, as in the ViT, DeiT and
        timm/fvcore conventions; it is under 1% of the total for B/16 at 224.
        """
        cfg = self if image_size is None else self.replace(image_size=image_size)
        gh, gw = cfg.grid
        n_patch = gh * gw
        seq = n_patch + self.num_prefix_tokens
        pooled = seq if self.pool_include_prefix else n_patch  # tokens the MAP head attends over
        d, f = self.width, self.mlp_dim
        ph, pw = self.patch_size
        total = 2 * n_patch * self.in_chans * ph * pw * d
        mlp_macs = (3 if self.mlp_type == "swiglu" else 2) * d * f
        total += self.depth * (2 * seq * (4 * d * d + mlp_macs) + 4 * seq * seq * d)
        if self.pool == "map":
            total += 2 * d * d + 2 * pooled * d * 2 * d + 4 * pooled * d + 2 * d * d + 4 * d * f
        rows = seq if self.pool == "none" else 1
        if self.rep_size:
            total += rows * 2 * d * self.rep_size
        if self.num_classes:
            total += rows * 2 * self.features_dim * self.num_classes * (2 if self.head_dist else 1)
        return total


FUNCTION_FIELDS = tuple(f.name for f in dataclasses.fields(ViTConfig) if f.name not in RUNTIME_FIELDS)
