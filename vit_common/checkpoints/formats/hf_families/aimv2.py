"""AIMv2 (transformers ``aimv2_vision_model`` and ``aimv2``) in the hf_family format.

``Aimv2VisionModel``: no class token, the patch convolution (with bias) followed by an RMSNorm
(``embeddings.rms_norm`` = patch_norm), a learned ``position_embedding`` [N, D] at one fixed size, or with
``is_native`` the MAE-style 2-D sin-cos table built at every size (posemb 'sincos2d_mae', any size);
blocks of RMSNorms, separate q/k/v/out projections (all four biased iff ``qkv_bias``) and a SwiGLU
``ffn`` (``gate_proj``, ``up_proj``, ``down_proj``, biased iff ``mlp_bias``; ``hidden_act`` silu), a final
``rms_norm``; the output is the attention probe (``head.*``: pool 'probe') where ``use_head``, else every
token (pool 'none'; also where config.json leaves ``use_head`` unset and holds no ``head.*`` tensors).
``Aimv2Model`` (``aimv2``) is read as its ``vision_model.*`` tower with the bias-free ``visual_projection``
as the head; its text tower and ``logit_scale`` are ignored. Written as
``Aimv2VisionModel``. Sources: transformers 5.24 ``models/aimv2/modeling_aimv2.py`` and
``configuration_aimv2.py``.
"""

from __future__ import annotations

from typing import Any

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf_families.family import Family, FamilyConfig
from vit_common.checkpoints.formats.provenance import Origin, derived
from vit_common.checkpoints.formats.rules import Piece, Rule, copy
from vit_common.config import ViTConfig

# transformers 5.24 Aimv2VisionConfig defaults beyond the common ones
_AIMV2 = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=24,
    num_attention_heads=8,
    patch_size=14,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    qkv_bias=False,
    mlp_bias=False,
    use_head=True,
    is_native=False,
)


