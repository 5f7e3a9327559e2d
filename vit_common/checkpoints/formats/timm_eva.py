"""timm ``Eva`` state dicts (EVA-02, DINOv3, Perception Encoder, RoPE-ViT; ``timm/models/eva.py``) <->
the canonical state, by rules on the key names (numpy only).

An Eva file spells some canonical tensors its own way; ``EvaLayout`` records which spelling a file uses
so that a write reproduces it:

- LayerScale ``blocks.{i}.gamma_1`` / ``gamma_2`` [D] -> ``ls1.gamma`` / ``ls2.gamma``;
- attention ``qkv`` fused (``qkv.weight`` [3D, D], with ``q_bias``/``v_bias`` [D] (``EvaAttention``) or
  ``qkv.bias`` [3D] (``AttentionRope``)) or split (``q_proj``, ``k_proj``, ``v_proj``; EvaAttention has
  no ``k_proj.bias``) -> ``attn.qkv.weight`` rows [q; k; v] and ``attn.qkv.bias`` or ``attn.q_bias`` /
  ``attn.v_bias``;
- gated MLP packed (``GluMlp``: ``fc1`` [2F, D], gate rows first) or split (``SwiGLU``: ``fc1_g``,
  ``fc1_x`` [F, D]) -> ``mlp.fc1`` [2F, D] packed, gate first.

Every other key (``attn.norm``, ``mlp.norm``, ``rope.freqs``, ``attn_pool.*``...) is canonical as it is.
timm keeps its RoPE periods, bands and tables in non-persistent buffers: an Eva file holds no RoPE
tensor but ``rope.freqs`` (``mixed``); the RoPE settings come from the architecture. Gathered and split
tensors are ``LazyTensor``s over the file's (``vit_common.checkpoints.formats.tensors``): nothing loads
until a writer or a twin asks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from vit_common.checkpoints.formats.rules import refuse, rope_family_fields
from vit_common.checkpoints.formats.tensors import Tensor, TensorMap, concat_rows, row_slice
from vit_common.config import ViTConfig


@dataclass(frozen=True)
class EvaLayout:
    """How an Eva file spells attention and the gated MLP: ``qkv`` 'fused' | 'split', ``mlp`` 'packed' |
    'split' (a plain MLP is 'packed': its fc1 is canonical)."""

    qkv: str = "fused"
    mlp: str = "packed"


def layout_of(state: Mapping[str, object]) -> EvaLayout:
    """The layout of an Eva state dict, from its block 0 keys."""
    return EvaLayout(
        qkv="split" if "blocks.0.attn.q_proj.weight" in state else "fused",
        mlp="split" if "blocks.0.mlp.fc1_g.weight" in state else "packed",
    )


def default_layout(cfg: ViTConfig) -> EvaLayout:
    """timm's own layout for a config written without a source layout: SwiGLU with an inner norm is timm's
    split ``SwiGLU`` (``scale_mlp``), everything else fused and packed."""
    return EvaLayout(mlp="split" if cfg.mlp_type == "swiglu" and cfg.mlp_inner_norm else "packed")


_LS = re.compile(r"^(blocks\.\d+)\.gamma_([12])$")


def _partner(key: str) -> str | None:
    """For a split q/k/v or SwiGLU key, the key that gathers its group (``q_proj.weight``, ``fc1_g``)."""
    if m := re.match(r"^(.*\.attn)\.[kv]_proj\.(weight|bias)$", key):
        return f"{m[1]}.q_proj.weight"
    if m := re.match(r"^(.*\.mlp)\.fc1_x\.(weight|bias)$", key):
        return f"{m[1]}.fc1_g.{m[2]}"
    if m := re.match(r"^(.*\.attn)\.q_proj\.bias$", key):
        return f"{m[1]}.q_proj.weight"
    return None


def eva_to_canonical(state: TensorMap) -> dict[str, Tensor]:
    """An Eva state dict -> canonical names and layouts. A key of a split group whose gathering key is
    absent stays as it is, for the caller's check against ``canonical_shapes`` to report."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if (p := _partner(key)) is not None and p in state:
            continue  # gathered with its group below
        if m := _LS.match(key):
            out[f"{m[1]}.ls{m[2]}.gamma"] = value
        elif key.endswith(".attn.q_proj.weight"):
            b = key[: -len(".q_proj.weight")]
            out[f"{b}.qkv.weight"] = concat_rows([state[f"{b}.{n}_proj.weight"] for n in "qkv"])
            if f"{b}.k_proj.bias" in state:  # AttentionRope: three biases
                out[f"{b}.qkv.bias"] = concat_rows([state[f"{b}.{n}_proj.bias"] for n in "qkv"])
            elif f"{b}.q_proj.bias" in state:  # EvaAttention: no key bias
                out[f"{b}.q_bias"], out[f"{b}.v_bias"] = state[f"{b}.q_proj.bias"], state[f"{b}.v_proj.bias"]
        elif (m := re.match(r"^(.*\.mlp)\.fc1_g\.(weight|bias)$", key)) and f"{m[1]}.fc1_x.{m[2]}" in state:
            out[f"{m[1]}.fc1.{m[2]}"] = concat_rows([value, state[f"{m[1]}.fc1_x.{m[2]}"]])  # gate rows first
        else:
            out[key] = value
    return out


