"""Read and write every supported checkpoint format through the canonical state.

The formats are ``vit_common.checkpoints.registry.REGISTRY`` (one module and one object each), detected from the
contents, never from the file name:

============== ======================================================= ==========================
name           what                                                    container
============== ======================================================= ==========================
canonical      our file: timm names + ViTConfig in the metadata        .safetensors
timm           timm VisionTransformer / DeiT distilled state_dict      .safetensors, .pth/.bin
hf             transformers ViT / DeiT (model, classifier, teacher)    folder: config.json +
                                                                       model.safetensors (shards)
                                                                       or pytorch_model.bin
original_vit   google-research/vision_transformer checkpoint           .npz
big_vision     google-research/big_vision ViT checkpoint               .npz
orbax          orbax checkpoint of the JAX twin + its config           folder
============== ======================================================= ==========================

vit_common imports neither framework, so two containers are read and written through callables the
framework adapters provide: ``readers={"torch": vit_torch.formats.read_torch_file, "orbax":
vit_jax.formats.read_orbax}`` and ``writers={"torch": ..., "orbax": ...}`` (``vit_torch.formats.READERS``
etc.). ``needs(path)`` says which one a path needs, so a caller imports only that framework.

Every read checks that each file tensor is used exactly once and each canonical tensor is filled, records
where each config field came from (declared, derived, assumed, given: ``formats.provenance.Origin``), lists
the assumed fields that change the function in one block (``Report.assumption_block``: how to supply
them, then ``field = value (why)`` each), and with ``strict=True`` refuses them. Every write reads the
tensors it will write back through the same format (``vit_common.checkpoints.readback``: bit-exact, or
it raises before the destination is in place), writes atomically and says which library call loads the
file strictly. Tensors stream (``formats.tensors``): ``convert`` hands the reader's lazy state to the
writer, so each tensor is computed when it is compared and when it is written (an .npz's once, compared
as it is written), and held only meanwhile.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded, Format, ReadOptions, Source, WriteOptions
from vit_common.checkpoints.formats.provenance import (
    ASSUMED,
    DECLARED,
    GIVEN,
    Origin,
    Report,
    assumed_fields,
    assumption_line,
    build_config,
    flag_for,
)
from vit_common.checkpoints.formats.rules import check_canonical
from vit_common.checkpoints.formats.source import (
    HF_WEIGHTS,
    ORBAX_CONFIG,
    TORCH_SUFFIXES,
    WEIGHT_ENTRIES,
    container_needs,
    load_tensors,
    open_source,
)
from vit_common.checkpoints.formats.tensors import Tensor, TensorMap, dtype_of, materialize, row_parts
from vit_common.checkpoints.hub import is_hub_id, resolve
from vit_common.checkpoints.metadata import ModelInfo, read_info
from vit_common.checkpoints.readback import confirm_checked, read_back
from vit_common.checkpoints.registry import REGISTRY
from vit_common.config import ViTConfig
from vit_common.data.images import Preprocess
from vit_common.posemb import resample_pos_embed
from vit_common.state import canonical_shapes, nonfinite
from vit_common.system import io, validate

FORMATS = {name: f.description for name, f in REGISTRY.items()}
__all__ = [
    "FORMATS",
    "HF_WEIGHTS",
    "ORBAX_CONFIG",
    "TORCH_SUFFIXES",
    "Checkpoint",
    "convert",
    "load_checkpoint",
    "needs",
    "open_checkpoint",
    "output_format",
    "read_checkpoint",
    "save_checkpoint",
]

Reader = Callable[..., Any]


class Checkpoint(NamedTuple):
    """A checkpoint read: config, canonical state, the report of the reading, and the preprocessing and
    class names the file declares (or its format assumes), read from the same source. ``state`` holds
    numpy arrays, or with ``load_checkpoint(lazy=True)`` what the reader streams (``formats.tensors``)."""

    cfg: ViTConfig
    state: dict[str, Tensor]
    report: Report
    info: ModelInfo


def _format(name: str) -> Format:
    if name not in REGISTRY:
        raise ValueError(f"format {name!r}: expected one of {tuple(REGISTRY)}")
    return REGISTRY[name]


def open_checkpoint(path: str | os.PathLike | Source) -> Source:
    """The container at ``path`` (``formats.source.open_source``: found from its contents, no tensors
    read yet), to hand to ``needs`` and ``load_checkpoint`` so that a command opens its source once.

    A hub model id ``hf-hub:ORG/NAME[@REVISION]`` is the folder huggingface_hub gives for it
    (``vit_common.checkpoints.hub.resolve``: its cache, downloading when the hub can be reached); the
    Source keeps the id as its ``name``, which reports show.

    Raises:
        FileNotFoundError: no such path. FormatError: not a container vit reads; a hub id neither cached
            nor reachable.
    """
    if isinstance(path, Source):
        return path
    src = open_source(resolve(path))
    if is_hub_id(path):
        src.name = str(path)
    return src


def needs(path: str | os.PathLike | Source, fmt: str | None = None, *, writing: bool = False) -> str | None:
    """'torch', 'jax' or None: the framework reading (or writing) ``path`` needs.

    For reading, ``path`` must exist (its contents decide; an opened ``Source`` is not opened again; a hub
    id ``hf-hub:ORG/NAME`` is resolved first, see ``open_checkpoint``). For writing, ``fmt`` or the suffix
    decides.
    """
    if writing:
        return _format(fmt or output_format(path)).needs(Path(path))
    return container_needs(open_checkpoint(path))


def output_format(path: str | os.PathLike) -> str:
    """The format a path name asks for when no --to is given (the first format listing its suffix).

    Raises:
        ValueError: the name does not say (a folder could be 'hf' or 'orbax').
    """
    suffix = Path(path).suffix
    for name, f in REGISTRY.items():
        if suffix and suffix in f.suffixes:
            return name
    raise ValueError(
        f"cannot tell the output format from {str(path)!r}; pass one of {tuple(REGISTRY)} "
        "(--to), e.g. hf or orbax for a folder"
    )


# --------------------------------------------------------------------------------------- reading


def _detect(src) -> Format:
    for f in REGISTRY.values():
        if f.detect(src):
            return f
    sample = ", ".join(sorted(src.tensors)[:5])
    raise FormatError(
        f"{src.path}: {len(src.tensors)} tensors ({sample}{', ...' if len(src.tensors) > 5 else ''}) match "
        "none of the formats: " + "; ".join(f"{f.name} ({f.signature})" for f in REGISTRY.values())
    )


def _new_head(cfg: ViTConfig, state: dict[str, Tensor], k: int, report: Report) -> ViTConfig:
    validate.check_model_size(cfg.replace(num_classes=k), f"num_classes={k}")
    old = cfg.num_classes
    dtype = dtype_of(state["patch_embed.proj.weight"])
    heads = ("head", "head_dist") if cfg.head_dist else ("head",)
    for name in (f"{h}.{w}" for h in heads for w in ("weight", "bias")):
        if name in state:
            report.dropped.append((name, f"--num-classes {k} replaces the {old}-class head"))
            del state[name]
    if k:
        for h in heads:
            state[f"{h}.weight"] = np.zeros((k, cfg.features_dim), dtype)
            state[f"{h}.bias"] = np.zeros((k,), dtype)
        report.notes.append(f"new {k}-class head, zero-initialised (big_vision head_zeroinit); fine-tune it")
    return cfg.replace(num_classes=k, head_bias=True) if k else cfg.replace(num_classes=0)


def _resample(cfg: ViTConfig, state: dict[str, Tensor], image_size, report: Report) -> ViTConfig:
    new = cfg.replace(image_size=image_size)
    if new.grid == cfg.grid:
        return new
    validate.check_model_size(new, f"image_size={image_size}")
    why = f"image_size {cfg.image_size[0]}x{cfg.image_size[1]} -> {new.image_size[0]}x{new.image_size[1]}"
    if cfg.posemb != "learn":
        report.notes.append(f"{why}: the {cfg.posemb} position embedding needs no resampling")
        return new
    prefix = cfg.num_prefix_tokens if cfg.posemb_prefix else 0
    state["pos_embed"] = resample_pos_embed(state["pos_embed"], cfg.grid, new.grid, prefix, cfg.posemb_resample)
    report.resampled.append(
        f"pos_embed grid {cfg.grid[0]}x{cfg.grid[1]} -> {new.grid[0]}x{new.grid[1]} "
        f"with {cfg.posemb_resample} "
        f"({prefix} prefix row(s) kept) because {why}"
    )
    return new


def _apply_overrides(dec: Decoded, overrides: Mapping[str, Any], context: str) -> None:
    """Overrides the reader did not take itself (formats with a stored config), recorded as given."""
    rest = {k: v for k, v in overrides.items() if dec.provenance.get(k, Origin("", "")).kind != GIVEN}
    if rest:
        dec.cfg = build_config(dec.cfg.to_dict(), dec.provenance, rest, context, dec.state)


def load_checkpoint(
    path: str | os.PathLike | Source,
    *,
    fmt: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    source_image_size: int | tuple[int, int] | None = None,
    readers: Mapping[str, Reader] | None = None,
    strict: bool = False,
    lazy: bool = False,
    streamed: bool = False,
    **overrides: Any,
) -> Checkpoint:
    """Read any supported checkpoint file or folder, or a hub model id ``hf-hub:ORG/NAME[@REVISION]``
    (see ``open_checkpoint``), into (config, canonical state, report, info).

    ``path`` may be a ``Source`` from ``open_checkpoint`` (then it is not opened again). ``info`` is the
    preprocessing and class names the file declares, or its format's usual choice (assumed, warned in
    ``info.warnings``), read from the same source (``vit_common.checkpoints.metadata.read_info``).

    Args:
        fmt: force a format (``FORMATS``) instead of detecting it.
        image_size: target image size; the position embedding is resampled to its grid with the config's
            ``posemb_resample`` (the format's default, or an override).
        num_classes: target class count; a different count replaces the head with a zero-initialised one
            (0 drops it). Also resolves files whose stored config disagrees with their head, and keeps an
            all-zero .npz head that is otherwise dropped.
        source_image_size: the size the file was trained at, for files that store none (timm, .npz):
            needed for a non-square grid, and it removes the square-grid assumption.
        readers: {'torch': fn, 'orbax': fn} from the framework adapters, for those containers.
        strict: refuse to assume: raise if any field that changes the function is not declared or
            derived (``report.assumed`` lists them otherwise, each with a warning).
        lazy: return the state as the reader streams it (``formats.tensors``: read-only memory-mapped
            views and ``LazyTensor``s that load when ``np.asarray`` asks) instead of writable arrays in
            memory; what ``convert`` passes on to the writer.
        streamed: the state only passes through to a writer that streams it (``convert``): the memory
            check counts the activations the config declares, not the parameters, which need not fit
            in memory (a 27 GB float32 model converts on a 24 GB machine).
        overrides: ViTConfig fields replacing inferred ones (num_heads, gelu, ln_eps, pool, dtype...).

    Raises:
        FileNotFoundError: no such path.
        FormatError (a ValueError): unknown, truncated or corrupt file; a model the twins do not
            implement (named); a head that disagrees with the stored config (pass num_classes); a needed
            framework reader is missing; with strict, an assumed field (named with its flag); a hub id
            neither cached nor reachable.
        StateMismatchError (a ValueError): missing / unexpected / wrong-shape tensors, listed together.
    """
    opened = open_checkpoint(path)
    path = opened.path
    if fmt is not None:
        _format(fmt)
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(ViTConfig)})
    if unknown:
        raise ValueError(f"unknown ViTConfig field(s) {unknown} to override")
    if source_image_size is not None:
        source_image_size = ViTConfig(image_size=source_image_size, patch_size=1).image_size
    src = load_tensors(opened, readers)
    f = _format(fmt) if fmt else _detect(src)
    opts = ReadOptions(source_image_size, dict(overrides), num_classes is not None, readers)
    dec = f.read(src, opts)
    _apply_overrides(dec, overrides, str(path))
    validate.check_holds(dec.cfg, dec.state, str(path))
    validate.check_model_size(dec.cfg, str(path), parameters=not streamed)
    validate.check_weights(dec.state, str(path))
    if source_image_size is not None:
        stated = dec.provenance.get("image_size")
        if stated is not None and stated.kind == DECLARED and tuple(dec.cfg.image_size) != source_image_size:
            raise FormatError(
                f"{path}: source_image_size={source_image_size} but the file declares "
                f"image_size={tuple(dec.cfg.image_size)} ({stated.source})"
            )
        if stated is None or stated.kind != DECLARED:
            dec.provenance["image_size"] = Origin(GIVEN, "source_image_size")
    if dec.conflicts and num_classes is None:
        k = dec.cfg.num_classes
        raise FormatError(
            f"{path}: {'; '.join(dec.conflicts)}. Pass num_classes={k} (vit convert --num-classes "
            f"{k}) to use the head as stored, or another count to replace it"
        )
    report = Report(
        source=opened.name or str(path),
        format=f.name,
        layout=dec.layout,
        tensors_read=len(src.tensors) or len(dec.state),
        provenance=dict(dec.provenance),
        dropped=list(src.dropped) + list(dec.dropped),
        notes=list(dec.notes),
        model_type=dec.model_type,
    )
    # which of a training checkpoint's weight entries was read: a warning, so every command states it
    report.warnings += [f"{k!r}: {why}" for k, why in src.dropped if k in WEIGHT_ENTRIES]
    report.warnings += src.warnings
    cfg, state = dec.cfg, dict(dec.state)
    if num_classes is not None:
        report.provenance["num_classes"] = Origin(GIVEN, "num_classes")
        if num_classes != cfg.num_classes:
            cfg = _new_head(cfg, state, num_classes, report)
    if image_size is not None:
        before = cfg.image_size
        cfg = _resample(cfg, state, image_size, report)
        read_as = report.provenance.get("image_size")
        if cfg.image_size != before and (read_as is None or read_as.kind != ASSUMED):  # an assumed source stays so
            h, w = before
            report.provenance["image_size"] = Origin(GIVEN, f"image_size (the file's {h}x{w}, resampled)")
    check_canonical(cfg, state, str(path))
    state = {k: state[k] for k in canonical_shapes(cfg)}  # timm state_dict order
    report.assumed = assumed_fields(dec.cfg, report.provenance)
    if strict and report.assumed:
        raise FormatError(
            f"{path}: strict reading refuses assumptions, and the file does not say "
            + "; ".join(f"{k} (assumed {getattr(dec.cfg, k)!r}: pass {flag_for(k)})" for k in report.assumed)
        )
    report.assumptions = [assumption_line(dec.cfg, k, report.provenance[k]) for k in report.assumed]
    report.warnings += [f"{k} holds NaN or Inf" for k, v in state.items() if nonfinite(dict(enumerate(row_parts(v))))]
    report.config = cfg
    return Checkpoint(cfg, state if lazy else materialize(state), report, read_info(src, f))


def read_checkpoint(path: str | os.PathLike, **kwargs: Any) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """(config, canonical state) of any supported checkpoint; arguments as ``load_checkpoint``.

    The assumed fields are issued as one ``UserWarning`` (the report's ``assumption_block``, naming the
    keywords that give them), the report's other warnings (NaN/Inf tensors, the weights entry read) one
    each, every one pointing at the caller's line outside the project's packages.
    """
    ckpt = load_checkpoint(path, **kwargs)
    block = ckpt.report.assumption_block(api=True)
    for w in (["\n".join(block)] if block else []) + ckpt.report.warnings:
        warnings.warn(f"{path}: {w}", UserWarning, stacklevel=_caller_level())
    return ckpt.cfg, ckpt.state


PACKAGES = frozenset({"vit_common", "vit_jax", "vit_torch", "vit_compare", "vit_cli", "benchmarks"})


def _caller_level() -> int:
    """The ``warnings.warn`` stacklevel, for the function calling this one, of the first frame outside
    the project's packages: a warning points at the user's line (``vit_jax.load_model(...)``), not at the
    library function that read the file."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in PACKAGES:
        frame, level = frame.f_back, level + 1
    return level


# --------------------------------------------------------------------------------------- writing


def check_assumed(
    path: str | os.PathLike, fmt: str, cfg: ViTConfig, assumed: Sequence[str], accept: Sequence[str] | str = ()
) -> None:
    """Refuse to write fields that were ``assumed`` where the file would state them as fact
    (``Format.states_as_fact``: an HF config.json, a timm hub folder's config.json), unless each is in
    ``accept`` (or ``accept`` is "all"). Files that store no config (a timm state_dict) or record what was
    assumed (ours, orbax, our timm .safetensors) are written whatever was assumed; the report keeps the
    assumptions.

    Raises:
        ValueError: naming the path, each field and its assumed value, and the two ways out.
    """
    if not _format(fmt).states_as_fact(Path(path)) or accept == "all":
        return
    refused = [k for k in assumed if k not in accept]
    if refused:
        values = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in refused)
        raise ValueError(
            f"{path}: its config.json states every field as fact to {_format(fmt).reference.library}, and "
            f"{values} {'was' if len(refused) == 1 else 'were'} assumed (the source does not state "
            f"{'it' if len(refused) == 1 else 'them'}): give the value with --set (or --source-image-size), or "
            f"write the assumption as fact with --accept-assumed {','.join(refused)} (or all)"
        )