class AIMv2(Family):
    """AIMv2's rules: RMSNorm, its own tensor names, the sin-cos table of native models, the probe."""

    def patch_key(self) -> str:
        return "embeddings.patch_embed.weight"

    def read_block(
        self, cj: FamilyConfig, fields: dict[str, Any], type_origin: Origin
    ) -> tuple[dict[str, Any], dict[str, Origin]]:
        """RMSNorm with ``rms_norm_eps``, silu only (a SwiGLU), out_proj biased as q/k/v, the MLP's biases
        (``mlp_bias``), and the position table (``is_native``: a sin-cos table at every size)."""
        act, act_origin = cj.get("hidden_act", (str,))
        if act != "silu":
            raise FormatError(f"{cj.context}: config.json hidden_act={act!r}: AIMv2's SwiGLU takes silu only")
        eps, eps_origin = cj.get("rms_norm_eps", (float, int))
        mlp_bias, bias_origin = cj.get("mlp_bias", (bool,))
        native, native_origin = cj.get("is_native", (bool,))
        out = {
            "gelu": "exact",  # inert: a SwiGLU
            "ln_eps": eps,
            "norm": "rmsnorm",
            "patch_norm": True,
            "proj_bias": fields["qkv_bias"],
            "mlp_bias": mlp_bias,
            "posemb": "sincos2d_mae" if native else "learn",
            "posemb_prefix": False,
            "dynamic_img_size": native,
        }
        origins = {"gelu": act_origin, "ln_eps": eps_origin, "norm": type_origin, "patch_norm": type_origin}
        origins |= {"mlp_bias": bias_origin, "posemb": native_origin, "posemb_prefix": type_origin}
        return out, origins | {"proj_bias": type_origin}

    def read_mlp(self, cj: FamilyConfig, width: int, origin: Origin) -> tuple[dict[str, Any], dict[str, Origin]]:
        mlp_dim, mlp_origin = cj.get("intermediate_size", (int,))
        return {"mlp_dim": mlp_dim, "mlp_type": "swiglu"}, {"mlp_dim": mlp_origin, "mlp_type": origin}

    def read_pool(
        self, cj: FamilyConfig, arch: str, head: str, arch_origin: Origin, type_origin: Origin, has_head: bool = True
    ) -> tuple[str, Origin, str]:
        """The probe where ``use_head`` (transformers' default True) and its tensors are there; every token
        where config.json says ``use_head=false``, or leaves it unset and the folder holds no ``head.*``
        tensors. The caller checks the head's tensors (a folder that declares ``use_head=true`` without
        them is refused by its missing-tensor list)."""
        if head == "project":
            return "probe", arch_origin, ""
        if "use_head" not in cj.config and not has_head:
            return "none", derived("no head.* tensors (config.json leaves use_head unset)"), ""
        use_head, origin = cj.get("use_head", (bool,))
        return ("probe" if use_head else "none"), origin, ""

    def holds(self, cfg: ViTConfig) -> str | None:
        """``Aimv2VisionModel``: RMSNorm, a patch norm, a SwiGLU, no class or register token, the probe or
        every token, no classes."""
        if (
            cfg.norm == "rmsnorm"
            and cfg.patch_norm
            and cfg.mlp_type == "swiglu"
            and not cfg.num_prefix_tokens
            and cfg.pool in ("probe", "none")
            and not cfg.num_classes
        ):
            return "Aimv2VisionModel"
        return None

    def checks(self, cfg: ViTConfig) -> dict[str, bool]:
        return {
            f"proj_bias={cfg.proj_bias} with qkv_bias={cfg.qkv_bias} (AIMv2's out_proj is biased as q/k/v)": (
                cfg.proj_bias != cfg.qkv_bias
            ),
            f"posemb={cfg.posemb!r} (AIMv2 has a learned table or, native, sincos2d_mae)": cfg.posemb
            not in ("learn", "sincos2d_mae"),
            "dynamic_img_size with a learned table (transformers' AIMv2 takes one size)": cfg.posemb == "learn"
            and cfg.dynamic_img_size,
        }

    def keeps_posemb(self, cfg: ViTConfig) -> bool:
        return cfg.posemb == "sincos2d_mae"

    def config_json(self, cfg: ViTConfig, common: dict[str, Any]) -> dict[str, Any]:
        """AIMv2's keys: silu, ``rms_norm_eps`` (no ``layer_norm_eps``), biases, the head, ``is_native``."""
        out = {k: v for k, v in common.items() if k != "layer_norm_eps"}
        return out | {
            "hidden_act": "silu",
            "rms_norm_eps": cfg.ln_eps,
            "intermediate_size": cfg.mlp_dim,
            "qkv_bias": cfg.qkv_bias,
            "mlp_bias": cfg.mlp_bias,
            "use_head": cfg.pool == "probe",
            "is_native": cfg.posemb == "sincos2d_mae",
        }

    def rules(self, cfg: ViTConfig, spelling: str, prefix: str, layer_prefix: str, head: str) -> list[Rule]:
        """File <-> canonical rules: the table above (one key spelling; ``layer_prefix`` is ``prefix``)."""
        d, f = cfg.width, cfg.mlp_dim
        ph, pw = cfg.patch_size
        e = prefix + "embeddings."
        r = [
            copy(e + "patch_embed.weight", "patch_embed.proj.weight", (d, cfg.in_chans, ph, pw)),
            copy(e + "patch_embed.bias", "patch_embed.proj.bias", (d,)),
            copy(e + "rms_norm.weight", "patch_embed.norm.weight", (d,)),
        ]
        if cfg.posemb == "learn":
            n = cfg.num_patches
            r.append(Rule("pos_embed", (Piece(e + "position_embedding.weight", (n, d), reshape=(1, n, d)),)))
        for i in range(cfg.depth):
            p, b = f"{prefix}encoder.layers.{i}.", f"blocks.{i}."
            r.append(copy(p + "rms_norm1.weight", b + "norm1.weight", (d,)))
            qkv = tuple(f"{p}attention.{n}_proj" for n in "qkv")
            r.append(Rule(b + "attn.qkv.weight", tuple(Piece(k + ".weight", (d, d)) for k in qkv)))
            if cfg.qkv_bias:
                r.append(Rule(b + "attn.qkv.bias", tuple(Piece(k + ".bias", (d,)) for k in qkv)))
            r.append(copy(p + "attention.out_proj.weight", b + "attn.proj.weight", (d, d)))
            if cfg.proj_bias:
                r.append(copy(p + "attention.out_proj.bias", b + "attn.proj.bias", (d,)))
            r.append(copy(p + "rms_norm2.weight", b + "norm2.weight", (d,)))
            gate_up = (p + "ffn.gate_proj", p + "ffn.up_proj")  # our fc1: gate rows first
            r.append(Rule(b + "mlp.fc1.weight", tuple(Piece(k + ".weight", (f, d)) for k in gate_up)))
            r.append(copy(p + "ffn.down_proj.weight", b + "mlp.fc2.weight", (d, f)))
            if cfg.mlp_bias:
                r.append(Rule(b + "mlp.fc1.bias", tuple(Piece(k + ".bias", (f,)) for k in gate_up)))
                r.append(copy(p + "ffn.down_proj.bias", b + "mlp.fc2.bias", (d,)))
        r.append(copy(prefix + "rms_norm.weight", "norm.weight", (d,)))
        if cfg.pool == "probe":
            h = prefix + "head."
            r.append(copy(h + "cls_token", "attn_pool.latent", (1, 1, d)))
            r.append(Rule("attn_pool.kv.weight", tuple(Piece(f"{h}{n}_proj.weight", (d, d)) for n in "kv")))
            if cfg.qkv_bias:
                r.append(Rule("attn_pool.kv.bias", tuple(Piece(f"{h}{n}_proj.bias", (d,)) for n in "kv")))
            r += [
                copy(f"{h}output_proj.{w}", f"attn_pool.proj.{w}", s) for w, s in (("weight", (d, d)), ("bias", (d,)))
            ]
        if cfg.num_classes:
            r.append(copy("visual_projection.weight", "head.weight", (cfg.num_classes, d)))
        return r


FAMILIES: dict[str, Family] = {
    "aimv2_vision_model": AIMv2("aimv2", _AIMV2, {"Aimv2VisionModel": ("", "probe")}, class_token=False),
    "aimv2": AIMv2("aimv2", _AIMV2, {"Aimv2Model": ("vision_model.", "project")}, two_tower=True, class_token=False),
}