def canonical_to_eva(cfg: ViTConfig, state: TensorMap, layout: EvaLayout) -> dict[str, Tensor]:
    """The canonical state -> an Eva state dict in ``layout`` (the inverse of ``eva_to_canonical``)."""
    d, f = cfg.width, cfg.mlp_dim
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        m = re.match(r"^(blocks\.\d+)\.ls([12])\.gamma$", key)
        b, _, leaf = key.rpartition(".")
        if m:
            out[f"{m[1]}.gamma_{m[2]}"] = value
        elif layout.qkv == "split" and b.endswith(".attn.qkv"):
            a = b[: -len(".qkv")]
            for i, n in enumerate("qkv"):
                out[f"{a}.{n}_proj.{leaf}"] = row_slice(value, i * d, (i + 1) * d)
        elif layout.qkv == "split" and key.endswith((".attn.q_bias", ".attn.v_bias")):
            out[f"{b}.{leaf[0]}_proj.bias"] = value
        elif layout.mlp == "split" and cfg.mlp_type == "swiglu" and re.match(r"^blocks\.\d+\.mlp\.fc1$", b):
            out[f"{b}_g.{leaf}"] = row_slice(value, 0, f)
            out[f"{b}_x.{leaf}"] = row_slice(value, f, 2 * f)
        else:
            out[key] = value
    return out


# -------------------------------------------------------------------------------------------- writing