def save_checkpoint(
    path: str | os.PathLike,
    cfg: ViTConfig,
    state: TensorMap,
    fmt: str | None = None,
    *,
    writers: Mapping[str, Callable] | None = None,
    options: WriteOptions | None = None,
    assumed: Sequence[str] = (),
    accept_assumed: Sequence[str] | str = (),
    preprocess: Preprocess | None = None,
    classes: Sequence[str] | None = None,
    preprocess_assumed: str = "",
) -> Report:
    """Write ``state`` as ``fmt`` (default: from the suffix, see ``output_format``), atomically.

    ``options``: an instance of the format's ``write_options`` (``formats.hf.HfWriteOptions``: the
    ``spelling`` of HF keys; ``formats.npz.NpzWriteOptions``: ``prefix`` and ``scan`` of .npz layouts;
    None: its defaults). ``assumed``: config fields that were assumed when the state was read (a
    ``report.assumed``), recorded where the format can (our and timm's .safetensors, HF config.json) so
    they stay assumed, warned where it cannot; a file that would state them as fact
    (``Format.states_as_fact``: HF, a timm hub folder) is refused unless the fields are in
    ``accept_assumed`` (or it is "all"; ``check_assumed``). ``preprocess`` and ``classes`` (K names) are recorded
    where the format can hold them (``vit_common.checkpoints.metadata``): safetensors metadata of our and timm files,
    an HF folder's preprocessor_config.json and id2label; other formats get a note. ``preprocess_assumed``
    (why; empty: declared) marks ``preprocess`` assumed where the format can say so (our and timm
    .safetensors, orbax); a file that would state it as fact (``Format.states_as_fact``) gets it only if
    "preprocess" is in ``accept_assumed`` (or it is "all"), a warning otherwise. Nothing is written
    unless the whole conversion succeeds; an existing destination is replaced only if it is provably ours
    (``vit_common.system.io.check_destination``). ``report.load_call`` is the library code that loads the
    written file strictly (timm or transformers), where there is one.

    Raises:
        StateMismatchError / ValueError: the state does not fit, the format cannot hold the config, or
            it would state an assumed field as fact (``check_assumed``), or ``options`` are another
            format's.
        FormatError: a writer this format needs (torch, orbax) was not given.
        DestinationError (an OSError): ``path`` holds something vit did not write (checked first).
    """
    path = Path(path)
    f = _format(fmt or output_format(path))
    options = f.write_options() if options is None else options
    if type(options) is not f.write_options:
        raise ValueError(f"{type(options).__name__} are not the {f.name} format's options ({f.write_options.__name__})")
    io.check_destination(path, folder=f.writes_folder(path))
    check_assumed(path, f.name, cfg, assumed, accept_assumed)
    check_canonical(cfg, state, f"writing {f.name}")
    why, dropped = (preprocess_assumed if preprocess is not None else ""), []
    if why and f.states_as_fact(path) and accept_assumed != "all" and "preprocess" not in accept_assumed:
        preprocess, why = None, ""
        dropped.append(
            f"{path}: the preprocessing was assumed ({preprocess_assumed}) and {f.name} files would state it as "
            "fact, so it was not written (their readers assume their own); write it with --accept-assumed preprocess"
        )
    enc = f.encode(cfg, state, path, options, tuple(assumed))
    report = Report(config=enc.cfg, notes=list(enc.notes) + f.record_info(enc, preprocess, classes, why))
    report.warnings += dropped
    report.written, report.written_format = str(path), f.name
    report.warnings += read_back(f, enc, assumed)
    f.write(path, enc, writers)
    confirm_checked(enc)
    report.load_call = enc.load_call or f.load_call(path, enc.cfg)
    return report


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    from_fmt: str | None = None,
    to_fmt: str | None = None,
    readers=None,
    writers=None,
    write_options: WriteOptions | None = None,
    accept_assumed: Sequence[str] | str = (),
    **read_options: Any,
) -> Report:
    """Read ``src`` (a path, or a ``Source`` from ``open_checkpoint``; see ``load_checkpoint`` for
    ``read_options``) and write ``dst`` (``write_options`` as ``save_checkpoint``'s ``options``,
    ``accept_assumed`` as its own); one report for both.

    Preprocessing and class names that ``src`` declares (``vit_common.checkpoints.metadata``) are written where
    ``dst``'s format holds them (class names not for a replaced head); assumed preprocessing as
    ``save_checkpoint``'s ``preprocess_assumed``: marked assumed in ours, orbax and timm .safetensors, not
    stated as fact in HF or timm hub folders unless accepted.
    Write options left unset are completed from the source by ``dst``'s format
    (``Format.complete_options``: an hf_family folder read from a ``vit_mae`` folder is written as one).

    Raises:
        ValueError: ``dst`` is ``src``, lies inside it or holds it (the source would be replaced by its own
            conversion: ``vit_common.system.io.check_apart``); declared preprocessing or class names
            that ``vit predict`` would refuse (``ModelInfo.check``); and what ``load_checkpoint`` and
            ``save_checkpoint`` raise.
    """
    src = open_checkpoint(src)
    io.check_apart(dst, {"the source": src.path})
    ckpt = load_checkpoint(src, fmt=from_fmt, readers=readers, lazy=True, streamed=True, **read_options)
    info = ckpt.info
    if read_options.get("num_classes") is None:  # a replaced head drops the old class names
        info.check(ckpt.cfg.image_size, ckpt.cfg.num_classes, str(src.path))
    source = info.preprocess_source
    declared = dict(
        preprocess=None if info.no_budget else info.preprocess,  # a budget not declared stays undeclared
        preprocess_assumed="" if source.startswith("declared") else source.removeprefix("assumed: "),
        classes=info.classes if info.classes is not None and len(info.classes) == ckpt.cfg.num_classes else None,
    )
    f = _format(to_fmt or output_format(dst))
    options = f.complete_options(f.write_options() if write_options is None else write_options, ckpt.report)
    out = save_checkpoint(
        dst,
        ckpt.cfg,
        ckpt.state,
        to_fmt,
        writers=writers,
        options=options,
        assumed=ckpt.report.assumed,
        accept_assumed=accept_assumed,
        **declared,
    )
    report = ckpt.report
    report.notes += out.notes
    report.warnings += out.warnings
    report.written, report.written_format, report.load_call = out.written, out.written_format, out.load_call
    return report
