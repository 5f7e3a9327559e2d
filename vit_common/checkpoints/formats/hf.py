"""Hugging Face transformers ViT and DeiT folders (config.json + weights) <-> the canonical state.

config.json decides the model: ``model_type`` 'vit' or 'deit' (DeiT adds a distillation token after the
class token) and ``architectures`` which head reads it:

================================================ ==================================================
architecture                                     output
================================================ ==================================================
ViTModel, DeiTModel                              backbone; with ``pooler.dense`` tensors the pooler
                                                 (dense + tanh on the class token: our pre-logits)
ViTForImageClassification,                       ``classifier`` on the class token; a ``pooler`` in
DeiTForImageClassification                       the file is not part of the model: ignored, reported
DeiTForImageClassificationWithTeacher            mean of ``cls_classifier`` (class token) and
                                                 ``distillation_classifier`` (distillation token):
                                                 our head and head_dist
================================================ ==================================================

Every structural field comes from config.json (a missing key means transformers' default, as it does
when transformers loads the folder) and is checked against the tensors, which must all be there: a layer
absent from every shard is an error, never a shallower model. Sharded folders are read through their
index. Two key spellings exist. ``save_pretrained`` writes the v4 one in transformers 4 and 5; the v5
module names appear in ``state_dict()`` of transformers 5 models and in files saved from it directly:

===================== =============================================== ===================================
canonical             v4 (files)                                      v5 (transformers 5 modules)
===================== =============================================== ===================================
blocks.i.norm1        encoder.layer.i.layernorm_before                layers.i.layernorm_before
blocks.i.attn.qkv     encoder.layer.i.attention.attention.{query,     layers.i.attention.{q,k,v}_proj
                      key,value} (concatenated, rows [q; k; v])
blocks.i.attn.proj    encoder.layer.i.attention.output.dense          layers.i.attention.o_proj
blocks.i.norm2        encoder.layer.i.layernorm_after                 layers.i.layernorm_after
blocks.i.mlp.fc1/fc2  encoder.layer.i.intermediate.dense /            layers.i.mlp.fc1 / fc2
                      encoder.layer.i.output.dense
===================== =============================================== ===================================

Embeddings are ``embeddings.{cls_token, distillation_token, position_embeddings,
patch_embeddings.projection}``, the final norm ``layernorm``; task models prefix these with ``vit.`` or
``deit.``. ``hidden_act`` 'gelu' / 'gelu_python' = exact erf, 'gelu_pytorch_tanh' / 'gelu_new' = the tanh
approximation, 'quick_gelu' = x sigmoid(1.702 x); LayerNorm eps defaults to 1e-12. SigLIP, CLIP, DINOv2,
ViT-MAE, ViT-MSN, I-JEPA, AIMv2, SigLIP 2 (NaFlex) and RADIO folders are the ``hf_family`` format's
(``hf_families``), DINOv3 ones (``dinov3_vit``) the ``hf_dinov3`` format's; other model types (BEiT,
data2vec-vision, ...) and masked-image-modelling heads are refused by name.

This module holds the format's ``FORMAT`` and write options; the ViT / DeiT tables, rules, reading and
config.json are ``hf_vit``'s, the key spellings shared with ``hf_families`` are ``hf_common``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from vit_common.checkpoints.formats.hf_common import BLOCK_KEYS, FAMILY_MODEL_TYPES
from vit_common.checkpoints.formats.hf_vit import ARCHITECTURES, config_json, is_hf, read_tensors, rules
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Format, Reference, Source, WriteOptions
from vit_common.checkpoints.formats.provenance import ASSUMED_KEY
from vit_common.checkpoints.formats.rules import (
    Rule,
    from_canonical,
    materialize_posemb,
    norm_and_bias_checks,
    refuse,
    rope_family_fields,
    unsupported,
    zero_head_bias,
)
from vit_common.checkpoints.formats.source import HF_INDEX
from vit_common.checkpoints.formats.tensors import TensorMap, nbytes_of
from vit_common.checkpoints.formats.timm_state import is_timm
from vit_common.checkpoints.metadata import (
    HF_NAFLEX_MODEL_TYPES,
    Declared,
    hf_classes,
    hf_labels,
    hf_patch_size,
    hf_preprocess_file,
    hf_preprocessor_config,
)
from vit_common.config import ViTConfig
from vit_common.data.images import PRESETS
from vit_common.system import io

# The model types an hf_family folder is written as (``--hf-model-type``): the two-tower ones are written
# as their vision tower's, but SigLIP's and SigLIP 2's classifiers.
WRITTEN_FAMILY_TYPES = tuple(t for t in FAMILY_MODEL_TYPES if t not in ("clip", "aimv2"))
WEIGHTS = "model.safetensors"  # an unsharded folder's weights, as save_pretrained names them


@dataclass(frozen=True)
class HfWriteOptions(WriteOptions):
    """How an HF folder is written: ``spelling`` of the tensor names; ``model_type`` of an hf_family
    folder (None: the source folder's where it holds the model, else the family that holds it)."""

    spelling: str = field(
        default="v4",
        metadata={
            "flag": "--hf-spelling",
            "choices": tuple(BLOCK_KEYS["vit"]),
            "help": "HF key names to write: v4 (what save_pretrained writes; loads in transformers 4 and 5) "
            "or v5 (transformers 5 module names)",
        },
    )
    model_type: str | None = field(
        default=None,
        metadata={
            "flag": "--hf-model-type",
            "choices": WRITTEN_FAMILY_TYPES,
            "help": "transformers model_type of an hf_family folder (a plain ViT as vit_mae or vit_msn, a "
            "mean-pooled classifier as siglip or siglip2 (their ForImageClassification); "
            "default: the source folder's model_type where it holds the model, else the family that holds it)",
        },
    )
    shard_size: str = field(
        default="",
        metadata={
            "flag": "--shard-size",
            "help": "split an HF folder's weights into safetensors shards of at most this size, with "
            "model.safetensors.index.json, as save_pretrained's max_shard_size: bytes, or with a unit "
            "(5GB = 5*10^9 bytes, 4GiB = 4*2^30; default: one model.safetensors)",
        },
    )

    def __post_init__(self) -> None:
        if self.shard_size:
            shard_bytes(self.shard_size)

    @property
    def shard_bytes(self) -> int | None:
        """``shard_size`` in bytes, or None (one file)."""
        return shard_bytes(self.shard_size) if self.shard_size else None


_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]I?)?B?", re.IGNORECASE)
_UNIT = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def shard_bytes(text: str) -> int:
    """The bytes a ``--shard-size`` names: a number of bytes, or one with a unit KB, MB, GB, TB (powers
    of 1000, as transformers' ``convert_file_size_to_int``) or KiB, MiB, GiB, TiB (powers of 1024).

    Raises:
        ValueError: not such a size, or under one byte (names the value).
    """
    m = _SIZE.fullmatch(str(text).strip())
    n = int(float(m.group(1)) * _UNIT[(m.group(2) or "").upper()]) if m else 0
    if n < 1:
        raise ValueError(f"--shard-size {text!r}: expected a size of at least 1 byte, such as 5GB, 500MB or 4GiB")
    return n


