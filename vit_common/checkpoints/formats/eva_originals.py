"""The original checkpoints of EVA-02 (BAAI's ``EVA/EVA-02`` ``.pt``: ``mlp.w1/w2/w3``, ``mlp.w12``,
``mlp.ffn_ln``, ``attn.inner_attn_ln``, ``q_bias``/``v_bias``, ``rope.freqs_cos/sin``) and of the
Perception Encoder (Meta's ``perception_models`` ``.pt``: ``conv1``, ``class_embedding``,
``positional_embedding``, ``ln_pre``, ``transformer.resblocks.{i}`` with ``ln_1``, ``attn.in_proj_*``,
``ls_1.gamma``, ``mlp.c_fc``/``c_proj``, ``ln_post``, ``attn_pool.probe``/``attn.in_proj_*``/``layernorm``
and the visual ``proj``), optionally under ``visual.``: read only, weights-only loads (torch's
``weights_only=True`` reader, a training checkpoint's ``model``/``module`` entry as timm takes it).

The keys are mapped as timm's own converters map them (``timm/models/eva.py``: ``checkpoint_filter_fn``
for EVA-02, ``_convert_pe`` for PE; ``eva02_to_eva`` and ``pe_to_eva`` here), into timm's Eva names, then
to the canonical state (``timm_eva.eva_to_canonical``). What timm discards is dropped and listed: EVA-02's
fixed RoPE tables (recomputed), a MIM checkpoint's ``mask_token`` and ``lm_head``, a PE file's text
tower. The visual ``proj`` [D, E] is PE's bias-free head: ``head.weight`` = its transpose with a zero
``head.bias``, as timm writes it.

The files store no config. Shapes derive the sizes, the block layout (fused or split q/k/v, q/v biases,
packed or split SwiGLU, inner norms, LayerScale), the class token, the position table, the pooling of
files with a MAP head or fc_norm and the heads; each family's code fixes the rest, which is assumed and
warned (``--set FIELD=VALUE`` overrides): head_dim 64 (``num_heads`` = D / 64; PE G/14 has 96), LayerNorm
eps (EVA-02 1e-6, PE 1e-5), RoPE ``cat`` at temperature 10000 (EVA-02: ``ij``, positions rescaled to the
16 x 16 grid of its 224 px pretraining; PE: ``xy``, offset 1 after the class token, rescaled to the
file's own grid, as timm's ``ref_feat_shape``), PE's MAP head of 8 heads, and PE spatial's pooling
(none in Meta's model, which returns patch features: timm's average, as ``vit_pe_spatial_*`` builds it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Format, Reference, Source
from vit_common.checkpoints.formats.provenance import assumed, build_config, derived, posemb_layout, shape_fields
from vit_common.checkpoints.formats.rules import copy, to_canonical
from vit_common.checkpoints.formats.source import TORCH_SUFFIXES
from vit_common.checkpoints.formats.tensors import LazyTensor, Tensor, TensorMap, dtype_of, row_slice
from vit_common.checkpoints.formats.timm_eva import eva_to_canonical, layout_note
from vit_common.config import ViTConfig
from vit_common.data.images import Preprocess
from vit_common.state import canonical_shapes

# timm _convert_pe's renames, in its order ('ln_' after 'ln_pre' and 'ln_post').
_PE_SWAPS = (
    ("conv1", "patch_embed.proj"),
    ("positional_embedding", "pos_embed"),
    ("transformer.resblocks.", "blocks."),
    ("ln_pre", "norm_pre"),
    ("ln_post", "norm"),
    ("ln_", "norm"),
    ("ls_1.gamma", "gamma_1"),
    ("ls_2.gamma", "gamma_2"),
    ("in_proj_", "qkv."),
    ("out_proj", "proj"),
    ("mlp.c_fc", "mlp.fc1"),
    ("mlp.c_proj", "mlp.fc2"),
)
# timm checkpoint_filter_fn's EVA-02 renames, in its order ('w12' before 'w1').
_EVA02_SWAPS = (
    ("mlp.ffn_ln", "mlp.norm"),
    ("attn.inner_attn_ln", "attn.norm"),
    ("mlp.w12", "mlp.fc1"),
    ("mlp.w1", "mlp.fc1_g"),
    ("mlp.w2", "mlp.fc1_x"),
    ("mlp.w3", "mlp.fc2"),
)


def family_of(keys) -> str | None:
    """'pe' (a Perception Encoder original), 'eva02' (an EVA-02 original) or None, from the key names."""
    keys = set(keys)
    for prefix in ("visual.", ""):
        if f"{prefix}conv1.weight" in keys and f"{prefix}transformer.resblocks.0.ln_1.weight" in keys:
            return "pe"
        b = f"{prefix}blocks.0."
        if any(k in keys for k in (f"{b}mlp.w3.weight", f"{b}mlp.ffn_ln.weight", f"{b}attn.inner_attn_ln.weight")):
            return "eva02"
    return None


def _reshaped(v: Tensor, shape: tuple[int, ...]) -> LazyTensor:
    return LazyTensor(shape, dtype_of(v), lambda: np.asarray(v).reshape(shape))


def pe_to_eva(state: TensorMap) -> tuple[dict[str, Tensor], list[tuple[str, str]]]:
    """(a PE original's tensors in timm's Eva names, the tensors dropped with why), as timm's
    ``_convert_pe`` maps them: the ``visual.`` tower when there is one, its fused ``attn_pool`` in_proj
    split into ``q`` and ``kv``, ``proj`` [D, E] as ``head.weight`` [E, D] with a zero ``head.bias``."""
    prefix = "visual." if "visual.conv1.weight" in state else ""
    out: dict[str, Tensor] = {}
    dropped = []
    for key, v in state.items():
        if not key.startswith(prefix):
            dropped.append((key, "not the visual tower"))
            continue
        k = key[len(prefix) :]
        for a, b in _PE_SWAPS:
            k = k.replace(a, b)
        if k.startswith("attn_pool"):
            k = k.replace("attn_pool.attn", "attn_pool").replace("attn_pool.layernorm", "attn_pool.norm")
            k = k.replace("attn_pool.probe", "attn_pool.latent")
            if k.startswith("attn_pool.qkv."):
                leaf, d = k.rsplit(".", 1)[1], np.shape(v)[0] // 3
                out[f"attn_pool.q.{leaf}"], out[f"attn_pool.kv.{leaf}"] = row_slice(v, 0, d), row_slice(v, d, 3 * d)
                continue
        elif k == "proj":
            e = np.shape(v)[1]
            out["head.weight"] = LazyTensor((e, np.shape(v)[0]), dtype_of(v), lambda v=v: np.asarray(v).T.copy())
            out["head.bias"] = np.zeros((e,), dtype_of(v))
            continue
        elif k == "class_embedding":
            k, v = "cls_token", _reshaped(v, (1, 1, *np.shape(v)))
        elif k == "pos_embed":
            v = _reshaped(v, (1, *np.shape(v)))
        out[k] = v
    return out, dropped


def eva02_to_eva(state: TensorMap) -> tuple[dict[str, Tensor], list[tuple[str, str]]]:
    """(an EVA-02 original's tensors in timm's Eva names, the tensors dropped with why), as timm's
    ``checkpoint_filter_fn`` maps them (an EVA-CLIP ``visual.`` tower's too); a MIM checkpoint's final
    ``norm`` stays the model's norm (timm moves it to ``fc_norm`` as a fine-tuning start)."""
    prefix = "visual." if "visual.blocks.0.norm1.weight" in state else ""
    split = f"{prefix}blocks.0.attn.q_proj.weight" in state
    out: dict[str, Tensor] = {}
    dropped = []
    for key, v in state.items():
        k = key[len(prefix) :] if key.startswith(prefix) else None
        if k is None:
            dropped.append((key, "not the visual tower"))
        elif "rope" in k and k != "rope.freqs":
            dropped.append((key, "EVA-02's fixed RoPE table, recomputed from the config"))
        elif k in ("mask_token", "lm_head.weight", "lm_head.bias"):
            dropped.append((key, "masked-image-modelling pretraining only"))
        else:
            for a, b in _EVA02_SWAPS:
                k = k.replace(a, b)
            if split:
                k = k.replace("q_bias", "q_proj.bias").replace("v_bias", "v_proj.bias")
            out[k] = v
    return out, dropped


def _infer(family: str, t: Mapping[str, Tensor], overrides: Mapping, context: str) -> tuple[ViTConfig, dict]:
    """(the config, its provenance) of canonical tensors ``t`` of ``family`` ('pe' | 'eva02'); see the
    module docstring."""
    proj = t.get("patch_embed.proj.weight")
    if proj is None or np.ndim(proj) != 4 or "blocks.0.mlp.fc2.weight" not in t:
        raise FormatError(f"{context}: no 4-D patch embedding or block 0 MLP after mapping the {family} keys")
    d, c, ph, pw = (int(n) for n in np.shape(proj))
    depth = 0
    while f"blocks.{depth}.norm1.weight" in t:
        depth += 1
    f_out, f_in = np.shape(t["blocks.0.mlp.fc1.weight"])[0], np.shape(t["blocks.0.mlp.fc2.weight"])[1]
    f, prov = shape_fields(patch_size=(ph, pw), in_chans=c, width=d, depth=depth, mlp_dim=int(f_in))
    pe = family == "pe"
    flags = dict(
        mlp_type="swiglu" if f_out == 2 * f_in else "plain",
        qkv_bias="blocks.0.attn.qkv.bias" in t or "blocks.0.attn.q_bias" in t,
        k_bias="blocks.0.attn.q_bias" not in t,
        attn_inner_norm="blocks.0.attn.norm.weight" in t,
        mlp_inner_norm="blocks.0.mlp.norm.weight" in t,
        class_token="cls_token" in t,
        patch_bias="patch_embed.proj.bias" in t,
        norm_pre="norm_pre.weight" in t,
        fc_norm="fc_norm.weight" in t,
        final_norm="norm.weight" in t or "fc_norm.weight" in t,
        num_classes=int(np.shape(t["head.weight"])[0]) if "head.weight" in t else 0,
        head_bias="head.bias" in t,
        layer_scale=1.0 if "blocks.0.ls1.gamma" in t else None,
        posemb="learn" if "pos_embed" in t else "none",
    )
    f |= flags
    prov |= {k: derived("tensors present") for k in flags}
    if "attn_pool.latent" in t:
        f |= dict(pool="map", pool_include_prefix=True, map_mlp_dim=int(np.shape(t["attn_pool.mlp.fc1.weight"])[0]))
        f["map_heads"], prov["map_heads"] = 8, assumed("not stored; perception_models' attention pool has 8 heads")
        prov |= {k: derived("attn_pool tensors: PE's attention pooling") for k in ("pool", "map_mlp_dim")}
    elif f["fc_norm"]:
        f["pool"], prov["pool"] = "gap", derived("fc_norm: EVA-02's mean pooling of the patch tokens")
    elif pe:  # PE spatial: Meta's model returns the patch features; timm's pools them (global_pool 'avg')
        f["pool"], prov["pool"] = "gap", assumed("no attention pool: timm's vit_pe_spatial average (global_pool 'avg')")
    else:
        f["pool"], prov["pool"] = "token", assumed("not stored; EVA-02's class token without fc_norm")
    grid = None
    if f["posemb"] == "learn":
        grid, f["posemb_prefix"], prov["posemb_prefix"] = posemb_layout(
            np.shape(t["pos_embed"])[1], int(f["class_token"]), None, "pos_embed", context
        )
    gh, gw = grid or (224 // ph, 224 // pw)
    f["image_size"], prov["image_size"] = (gh * ph, gw * pw), derived("pos_embed rows") if grid else assumed("224")
    code = "perception_models" if pe else "EVA-02"
    f["num_heads"], prov["num_heads"] = max(1, d // 64), assumed(f"not stored; {code}'s head_dim 64 (width / 64)")
    f["ln_eps"] = 1e-5 if pe else 1e-6
    prov["ln_eps"] = assumed(f"not stored; {code}'s LayerNorm eps {f['ln_eps']:g}")
    f["gelu"], prov["gelu"] = "exact", assumed(f"not stored; {code}'s nn.GELU (exact erf)")
    rope = dict(rope="cat", rope_temperature=10000.0, rope_layout="interleaved")
    if pe:
        rope |= dict(rope_grid_indexing="xy", rope_grid_offset=float(f["class_token"]), rope_ref_grid=(gh, gw))
        why = "not stored; perception_models' 2-D RoPE: xy, offset 1 after the class token, at the file's own grid"
    else:
        rope |= dict(rope_grid_indexing="ij", rope_grid_offset=0.0, rope_ref_grid=(16, 16))
        why = "not stored; EVA-02's RoPE: ij, positions rescaled to its 224 px pretraining grid (pt_hw_seq_len 16)"
    f |= rope
    prov |= {k: assumed(why) for k in rope}
    return build_config(f, prov, overrides, context, t), prov


class EvaOriginals(Format):
    name = "eva_original"
    description = "EVA-02 (BAAI) and Perception Encoder (Meta perception_models) original .pt weights (read only)"
    signature = "blocks.0.mlp.w3 / ffn_ln (EVA-02) or conv1 + transformer.resblocks (PE)"
    reference = Reference("timm", "state_dict")
    assumed_preprocess = Preprocess(
        (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711), "bicubic", 0.9, "center"
    )
    assumed_why = "the files store none; OpenAI CLIP's mean/std as timm's eva02 configs (timm's PE configs use 0.5/0.5)"

    def detect(self, src: Source) -> bool:
        return src.container == "torch" and family_of(src.tensors) is not None

    def read(self, src: Source, opts) -> Decoded:
        family = family_of(src.tensors)
        if family is None:
            raise FormatError(f"{src.context}: neither an EVA-02 nor a Perception Encoder original")
        eva, dropped = (pe_to_eva if family == "pe" else eva02_to_eva)(src.tensors)
        t = eva_to_canonical(eva)
        cfg, prov = _infer(family, t, dict(opts.overrides), src.context)
        state = to_canonical([copy(n, n, s) for n, s in canonical_shapes(cfg).items()], t, src.context)
        name = "Perception Encoder" if family == "pe" else "EVA-02"
        layout = f"{name} original (keys as timm's converter maps them){layout_note(eva)}"  # kept by a timm write
        return Decoded(cfg, state, layout, prov, dropped, [])

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        return ["the original EVA-02 / PE layouts are read, not written (write timm: --to timm)"]

    def encode(self, cfg, state, path: Path, options, assumed=()) -> Encoded:
        raise ValueError(f"the {self.name} format is read only: {self.cannot_hold(cfg)[0]}")

    def needs(self, path: Path) -> str | None:
        return "torch" if Path(path).suffix in TORCH_SUFFIXES else None


FORMAT = EvaOriginals()