# timm Eva entry points a written model can name, by family (the first of each is the family's name for a
# model of no entry point's shape): (name, the LayerNorm eps it builds, embed_dim, depth, num_heads, patch,
# MLP), read from timm 1.0.31 eva.py (DINOv3 and PE pass partial(LayerNorm, eps=1e-5), the others timm's
# LayerNorm, eps 1e-6). The model_args spell out every other keyword, so the name fixes the eps and tells
# a reader the family and the size.
EVA_FAMILIES = (
    (
        ("vit_base_patch16_dinov3", 1e-5, 768, 12, 12, 16, "plain"),
        ("vit_small_patch16_dinov3", 1e-5, 384, 12, 6, 16, "plain"),
        ("vit_large_patch16_dinov3", 1e-5, 1024, 24, 16, 16, "plain"),
        ("vit_small_plus_patch16_dinov3", 1e-5, 384, 12, 6, 16, "swiglu"),
        ("vit_huge_plus_patch16_dinov3", 1e-5, 1280, 32, 20, 16, "swiglu"),
        ("vit_7b_patch16_dinov3", 1e-5, 4096, 40, 32, 16, "swiglu"),
    ),
    (
        ("vit_base_patch16_dinov3_qkvb", 1e-5, 768, 12, 12, 16, "plain"),
        ("vit_tiny_patch16_dinov3_qkvb", 1e-5, 192, 12, 3, 16, "plain"),
        ("vit_small_patch16_dinov3_qkvb", 1e-5, 384, 12, 6, 16, "plain"),
        ("vit_large_patch16_dinov3_qkvb", 1e-5, 1024, 24, 16, 16, "plain"),
        ("vit_small_plus_patch16_dinov3_qkvb", 1e-5, 384, 12, 6, 16, "swiglu"),
        ("vit_huge_plus_patch16_dinov3_qkvb", 1e-5, 1280, 32, 20, 16, "swiglu"),
    ),
    (
        ("vit_pe_core_base_patch16_224", 1e-5, 768, 12, 12, 16, "plain"),
        ("vit_pe_core_tiny_patch16_384", 1e-5, 192, 12, 3, 16, "plain"),
        ("vit_pe_core_small_patch16_384", 1e-5, 384, 12, 6, 16, "plain"),
        ("vit_pe_core_large_patch14_336", 1e-5, 1024, 24, 16, 14, "plain"),
        ("vit_pe_core_gigantic_patch14_448", 1e-5, 1536, 50, 16, 14, "plain"),
    ),
    (
        ("vit_pe_spatial_base_patch16_512", 1e-5, 768, 12, 12, 16, "plain"),
        ("vit_pe_spatial_tiny_patch16_512", 1e-5, 192, 12, 3, 16, "plain"),
        ("vit_pe_spatial_small_patch16_512", 1e-5, 384, 12, 6, 16, "plain"),
        ("vit_pe_spatial_large_patch14_448", 1e-5, 1024, 24, 16, 14, "plain"),
        ("vit_pe_spatial_gigantic_patch14_448", 1e-5, 1536, 50, 16, 14, "plain"),
    ),
    (
        ("eva02_tiny_patch14_224", 1e-06, 192, 12, 3, 14, "swiglu"),
        ("eva02_small_patch14_224", 1e-06, 384, 12, 6, 14, "swiglu"),
        ("eva02_tiny_patch14_336", 1e-06, 192, 12, 3, 14, "swiglu"),
        ("eva02_small_patch14_336", 1e-06, 384, 12, 6, 14, "swiglu"),
    ),
    (
        ("eva02_base_patch14_224", 1e-06, 768, 12, 12, 14, "swiglu"),
        ("eva02_large_patch14_224", 1e-06, 1024, 24, 16, 14, "swiglu"),
        ("eva02_base_patch14_448", 1e-06, 768, 12, 12, 14, "swiglu"),
        ("eva02_large_patch14_448", 1e-06, 1024, 24, 16, 14, "swiglu"),
    ),
    (
        ("eva02_large_patch14_clip_224", 1e-06, 1024, 24, 16, 14, "swiglu"),
        ("eva02_base_patch16_clip_224", 1e-06, 768, 12, 12, 16, "swiglu"),
        ("eva02_large_patch14_clip_336", 1e-06, 1024, 24, 16, 14, "swiglu"),
    ),
    (
        ("vit_base_patch16_rope_224", 1e-06, 768, 12, 12, 16, "plain"),
        ("vit_small_patch16_rope_224", 1e-06, 384, 12, 6, 16, "plain"),
        ("vit_large_patch16_rope_224", 1e-06, 1024, 24, 16, 16, "plain"),
    ),
    (
        ("vit_base_patch16_rope_ape_224", 1e-06, 768, 12, 12, 16, "plain"),
        ("vit_small_patch16_rope_ape_224", 1e-06, 384, 12, 6, 16, "plain"),
        ("vit_large_patch16_rope_ape_224", 1e-06, 1024, 24, 16, 16, "plain"),
    ),
    (
        ("vit_base_patch16_rope_mixed_224", 1e-06, 768, 12, 12, 16, "plain"),
        ("vit_small_patch16_rope_mixed_224", 1e-06, 384, 12, 6, 16, "plain"),
        ("vit_large_patch16_rope_mixed_224", 1e-06, 1024, 24, 16, 16, "plain"),
    ),
    (
        ("vit_base_patch16_rope_mixed_ape_224", 1e-06, 768, 12, 12, 16, "plain"),
        ("vit_small_patch16_rope_mixed_ape_224", 1e-06, 384, 12, 6, 16, "plain"),
        ("vit_large_patch16_rope_mixed_ape_224", 1e-06, 1024, 24, 16, 16, "plain"),
    ),
    (
        ("vit_base_patch16_rope_reg1_gap_256", 1e-06, 768, 12, 12, 16, "plain"),
        ("vit_medium_patch16_rope_reg1_gap_256", 1e-06, 512, 12, 8, 16, "plain"),
        ("vit_betwixt_patch16_rope_reg4_gap_256", 1e-06, 640, 12, 10, 16, "plain"),
    ),
)
EVA_NAMES = {row[0]: row[1] for family in EVA_FAMILIES for row in family}
_EVA_POOL = {"token": "token", "gap": "avg", "max": "max", "avgmax": "avgmax", "map": "map", "none": ""}
_SOURCE = re.compile(r"timm hub folder, architecture (\S+?)(?:,|$)")
SPLIT_NOTE = ", Eva q/k/v split"  # what a reader appends to its layout for a file with q_proj/k_proj/v_proj