def shards(tensors: TensorMap, limit: int | None) -> list[tuple[str, list[str]]]:
    """(file name, tensor names) of each weights file of an HF folder: one ``model.safetensors``, or with
    a ``limit`` in bytes ``model-0000i-of-0000n.safetensors`` files filled in order as huggingface_hub's
    ``split_state_dict_into_shards_factory`` fills them (a tensor over the limit alone in its file; a new
    file where the next tensor would pass the limit)."""
    if limit is None:
        return [(WEIGHTS, list(tensors))]
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for k, v in tensors.items():
        n = nbytes_of(v)
        if n > limit:
            groups.append([k])
            continue
        if current and size + n > limit:
            groups.append(current)
            current, size = [], 0
        current.append(k)
        size += n
    if current or not groups:
        groups.append(current)
    if len(groups) == 1:
        return [(WEIGHTS, groups[0])]
    return [(f"model-{i:05d}-of-{len(groups):05d}.safetensors", g) for i, g in enumerate(groups, 1)]


class HuggingFace(Format):
    name = "hf"
    description = "Hugging Face transformers ViT or DeiT folder (config.json + weights)"
    folder = True
    signature = "embeddings.patch_embeddings.projection.weight, or a folder with config.json"
    reference = Reference("transformers", "from_pretrained")
    write_options = HfWriteOptions
    checks_on_write = True  # write_folder loads each tensor once
    assumed_preprocess = PRESETS["hf_vit"]
    assumed_why = "no preprocessor_config.json; transformers ViTImageProcessor defaults"

    def detect(self, src: Source) -> bool:
        if src.container not in ("hf_folder", "safetensors", "torch"):
            return False
        return is_hf(src.tensors) or (src.container == "hf_folder" and not is_timm(src.tensors))

    def read(self, src: Source, opts) -> Decoded:
        return read_tensors(
            src.tensors,
            src.config,
            source_image_size=opts.source_image_size,
            overrides=opts.overrides,
            context=src.context,
        )

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        return rope_family_fields(cfg) + unsupported(
            "Hugging Face ViT",
            {
                "class_token=False (HF ViT always has a class token)": not cfg.class_token,
                f"reg_tokens={cfg.reg_tokens}": cfg.reg_tokens > 0,
                f"pool={cfg.pool!r} (HF ViT pools the class token)": cfg.pool != "token",
                "LayerScale": cfg.layer_scale is not None,
                "qk_norm": cfg.qk_norm,
                "fc_norm": cfg.fc_norm,
                "norm_pre": cfg.norm_pre,
                "patch_bias=False": not cfg.patch_bias,
                "posemb='none'": cfg.posemb == "none",
                "mlp_type='swiglu'": cfg.mlp_type == "swiglu",
                "both rep_size and a head (ViTModel has the pooler, ViTForImageClassification the classifier)": (
                    cfg.rep_size > 0 and cfg.num_classes > 0
                ),
                "head_dist without classes (DeiTModel has no distilled output)": cfg.head_dist and not cfg.num_classes,
            }
            | norm_and_bias_checks(cfg),
        )

    def declared(self, src: Source) -> Declared:
        """The safetensors metadata's entries (a weights file given alone), then the folder's
        preprocessor_config.json and config.json ``id2label`` (``src.config``; LABEL_i names none)."""
        found = super().declared(src)
        folder = src.path if src.path.is_dir() else src.path.parent
        model_type = (src.config or {}).get("model_type")
        pre = hf_preprocess_file(folder, model_type, hf_patch_size(src.config))
        pre_where = str(folder / "preprocessor_config.json")
        why = ""
        if pre is None:
            pre, pre_where, why = found.preprocess, found.preprocess_where, found.preprocess_assumed
        classes, classes_where = found.classes, found.classes_where
        if classes is None and hf_classes(src.config or {}) is not None:
            classes, classes_where = list(hf_classes(src.config)), str(folder / "config.json")
        return Declared(pre, pre_where, classes, classes_where, preprocess_assumed=why)

    def record_info(self, enc: Encoded, preprocess, classes, preprocess_assumed: str = "") -> list[str]:
        """Class names as config.json ``id2label``/``label2id``, preprocessing as preprocessor_config.json
        (which cannot say it was assumed: ``check_assumed`` refuses that unless accepted)."""
        if classes is not None and enc.cfg.num_classes:
            enc.config_json |= hf_labels(classes, enc.cfg.num_classes)
        notes: list[str] = []
        if preprocess is not None:
            cfg, naflex = enc.cfg, enc.config_json.get("model_type") in HF_NAFLEX_MODEL_TYPES
            patch = cfg.patch_size[0] if naflex else None  # a fixed-size folder's processor has no budget
            pre, notes = hf_preprocessor_config(preprocess, cfg.image_size, cfg.in_chans, patch)
            enc.json_files["preprocessor_config.json"] = pre
        return notes

    def encode(self, cfg: ViTConfig, state, path: Path, options: HfWriteOptions, assumed=()) -> Encoded:
        refuse("Hugging Face ViT", self.cannot_hold(cfg))
        spelling = options.spelling
        if spelling not in BLOCK_KEYS["vit"]:
            raise ValueError(f"spelling={spelling!r}: expected 'v4' or 'v5'")
        if options.model_type is not None:
            raise ValueError(
                f"model_type={options.model_type!r}: hf folders are vit or deit; write that model type --to hf_family"
            )
        cfg, state, notes = materialize_posemb(cfg, state, prefix_rows=True)
        cfg, state, more = zero_head_bias(cfg, state)
        notes += more
        config = config_json(cfg) | ({ASSUMED_KEY: sorted(assumed)} if assumed else {})  # transformers keeps it
        tensors = from_canonical(self.tensor_rules(cfg, options), state)
        return Encoded(cfg, state, tensors, config, None, notes, shard_size=options.shard_bytes)

    def tensor_rules(self, cfg: ViTConfig, options: HfWriteOptions) -> list[Rule]:
        """The file <-> canonical rules ``encode`` writes ``cfg`` with: its architecture's prefix and head,
        ``options.spelling``'s key names."""
        config = config_json(cfg)
        _, head = ARCHITECTURES[config["architectures"][0]]
        prefix = f"{config['model_type']}." if head != "backbone" else ""
        return rules(cfg, options.spelling, prefix, head)

    def decode(self, enc: Encoded) -> Decoded:
        return read_tensors(enc.tensors, enc.config_json, context="hf read-back")

    def write(self, path: Path, enc: Encoded, writers) -> None:
        """config.json, the weights (one file, or shards of ``enc.shard_size`` bytes with their index,
        each written a tensor at a time) and ``enc.json_files``."""
        files = shards(enc.tensors, enc.shard_size)
        index = (
            {
                "metadata": {"total_size": sum(nbytes_of(v) for v in enc.tensors.values())},
                "weight_map": {k: name for name, keys in files for k in keys},
            }
            if len(files) > 1
            else None
        )

        def write_folder(tmp: Path) -> None:
            names = ["config.json", *(name for name, _ in files), *([HF_INDEX] if index else []), *enc.json_files]
            io.write_json(tmp / "config.json", io.folder_mark(enc.config_json, names), sort_keys=True)
            for name, keys in files:
                io.save_safetensors(tmp / name, {k: enc.tensors[k] for k in keys}, {"format": "pt"})
            if index:
                io.write_json(tmp / HF_INDEX, index, sort_keys=True, mark=False)
            for name, obj in enc.json_files.items():
                io.write_json(tmp / name, obj, sort_keys=True, mark=False)

        io.atomic_write_dir(path, write_folder)

    def states_as_fact(self, path: Path) -> bool:
        """Always: transformers takes config.json's hidden_act, layer_norm_eps, ... as fact."""
        return True

    def export_name(self, source: Path | None = None) -> str:
        return "model_hf"

    def load_call(self, path: Path, cfg: ViTConfig) -> str:
        arch = config_json(cfg)["architectures"][0]
        extra = ", add_pooling_layer=False" if ARCHITECTURES[arch][1] == "backbone" and not cfg.rep_size else ""
        return "\n".join(
            [
                "import transformers",
                f"model, info = transformers.{arch}.from_pretrained({str(path)!r}, output_loading_info=True{extra})",
                "assert not any(info.values()), info  # no missing, unexpected or mismatched tensor",
            ]
        )


FORMAT = HuggingFace()
