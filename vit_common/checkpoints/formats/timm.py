"""timm ``VisionTransformer`` (and DeiT ``VisionTransformerDistilled``, and ``NaFlexVit``: ``timm_naflex``)
state_dicts and hub folders <-> the canonical state, which uses timm's names already: the timm format's
``FORMAT``.

A timm file stores no config: its tensors' shapes give what they can and the rest is assumed and warned
(``timm_state.infer``, which also accepts DDP's ``module.`` prefix and DeiT III's LayerScale spelling).
Files we write as ``.safetensors`` carry the config in the header metadata (timm ignores it), so they
read back with every field declared. What timm has and the twins lack is refused by name
(``provenance.UNSUPPORTED_TENSORS``; a model without a final norm; attention without an output bias).

timm hub folders (``config.json`` beside ``model.safetensors``, as timm's ``save_for_hf`` writes them)
are read and written through ``timm_hub``, whose docstring says how each key is read. ``timm_state``
holds the state_dict reading and the one mapping from a ViTConfig to timm's keyword arguments
(``timm_kwargs``, ``timm_load_call``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Format, Reference, Source, WriteOptions, writer
from vit_common.checkpoints.formats.provenance import ASSUMED_KEY, WRITTEN, guesses_num_heads
from vit_common.checkpoints.formats.rules import materialize_posemb, refuse, zero_head_bias
from vit_common.checkpoints.formats.source import TORCH_SUFFIXES, read_safetensors
from vit_common.checkpoints.formats.stored_config import assumed_meta, config_from_json, decode_stored
from vit_common.checkpoints.formats.tensors import TensorMap, dtype_of
from vit_common.checkpoints.formats.timm_eva import (
    EvaLayout,
    canonical_to_eva,
    check_eva_name,
    default_layout,
    drop_stored_periods,
    eva_cannot_hold,
    eva_load_call,
    eva_name,
    eva_to_canonical,
    is_eva,
    layout_note,
    source_choices,
)
from vit_common.checkpoints.formats.timm_hub import (
    HUB_WEIGHTS,
    hub_config,
    hub_config_json,
    hub_load_call,
    hub_preprocess,
    hub_pretrained_cfg,
    is_hub_config,
    read_hub,
    timm_preprocess,
)
from vit_common.checkpoints.formats.timm_naflex import (
    NAFLEX_NAMES,
    canonical_to_naflex,
    infer_naflex,
    is_naflex,
    is_naflex_name,
    naflex_cannot_hold,
    naflex_hub_preprocess,
    naflex_load_call,
    naflex_name,
    naflex_state,
    resize_differs,
    source_name,
)
from vit_common.checkpoints.formats.timm_state import infer, is_timm, normalise_keys, timm_cannot_hold, timm_load_call
from vit_common.checkpoints.hub import is_hub_id
from vit_common.checkpoints.metadata import Declared, info_metadata
from vit_common.config import ViTConfig
from vit_common.data.images import PRESETS
from vit_common.state import canonical_shapes
from vit_common.system import io

META_TAG = ("vit_twins", "timm/1")  # header metadata key and value of the timm files we write


def _hub_folder(path: Path) -> bool:
    """Whether writing ``path`` as timm makes a hub folder: a destination without a file suffix."""
    return Path(path).suffix not in (".safetensors", *TORCH_SUFFIXES)


@dataclass(frozen=True)
class TimmWriteOptions(WriteOptions):
    """How a timm file or hub folder is written: ``weights_from``, a .safetensors file already holding
    exactly the tensors to write (ours or timm's: a run's model.safetensors), whose bytes the file (a
    folder's model.safetensors) shares instead of a copy (``vit_common.system.io.share_file``); for a RoPE
    backbone (timm's ``Eva``, ``timm_eva``), ``eva_qkv`` ('fused' | 'split'; '' the source's, else fused)
    and ``architecture`` (the timm model name; '' the source's, else its family's: ``timm_eva.eva_name``);
    a ``naflexvit_*`` architecture writes timm's ``NaFlexVit`` (``timm_naflex``)."""

    weights_from: str = field(
        default="",
        metadata={
            "flag": "--timm-weights-from",
            "help": "a .safetensors file holding exactly these tensors (e.g. a run's model.safetensors): the "
            "timm file or folder shares its bytes (a hard link, else a symbolic link) instead of a copy",
        },
    )
    eva_qkv: str = field(
        default="",
        metadata={
            "flag": "--timm-eva-qkv",
            "choices": ("fused", "split"),
            "help": "a RoPE backbone (timm Eva): attention as one qkv projection (fused) or q_proj/k_proj/v_proj "
            "(split, as eva02_base); default: the source's spelling, else fused",
        },
    )
    architecture: str = field(
        default="",
        metadata={
            "flag": "--timm-architecture",
            "help": "a RoPE backbone (timm Eva): the timm Eva model name the load call builds (every keyword is "
            "spelled out; a hub folder's name also fixes the LayerNorm eps, so it must build the model's); "
            "default: the source hub folder's, else its family's. A naflexvit_* name writes timm's NaFlexVit "
            "(the default after a NaFlexVit source)",
        },
    )


def _shared(weights_from: str, tensors: TensorMap, path: Path) -> tuple[dict | None, str]:
    """(``weights_from``'s metadata, "") if it holds exactly ``tensors`` and ``path`` can share its bytes;
    else (None, a note saying why the tensors are written instead: a .pth/.bin destination is a pickle,
    or the file holds other tensors, e.g. a sincos2d model's, which the timm file holds as a table).

    Raises:
        FormatError: ``weights_from`` is not a readable safetensors file.
    """
    if Path(path).suffix in TORCH_SUFFIXES:
        return None, f"a PyTorch pickle cannot share {weights_from}'s bytes: written"
    held, meta = read_safetensors(weights_from)
    bad = sorted(set(held) ^ set(tensors)) + [
        k
        for k in sorted(set(held) & set(tensors))
        if held[k].dtype != dtype_of(tensors[k])
        or held[k].shape != np.shape(tensors[k])
        or held[k].tobytes() != np.ascontiguousarray(tensors[k]).tobytes()
    ]
    if bad:
        return None, f"{weights_from} does not hold exactly these tensors ({', '.join(bad[:4])}): written, not shared"
    return meta, ""


def _check_eva_options(options: TimmWriteOptions, eva: bool) -> None:
    """Refuse Eva options for a model timm holds as a VisionTransformer, and an unknown Eva name (a
    ``naflexvit_*`` architecture names timm's NaFlexVit, checked by ``naflex_cannot_hold``).

    Raises:
        ValueError: one line naming the flag and its value.
    """
    architecture = "" if is_naflex_name(options.architecture) else options.architecture
    if not eva:
        for flag, value in (("--timm-eva-qkv", options.eva_qkv), ("--timm-architecture", architecture)):
            if value:
                raise ValueError(
                    f"{flag} {value!r}: an option of RoPE backbones (timm Eva); this model is a timm VisionTransformer"
                )
    check_eva_name(architecture)


class Timm(Format):
    name = "timm"
    description = "timm VisionTransformer state_dict (.safetensors, .pth, .bin) or hub folder (config.json)"
    suffixes = TORCH_SUFFIXES
    signature = "patch_embed.proj.weight"
    reference = Reference("timm", "state_dict")
    write_options = TimmWriteOptions
    assumed_preprocess = PRESETS["imagenet"]
    assumed_why = (
        "timm files store none; ImageNet mean/std, bicubic, crop 0.9 as DeiT and most timm weights (timm "
        "augreg and original-ViT ports use --mean 0.5 --std 0.5)"
    )

    def detect(self, src: Source) -> bool:
        return src.container in ("safetensors", "torch", "hf_folder") and is_timm(src.tensors)

    def read(self, src: Source, opts) -> Decoded:
        if src.container == "hf_folder" and is_hub_config(src.config):
            return read_hub(src, opts)
        if src.meta.get(META_TAG[0]) == META_TAG[1] and "vit_config" in src.meta:
            cfg, notes = config_from_json(src.meta["vit_config"], src.context)
            tensors, more = normalise_keys(eva_to_canonical(src.tensors))
            naflex = is_naflex(tensors)
            tensors = naflex_state(tensors, cfg.patch_size, cfg.in_chans) if naflex else tensors
            dec = decode_stored(
                cfg,
                tensors,
                f"timm {'NaFlexVit ' if naflex else ''}state_dict, config in metadata{layout_note(src.tensors)}",
                src.context,
                "config in the file's metadata",
                src.meta.get(ASSUMED_KEY),
            )
            dec.notes += notes + more
            return dec
        read = infer_naflex if is_naflex(src.tensors) else infer
        return read(
            src.tensors, source_image_size=opts.source_image_size, overrides=opts.overrides, context=src.context
        )

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        """``timm_cannot_hold`` (a RoPE backbone: ``timm_eva.eva_cannot_hold``), except a bias-free head,
        which ``encode`` writes with a zero bias (``rules.zero_head_bias``)."""
        cfg = cfg.replace(head_bias=True)
        differs = resize_differs(cfg)
        return eva_cannot_hold(cfg) + ([differs] if differs else []) if is_eva(cfg) else timm_cannot_hold(cfg)

    def complete_options(self, options: TimmWriteOptions, source) -> TimmWriteOptions:
        """The q/k/v spelling and the timm Eva name of a source timm file or hub folder of a RoPE backbone
        (its report's layout line, ``timm_eva.source_choices``) where ``options`` leave them unset; a
        NaFlexVit source's ``naflexvit_*`` name (``timm_naflex.source_name``), or for one whose table the
        written keywords would not define (a RADIO entry point's) ``naflex_name``'s choice."""
        cfg = getattr(source, "config", None)
        layout = getattr(source, "layout", "") or ""
        naflex = source_name(layout, cfg)
        if naflex and naflex not in NAFLEX_NAMES and cfg is not None:
            naflex = naflex_name(cfg)
        if naflex:
            return replace(options, architecture=options.architecture or naflex)
        if cfg is None or not is_eva(cfg):
            return options
        name, qkv = source_choices(layout)
        return replace(options, eva_qkv=options.eva_qkv or qkv, architecture=options.architecture or name)

    def declared(self, src: Source) -> Declared:
        """A hub folder's config.json ``pretrained_cfg`` and ``label_names``; a file's metadata otherwise."""
        if src.container != "hf_folder" or not is_hub_config(src.config):
            return super().declared(src)
        where = str(src.path / "config.json")
        hub = hub_config(src.config, where)
        pre, pre_where = hub_preprocess(hub, where), f"{where} pretrained_cfg"
        if pre is not None and is_naflex(src.tensors):
            pre, how = naflex_hub_preprocess(hub.pretrained_cfg, src.tensors, pre)
            pre_where += how
        classes = list(hub.label_names) if hub.label_names is not None else None
        return Declared(pre, pre_where if pre else "", classes, where if classes else "")

    def record_info(self, enc: Encoded, preprocess, classes, preprocess_assumed: str = "") -> list[str]:
        """A hub folder: preprocessing into config.json's ``pretrained_cfg`` (a NaFlexVit's square patch
        budget of S x S patches as the ``input_size`` S*P x S*P it is read back from), class names as its
        ``label_names``; a file: its safetensors metadata."""
        if enc.config_json is None and enc.shared is not None:
            info = info_metadata(preprocess, classes, preprocess_assumed)
            lacks = sorted(k for k, v in info.items() if enc.meta.get(k) != v)
            return [f"{enc.shared.name}, whose bytes this file shares, does not record {lacks}"] if lacks else []
        if enc.config_json is None:
            return super().record_info(enc, preprocess, classes, preprocess_assumed)
        notes: list[str] = []
        if preprocess is not None:
            side, (ph, pw) = math.isqrt(preprocess.max_patches or 0), enc.cfg.patch_size
            if side and side * side == preprocess.max_patches and is_naflex_name(enc.config_json["architecture"]):
                size = [enc.cfg.in_chans, side * ph, side * pw]  # the budget naflex_hub_preprocess reads back
                enc.config_json["pretrained_cfg"]["input_size"] = size
                notes.append(f"pretrained_cfg: input_size {size}, the NaFlex budget of {side}x{side} patches")
                preprocess = preprocess.replace(max_patches=None)
            preprocess, more = timm_preprocess(preprocess, enc.cfg.image_size)
            notes += more
            enc.config_json["pretrained_cfg"] |= hub_pretrained_cfg(preprocess, enc.cfg.in_chans)
        if classes is not None and enc.cfg.num_classes:
            if len(classes) != enc.cfg.num_classes:
                raise ValueError(f"{len(classes)} class names for a model with {enc.cfg.num_classes} classes")
            enc.config_json["label_names"] = [str(c) for c in classes]
        return notes

    def writes_folder(self, path: Path) -> bool:
        """A destination without a file suffix is a hub folder; .safetensors, .pth, .pt, .bin a file."""
        return _hub_folder(path)

    def encode(self, cfg: ViTConfig, state, path: Path, options: TimmWriteOptions, assumed=()) -> Encoded:
        naflex, differs = is_naflex_name(options.architecture), resize_differs(cfg)
        refuse("timm", self.cannot_hold(cfg) + (naflex_cannot_hold(cfg, _hub_folder(path)) if naflex else []))
        if differs and not naflex and not is_eva(cfg):  # a VisionTransformer would compute another function
            lacks = naflex_cannot_hold(cfg, _hub_folder(path))
            refuse("timm", [f"{differs}, and as a NaFlexVit {'; '.join(lacks)}"] if lacks else [])
            naflex = True
        cfg, state, notes = materialize_posemb(cfg, state, prefix_rows=False)
        if differs and naflex and not is_naflex_name(options.architecture):
            notes.append(f"written as timm's NaFlexVit {naflex_name(cfg)}: {differs}")
        cfg, state, more = zero_head_bias(cfg, state)
        notes += more
        eva = is_eva(cfg)
        _check_eva_options(options, eva)
        if eva:
            cfg, state, more = drop_stored_periods(cfg, state)
            notes += more
        tensors = {k: state[k] for k in canonical_shapes(cfg)}
        qkv = options.eva_qkv or "fused"
        if eva:
            tensors = canonical_to_eva(cfg, tensors, EvaLayout(qkv=qkv, mlp=default_layout(cfg).mlp))
        if naflex:
            tensors = canonical_to_naflex(cfg, tensors)
        meta = config = shared = None
        if Path(path).suffix not in TORCH_SUFFIXES:
            meta = {"format": "pt", META_TAG[0]: META_TAG[1], "vit_config": cfg.to_json()} | assumed_meta(assumed)
        elif eva:
            notes.append(
                "a timm .pth holds none of a RoPE model's settings: load it with the load call's timm.create_model "
                "(a .safetensors file or hub folder keeps the config)"
            )
        if _hub_folder(path):
            config = hub_config_json(
                cfg, assumed, qkv, naflex_name(cfg, options.architecture) if naflex else options.architecture
            )
        if options.weights_from:
            held, why = _shared(options.weights_from, tensors, path)
            notes += [why] if why else []
            if held is not None:
                shared = Path(options.weights_from)
                meta = held if config is None else meta  # a shared file is the shared one, header and all
        enc = Encoded(cfg, dict(state), tensors, config, meta, notes)
        enc.shared = shared
        if eva and not _hub_folder(path):
            enc.load_call = eva_load_call(str(path), cfg, qkv, options.architecture or eva_name(cfg))
        if naflex and not _hub_folder(path):
            enc.load_call = naflex_load_call(str(path), cfg, naflex_name(cfg, options.architecture))
        return enc

    def decode(self, enc: Encoded) -> Decoded:
        """The written tensors read back with the config in their metadata, else as a timm file that
        stores none (with the written num_heads where no rule guesses it: ``provenance.WRITTEN``); a RoPE
        backbone's .pth (which ``read`` refuses) with the config it was written with."""
        tensors = eva_to_canonical(enc.tensors)
        naflex = is_naflex(tensors)
        tensors = naflex_state(tensors, enc.cfg.patch_size, enc.cfg.in_chans) if naflex else tensors
        if enc.meta:
            cfg, _ = config_from_json(enc.meta["vit_config"], "timm read-back")
            return decode_stored(
                cfg, tensors, "", "timm read-back", "config in the file's metadata", enc.meta.get(ASSUMED_KEY)
            )
        if is_eva(enc.cfg) or naflex:
            return decode_stored(enc.cfg, tensors, "", "timm read-back", "the load call's create_model keywords")
        heads = enc.cfg.qk_norm or guesses_num_heads(enc.cfg.width)
        known = {} if heads else {"num_heads": (enc.cfg.num_heads, WRITTEN)}
        return infer(enc.tensors, source_image_size=enc.cfg.image_size, context="timm read-back", known=known)

    def write(self, path: Path, enc: Encoded, writers) -> None:
        if enc.config_json is not None:

            def write_folder(tmp: Path) -> None:
                io.write_json(tmp / "config.json", io.folder_mark(enc.config_json, ["config.json", HUB_WEIGHTS]))
                if enc.shared is None:
                    io.save_safetensors(tmp / HUB_WEIGHTS, enc.tensors, enc.meta)
                else:
                    io.share_file(enc.shared, tmp / HUB_WEIGHTS, final=Path(path) / HUB_WEIGHTS)

            io.atomic_write_dir(path, write_folder)
        elif enc.shared is not None:
            io.share_file(enc.shared, path)
        elif enc.meta is None:
            writer(writers, "torch", path)(path, enc.tensors)
        else:
            io.save_safetensors(path, enc.tensors, enc.meta)

    def needs(self, path: Path) -> str | None:
        return "torch" if Path(path).suffix in TORCH_SUFFIXES else None

    def states_as_fact(self, path: Path) -> bool:
        """A hub folder's config.json names model_args that timm builds as fact; a state_dict file stores
        no config (our .safetensors header records what was assumed), so it is written freely."""
        return _hub_folder(path)

    def load_call(self, path: Path, cfg: ViTConfig) -> str:
        """timm's strict load of the written file or hub folder (a RoPE backbone's file with timm's
        defaults, fused q/k/v and its family's name: ``encode`` records the options' own)."""
        if _hub_folder(path):
            return hub_load_call(path)
        if is_eva(cfg):
            return eva_load_call(str(path), cfg, "fused", eva_name(cfg))
        return timm_load_call(path, cfg)

    def export_name(self, source: Path | None = None) -> str:
        """``model_timm.safetensors``; ``model_timm.pth`` (.pt, .bin) after a PyTorch pickle source, the
        hub folder ``model_timm`` after a hub folder (or a hub id ``hf-hub:ORG/NAME``, which is one)."""
        if source is not None and (is_hub_id(str(source)) or Path(source).is_dir()):
            return "model_timm"
        suffix = Path(source).suffix if source is not None else ""
        return f"model_timm{suffix if suffix in TORCH_SUFFIXES else '.safetensors'}"


FORMAT = Timm()