def layout_note(state: Mapping[str, object]) -> str:
    """What a reader appends to a timm file's layout line so that a writer keeps its q/k/v spelling."""
    return SPLIT_NOTE if layout_of(state).qkv == "split" else ""


def source_choices(layout: str) -> tuple[str, str]:
    """(the timm Eva name, the q/k/v spelling 'fused' | 'split') a source's layout line states ('' where
    it states none): a timm hub folder's architecture, and ``SPLIT_NOTE``."""
    m = _SOURCE.search(layout)
    name = m[1] if m and m[1] in EVA_NAMES else ""
    return name, ("split" if SPLIT_NOTE in layout else "fused") if "timm" in layout else ""


def is_eva(cfg: ViTConfig) -> bool:
    """Whether timm holds ``cfg`` as an ``Eva`` rather than a ``VisionTransformer``: it makes a RoPE
    backbone's choices (``rules.rope_family_fields``: rotary embeddings, q/v biases without a key bias,
    inner norms, a MAP head of its own size). No final norm alone is a ``VisionTransformer``'s
    ``final_norm=False`` (timm's RADIO backbones)."""
    return bool(rope_family_fields(cfg.replace(final_norm=True)))


def drop_stored_periods(cfg: ViTConfig, state: TensorMap) -> tuple[ViTConfig, dict[str, Tensor], list[str]]:
    """(``cfg``, ``state``, notes) with a DINOv3 model's stored ``rope.periods`` dropped and
    ``rope_periods='computed'``, as timm's ``checkpoint_filter_fn`` discards Meta's buffer: timm's Eva
    recomputes the periods in float32, so a file whose periods were rounded (Meta's bf16) computes
    timm's numbers once written. Unchanged (no note) for any other model."""
    if cfg.rope != "dinov3" or cfg.rope_periods != "stored":
        return cfg, dict(state), []
    state = {k: v for k, v in state.items() if k != "rope.periods"}
    note = (
        "rope.periods (stored) not written: timm's Eva recomputes the DINOv3 periods in float32 "
        "(rope_periods='computed'), as timm's checkpoint_filter_fn discards them; where the stored ones were "
        "rounded (Meta's bf16 buffer) the outputs move to timm's"
    )
    return cfg.replace(rope_periods="computed"), state, [note]


def eva_cannot_hold(cfg: ViTConfig) -> list[str]:
    """What ``cfg`` has that timm's ``Eva`` cannot hold, one reason each (a bias-free head aside, which
    the writer gives a zero bias)."""
    checks = {
        "norm='rmsnorm' or patch_norm (timm's Eva has LayerNorms and no patch norm)": cfg.norm == "rmsnorm"
        or cfg.patch_norm,
        f"rep_size={cfg.rep_size} (timm's Eva has no pre-logits layer)": cfg.rep_size > 0,
        f"pool={cfg.pool!r} (timm's Eva pools token, avg, max, avgmax, map or none)": cfg.pool not in _EVA_POOL,
        "dist_token (timm's Eva has no distillation token)": cfg.dist_token,
        "proj_bias=False or mlp_bias=False (timm's Eva projections have biases)": not (cfg.proj_bias and cfg.mlp_bias),
        f"norm_pre={cfg.norm_pre} with patch_bias={cfg.patch_bias} (timm's use_pre_transformer_norm adds norm_pre "
        "and drops the patch bias together)": cfg.norm_pre == cfg.patch_bias,
        f"gelu={cfg.gelu!r} (timm's Eva MLP uses exact GELU)": cfg.mlp_type == "plain" and cfg.gelu != "exact",
        f"pool={cfg.pool!r} with pool_include_prefix={cfg.pool_include_prefix} (timm's Eva pools every token "
        "with its MAP head, the patch tokens otherwise)": cfg.pool in ("gap", "max", "avgmax", "map")
        and cfg.pool_include_prefix != (cfg.pool == "map"),
        f"rope_normalize={cfg.rope_normalize!r} (timm's Eva builds DINOv3 tables with 'separate')": cfg.rope == "dinov3"
        and cfg.rope_normalize != "separate",
        f"fc_norm with final_norm={cfg.final_norm}": cfg.fc_norm and not cfg.final_norm,
    }
    return [what for what, fails in checks.items() if fails]


