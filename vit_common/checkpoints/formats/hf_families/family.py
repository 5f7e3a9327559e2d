"""``Family``: the rules one transformers model type follows in the hf_family format
(``vit_common.checkpoints.formats.hf_families``, which holds its ``FORMAT``; this module has none).

Each family module of this package (``siglip``, ``clip``, ``dinov2``, ``vit_mae``, ``vit_msn``, ``ijepa``,
``aimv2``, ``radio``) holds its model types as ``Family`` objects in a table ``FAMILIES`` (model_type -> ``Family``):
the data every model type has (block style, transformers' config defaults, architectures, what the model
type fixes, what is refused by name), and, in a subclass, the methods a family overrides: the config.json
keys it reads beyond the common ones (``read_block``, ``read_mlp``, ``read_registers``, ``read_pool``),
where its patch embedding is and its shape (``patch_key``, ``patch_dims``), the image size
(``read_image_size``), its tensor rules (``rules``), the models it holds when
written (``holds``) and what else it cannot hold (``checks``), the config.json it writes
(``config_json``, ``config_keys``) and whether its fixed position table is kept (``keeps_posemb``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.hf_common import ACT_TO_GELU
from vit_common.checkpoints.formats.hf_families import layout
from vit_common.checkpoints.formats.provenance import Origin, declared
from vit_common.checkpoints.formats.rules import LAYERNORM_ALL_BIASES, Rule, norm_and_bias_checks
from vit_common.config import ViTConfig

# transformers' config defaults every family shares; a family's own ``defaults`` add to them or replace them
COMMON_DEFAULTS = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    num_channels=3,
    image_size=224,
)


class FamilyConfig:
    """config.json values (a two-tower folder's ``vision_config``) with provenance: a missing key is the
    family's transformers default (declared: that is what transformers builds)."""

    def __init__(self, config: Mapping[str, Any], defaults: Mapping[str, Any], context: str):
        self.config, self.defaults, self.context = config, {**COMMON_DEFAULTS, **defaults}, context

    def get(self, key: str, types: tuple) -> tuple[Any, Origin]:
        if key not in self.config:
            return self.defaults[key], declared(f"transformers' default for a missing {key}")
        v = self.config[key]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise FormatError(f"{self.context}: config.json {key}={v!r} is not a {names}")
        return v, declared(f"config.json {key}")


@dataclass(frozen=True)
class Family:
    """One transformers model type: its block style (``hf_common.BLOCK_KEYS``: 'clip', 'dinov2' or 'vit'),
    config defaults (transformers 5.24's config class), the architectures it reads (name -> (prefix of
    the backbone's tensors, head kind)) and how its position embedding is resampled; ``two_tower``: an
    image and a text tower (read as its image tower, written as the vision model type); the fields the
    model type fixes (``class_token``, ``patch_bias``, ``norm_pre``); ``refused``: architectures refused
    by name (-> what the twins lack); ``on_request``: written only when ``--hf-model-type`` names it;
    ``note``: a note every read of it carries."""

    style: str
    defaults: Mapping[str, Any]
    architectures: Mapping[str, tuple[str, str]]
    resample: str = "bicubic"
    two_tower: bool = False
    class_token: bool = True
    patch_bias: bool = True
    norm_pre: bool = False
    refused: Mapping[str, str] = field(default_factory=dict)
    on_request: bool = False
    note: str = ""

    def fixed(self) -> dict[str, Any]:
        """The fields the model type fixes (not in config.json): class token, patch bias, norm_pre, and
        what no family has."""
        return dict(
            class_token=self.class_token,
            patch_bias=self.patch_bias,
            norm_pre=self.norm_pre,
            dist_token=False,
            head_dist=False,
            qk_norm=False,
            fc_norm=False,
            rep_size=0,
            posemb="learn",
            pool_include_prefix=False,
            **LAYERNORM_ALL_BIASES,
        )

    def patch_key(self) -> str:
        """The patch embedding's weight under the backbone's prefix."""
        if self.style == "clip":
            return "embeddings.patch_embedding.weight"
        return "embeddings.patch_embeddings.projection.weight"

    def patch_dims(self, cj: FamilyConfig, shape: tuple[int, ...], key: str) -> tuple[int, int, int, int]:
        """(D, C, P_h, P_w) of the patch embedding's weight ``key`` of ``shape``: a 4-D convolution."""
        if len(shape) != 4:
            raise FormatError(f"{cj.context}: {key} has shape {tuple(shape)}, not a 4-D patch convolution")
        return shape

    def read_image_size(self, cj: FamilyConfig) -> tuple[Any, Origin]:
        """(config.json ``image_size``: an int or [H, W], its origin)."""
        return cj.get("image_size", (int, list))

    def read_block(
        self, cj: FamilyConfig, fields: dict[str, Any], type_origin: Origin
    ) -> tuple[dict[str, Any], dict[str, Origin]]:
        """(fields, their origins) of the activation and the norms given the ``fields`` read so far:
        config.json ``hidden_act`` (a GELU) and ``layer_norm_eps`` (LayerNorms)."""
        act, act_origin = cj.get("hidden_act", (str,))
        if act not in ACT_TO_GELU:
            raise FormatError(
                f"{cj.context}: config.json hidden_act={act!r}: the twins implement {', '.join(ACT_TO_GELU)}"
            )
        eps, eps_origin = cj.get("layer_norm_eps", (float, int))
        return {"gelu": ACT_TO_GELU[act], "ln_eps": eps}, {"gelu": act_origin, "ln_eps": eps_origin}

    def read_mlp(self, cj: FamilyConfig, width: int, origin: Origin) -> tuple[dict[str, Any], dict[str, Origin]]:
        """(fields, their origins) of the MLP of a model of ``width``: config.json ``intermediate_size``,
        a plain MLP (``origin``: the model type's)."""
        mlp_dim, mlp_origin = cj.get("intermediate_size", (int,))
        return {"mlp_dim": mlp_dim, "mlp_type": "plain"}, {"mlp_dim": mlp_origin, "mlp_type": origin}

    def read_registers(self, cj: FamilyConfig, origin: Origin) -> tuple[int, Origin]:
        """(register tokens, their origin): none (``origin``: the model type's)."""
        return 0, origin

    def read_pool(
        self, cj: FamilyConfig, arch: str, head: str, arch_origin: Origin, type_origin: Origin, has_head: bool = True
    ) -> tuple[str, Origin, str]:
        """(pool, its origin, why the file's MAP head tensors go unused or ''): the architecture's head kind
        (``head``; 'project' pools the class token). ``has_head``: the folder holds ``head.*`` tensors."""
        return ("token" if head == "project" else head), arch_origin, ""

    def read_tensors(
        self, cj: FamilyConfig, tensors: Mapping[str, Any], prefix: str
    ) -> tuple[dict[str, Any], dict[str, Origin], dict[str, str]]:
        """(fields, their origins, file tensors the rules do not read -> why unused, '' where read into a
        field): what the model type keeps in tensors besides its weights (RADIO's buffers); none."""
        return {}, {}, {}

    def unpack(self, cfg: ViTConfig, tensors: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """The file's tensors as ``rules`` read them: as they are."""
        return dict(tensors)

    def pack(self, cfg: ViTConfig, tensors: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """Inverse of ``unpack`` for writing, with the tensors ``read_tensors`` reads: as they are."""
        return dict(tensors)

    def holds(self, cfg: ViTConfig) -> str | None:
        """The architecture of this model type that holds ``cfg``'s outputs when written, or None."""
        return None

    def checks(self, cfg: ViTConfig) -> dict[str, bool]:
        """What this model type cannot hold beyond the checks every family makes (``unsupported`` checks):
        the AIMv2-style norm and biases."""
        return norm_and_bias_checks(cfg)

    def keeps_posemb(self, cfg: ViTConfig) -> bool:
        """Whether ``cfg``'s fixed position embedding is written as is (else as a learned table)."""
        return False

    def rules(self, cfg: ViTConfig, spelling: str, prefix: str, layer_prefix: str, head: str) -> list[Rule]:
        """File <-> canonical rules of the block style (``layout.rules``)."""
        return layout.rules(cfg, self.style, spelling, prefix, layer_prefix, head)

    def config_json(self, cfg: ViTConfig, common: dict[str, Any]) -> dict[str, Any]:
        """The config.json: the keys every family writes (``common``) and ``config_keys``."""
        return common | self.config_keys(cfg)

    def config_keys(self, cfg: ViTConfig) -> dict[str, Any]:
        """config.json keys of this model type for ``cfg`` beyond the ones every family writes: the MLP
        width, and qkv_bias in the 'vit' style (SigLIP's and CLIP's blocks always have the biases)."""
        keys: dict[str, Any] = {"intermediate_size": cfg.mlp_dim}
        return keys | ({"qkv_bias": cfg.qkv_bias} if self.style == "vit" else {})


def plain_vit(cfg: ViTConfig) -> bool:
    """Whether ``cfg`` is a plain ViT pooling its class token (no norm_pre, no LayerScale): what ViT-MAE's
    and ViT-MSN's models hold."""
    return cfg.class_token and cfg.pool == "token" and not cfg.norm_pre and cfg.layer_scale is None