def _ratio(width: int, hidden: int) -> float:
    """The smallest float r with int(width * r) == hidden, as timm computes a hidden width."""
    r = hidden / width
    while int(width * r) < hidden:
        r = float(np.nextafter(r, np.inf))
    return r


def eva_kwargs(cfg: ViTConfig, qkv: str = "fused") -> dict:
    """Keyword arguments of timm's ``Eva`` for ``cfg`` (JSON values; tuples as lists), ``qkv`` 'fused' or
    'split' (timm ``qkv_fused``). Every keyword an Eva entry point sets is spelled out but ``norm_layer``
    (a class: the model name fixes its eps, ``EVA_NAMES``). A gated MLP is timm's packed ``GluMlp``
    without an inner norm and its split ``SwiGLU`` with one (``scale_mlp``), as ``EvaBlock`` builds them;
    q/v biases without a key bias are ``EvaAttention`` (``attn_type='eva'``), three biases
    ``AttentionRope`` (``'rope'``). Training-time RoPE coordinate augmentation is off.

    Raises:
        ValueError: ``eva_cannot_hold`` names a reason, or ``qkv`` is neither 'fused' nor 'split'.
    """
    if qkv not in ("fused", "split"):
        raise ValueError(f"qkv={qkv!r}; expected 'fused' or 'split'")
    refuse("timm", eva_cannot_hold(cfg.replace(head_bias=True)))
    rope = cfg.rope != "none"
    return dict(
        img_size=list(cfg.image_size),
        patch_size=list(cfg.patch_size),
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        global_pool=_EVA_POOL[cfg.pool],
        embed_dim=cfg.width,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        qkv_bias=cfg.qkv_bias,
        qkv_fused=qkv == "fused",
        qk_norm=cfg.qk_norm,
        mlp_ratio=_ratio(cfg.width, cfg.mlp_dim),
        swiglu_mlp=cfg.mlp_type == "swiglu",
        swiglu_align_to=0,
        scale_mlp=cfg.mlp_inner_norm,
        scale_attn_inner=cfg.attn_inner_norm,
        attn_type="rope" if cfg.qkv_bias and cfg.k_bias else "eva",
        init_values=cfg.layer_scale,
        attn_only_layer_scale=False,
        class_token=cfg.class_token,
        num_reg_tokens=cfg.reg_tokens,
        no_embed_class=not cfg.posemb_prefix,
        use_abs_pos_emb=cfg.posemb != "none",
        use_rot_pos_emb=rope,
        rope_type=cfg.rope if rope else "cat",
        rope_grid_offset=cfg.rope_grid_offset,
        rope_grid_indexing=cfg.rope_grid_indexing,
        rope_temperature=cfg.rope_temperature,
        rope_rotate_half=cfg.rope_layout == "half",
        ref_feat_shape=list(cfg.rope_ref_grid) if cfg.rope == "cat" and cfg.rope_ref_grid else None,
        use_post_norm=False,
        use_pre_transformer_norm=cfg.norm_pre,
        use_post_transformer_norm=cfg.final_norm and not cfg.fc_norm,
        use_fc_norm=cfg.fc_norm,
        attn_pool_num_heads=cfg.map_num_heads if cfg.pool == "map" else None,
        attn_pool_mlp_ratio=_ratio(cfg.width, cfg.map_mlp_width) if cfg.pool == "map" else None,
        dynamic_img_size=cfg.dynamic_img_size,
        dynamic_img_pad=cfg.dynamic_img_pad,
        drop_rate=cfg.dropout,
        pos_drop_rate=cfg.dropout,
        proj_drop_rate=cfg.dropout,
        attn_drop_rate=cfg.attn_dropout,
        drop_path_rate=cfg.drop_path,
    )


def eva_name(cfg: ViTConfig, preferred: str = "") -> str | None:
    """The timm Eva name a hub folder of ``cfg`` names, which fixes its LayerNorm eps: ``preferred`` (given,
    or the source's), else its family's (DINOv3, PE core or spatial, RoPE-ViT mixed or axial, SBB, EVA-02
    by block layout) where it builds ``cfg``'s eps, else any name of that eps (``EVA_NAMES``); None where
    no name builds the eps. Within a family (``EVA_FAMILIES``) the entry point of ``cfg``'s width, depth,
    heads, patch and MLP (``vit_7b_patch16_dinov3`` for a 7B, the image size breaking a tie), else the
    first of its MLP (a tiny SwiGLU DINOv3: ``vit_small_plus_patch16_dinov3``).

    Raises:
        ValueError: ``preferred`` is not one of ``EVA_NAMES`` building ``cfg``'s eps (named, with them).
    """
    if cfg.rope == "dinov3":
        family = "vit_base_patch16_dinov3" + ("_qkvb" if cfg.qkv_bias else "")
    elif cfg.norm_pre:
        family = "vit_pe_core_base_patch16_224" if cfg.final_norm else "vit_pe_spatial_base_patch16_512"
    elif cfg.rope == "mixed" or (cfg.rope == "cat" and cfg.rope_temperature == 100):
        mixed, ape = "_mixed" if cfg.rope == "mixed" else "", "_ape" if cfg.posemb != "none" else ""
        family = f"vit_base_patch16_rope{mixed}{ape}_224"
    elif cfg.reg_tokens and not cfg.class_token:
        family = "vit_base_patch16_rope_reg1_gap_256"
    else:
        family = (
            "eva02_large_patch14_clip_224"
            if cfg.attn_inner_norm
            else "eva02_base_patch14_224"
            if cfg.mlp_inner_norm
            else "eva02_tiny_patch14_224"
        )
    family = _sized(cfg, next(f for f in EVA_FAMILIES if f[0][0] == family))
    check_eva_name(preferred)
    if preferred and EVA_NAMES[preferred] != cfg.ln_eps:
        known = [n for n, eps in EVA_NAMES.items() if eps == cfg.ln_eps]
        raise ValueError(
            f"--timm-architecture {preferred!r}: a hub folder's name fixes the LayerNorm eps, and it is not one "
            f"known to build ln_eps={cfg.ln_eps!r} ({', '.join(known) or 'none is'}); a timm file takes any Eva "
            "name the project knows"
        )
    for name in (preferred, family, *EVA_NAMES):
        if EVA_NAMES.get(name) == cfg.ln_eps:
            return name
    return None


def _sized(cfg: ViTConfig, family: tuple) -> str:
    """The name in ``family`` (rows of ``EVA_FAMILIES``) of ``cfg``'s shape (see ``eva_name``)."""
    same_mlp = [row for row in family if row[6] == cfg.mlp_type] or list(family)
    shape = (cfg.width, cfg.depth, cfg.num_heads, cfg.patch_size[0], cfg.mlp_type)
    exact = [row[0] for row in same_mlp if row[2:] == shape]
    at_size = [name for name in exact if name.endswith(f"_{cfg.image_size[0]}")]
    return (at_size or exact or [same_mlp[0][0]])[0]


def check_eva_name(name: str) -> None:
    """Refuse a timm Eva name (``TimmWriteOptions.architecture``) not in ``EVA_NAMES``; '' (unset) passes.

    Raises:
        ValueError: one line naming ``name`` and the names taken.
    """
    if name and name not in EVA_NAMES:
        raise ValueError(f"--timm-architecture {name!r}: expected a timm Eva name ({', '.join(EVA_NAMES)})")


def eva_load_call(path: str, cfg: ViTConfig, qkv: str, name: str | None) -> str:
    """Python code building timm's Eva for ``cfg`` (``timm.create_model(name, pretrained=False, **kwargs)``,
    any Eva ``name`` timm registers, ``eva02_tiny_patch14_224`` for None,
    with every keyword of ``eva_kwargs``, run-time dropout at 0, and ``norm_layer`` of ``cfg``'s eps) and
    loading the file at ``path`` into it with ``strict=True``; a .pth, .pt or .bin through ``torch.load(
    weights_only=True)``."""
    kw = eva_kwargs(cfg.replace(dropout=0.0, attn_dropout=0.0, drop_path=0.0), qkv)
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items() if not k.endswith("drop_rate")}
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    load = (
        ["import torch", f"state = torch.load({path!r}, weights_only=True)"]
        if path.endswith((".pth", ".pt", ".bin"))
        else ["from safetensors.torch import load_file", f"state = load_file({path!r})"]
    )
    return "\n".join(
        ["import timm", "from functools import partial", "from timm.layers import LayerNorm", *load]
        + [
            f"model = timm.create_model({name or 'eva02_tiny_patch14_224'!r}, pretrained=False, {args}, "
            f"norm_layer=partial(LayerNorm, eps={cfg.ln_eps!r}))",
            "model.load_state_dict(state, strict=True)",
        ]
    )
