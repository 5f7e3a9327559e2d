"""Fine-tuning the JAX twin from a checkpoint of any format: the checkpoint read once for a dataset, its
head matched to the dataset's classes, and the result exported in the checkpoint's own format.

The config is resolved in one order: the dataset (``vit_common.data.datasets.read_dataset``: its classes
and channels) -> the checkpoint, read once with the dataset's class count and the image size to train at
-> the config (fields the caller gives checked or applied) -> the dataset fit to that config. ``vit
train --init`` is this module and ``vit_jax.loop``, driven by ``vit_jax.launch``; the checks of the exports
in vit_torch, timm and transformers run where torch may be imported (``vit_compare.exports.export_parity``,
passed to ``vit_jax.launch.run_training``), so importing this module loads no torch. Readers and writers of
PyTorch ``.pth``/``.bin`` files are passed in (``vit_torch.formats.READERS`` / ``WRITERS``), as
``vit_common.checkpoints.convert`` takes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.adapter import (
    ADAPTER_FOLDER,
    peft_adapter,
    spelling_warning,
    transformers_rules,
    write_peft_adapter,
)
from vit_common.checkpoints.convert import check_assumed, load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.provenance import Report
from vit_common.checkpoints.formats.timm import TimmWriteOptions
from vit_common.checkpoints.formats.timm_naflex import source_name
from vit_common.checkpoints.metadata import ModelInfo, with_overrides
from vit_common.checkpoints.registry import REGISTRY
from vit_common.config import RUNTIME_FIELDS, ViTConfig
from vit_common.data.datasets import Dataset
from vit_common.data.images import Preprocess
from vit_common.system.io import check_destination
from vit_common.training.train_config import TrainConfig
from vit_jax.formats import READERS, WRITERS

# Fields a caller does not give to ``load_init``: the dataset decides them (classes, channels), or
# they are arguments of their own (the image size to train at).
NOT_GIVEN = frozenset({"num_classes", "in_chans", "image_size"})


@dataclass
class Init:
    """What fine-tuning starts from.

    ``cfg``: the checkpoint's config with the dataset's class count K, the image size to train at,
    float32 parameters and the given runtime fields; ``weights``: its canonical state, float32 (a new
    head zero-initialised, position embedding resampled); ``info``: preprocessing and class names with
    their provenance (from the same read, the given preprocessing fields on top); ``report``: how the
    checkpoint was read (format, where each field came from, what changed); ``data``: the dataset fit
    to ``cfg`` (its image size, the checkpoint's channels, the checkpoint's preprocessing). A resumed
    run's Init (``resumed_init``) has no ``weights``: its checkpoint holds them.
    """

    cfg: ViTConfig
    weights: dict[str, np.ndarray] | None
    info: ModelInfo
    report: Report
    data: Dataset


def load_init(
    path: str | Path,
    data: Dataset,
    *,
    image_size: int | tuple[int, int] | None = None,
    given: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    preprocess: Mapping[str, Any] | None = None,
    readers: Mapping[str, Any] | None = None,
    lazy: bool = False,
) -> Init:
    """Read the checkpoint at ``path`` once, for ``data`` (``read_dataset``'s, classes named).

    Args:
        image_size: train at this size (S or (H, W)); the position embedding is resampled with the
            config's ``posemb_resample``. Default: the checkpoint's.
        given: ViTConfig fields of the model asked for. Fields that change the function
            (``FUNCTION_FIELDS``) must be the checkpoint's: a check, as the file decides them (correct
            what a file stores wrongly with ``options``); runtime fields (``RUNTIME_FIELDS``: dropout,
            drop path, dtype, ...) replace the checkpoint's. ``dtype`` is float32 unless given.
        options: ``load_checkpoint`` keywords: config overrides of what the file stores or lacks,
            ``source_image_size``, ``strict``.
        preprocess: ``Preprocess`` fields replacing what the file declares; ``max_patches`` for a timm
            NaFlexVit source (``metadata.with_overrides``) makes its preprocessing a NaFlex one.
        readers: container readers besides orbax's (``vit_torch.formats.READERS`` for .pth/.bin).
        lazy: ``weights`` as the reader streams them (``load_checkpoint(lazy=True)``: memory-mapped views
            and ``LazyTensor``s, in the file's dtype, cast to float32 as ``vit_jax.weights.from_numpy``
            places each) instead of float32 arrays in memory: no copy of the file is held.

    The head: the dataset's K classes replace one of another count with a zero-initialised head
    (big_vision ``head_zeroinit``); a head of K rows is kept when the checkpoint names the same classes,
    its rows reordered when it names them in another order, zeroed when it names others (each change
    a note of ``report``).

    Raises:
        ValueError: a field of ``given`` that is not the checkpoint's, or that has no place here
            (``NOT_GIVEN``: named with where it comes from); whatever ``load_checkpoint`` raises (an
            image size the patch does not divide, an unreadable file, ...); an invalid preprocessing field.
        FileNotFoundError: no such checkpoint.
    """
    given = dict(given or {})
    misplaced = sorted(set(given) & NOT_GIVEN)
    if misplaced:
        raise ValueError(
            f"{', '.join(misplaced)}: not given for fine-tuning (the dataset sets num_classes and in_chans; "
            "image_size is the argument image_size)"
        )
    runtime = {k: v for k, v in given.items() if k in RUNTIME_FIELDS}
    ckpt = load_checkpoint(
        path,
        readers={**READERS, **(readers or {})},
        image_size=image_size,
        num_classes=data.num_classes,
        lazy=lazy,
        **{**dict(options or {}), **runtime},
    )
    report, state = ckpt.report, dict(ckpt.state)
    check_given(ckpt.cfg, {k: v for k, v in given.items() if k not in RUNTIME_FIELDS}, str(path))
    try:
        info = with_overrides(ckpt.info, dict(preprocess or {}), None, bool(source_name(report.layout, ckpt.cfg)))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    resized = info.preprocess.at_size(ckpt.cfg.image_size)
    if resized != info.preprocess:
        report.notes.append(
            f"preprocessing scaled to {ckpt.cfg.image_size[0]}x{ckpt.cfg.image_size[1]}: resize_size "
            f"{list(resized.resize_size)}, crop_size {resized.crop_size and list(resized.crop_size)}"
        )
        info.preprocess = resized
    if info.classes is not None and len(info.classes) == data.num_classes:
        state = match_head(state, info.classes, data.classes, report)
    cfg = ckpt.cfg.replace(dtype=runtime.get("dtype", "float32"), param_dtype="float32")
    weights = state if lazy else {k: np.asarray(v, np.float32) for k, v in state.items()}
    return Init(cfg, weights, info, report, data.fit(cfg.image_size, cfg.in_chans, info.preprocess))


def init_record(report: Report) -> dict[str, Any]:
    """What a run stores in its config.json (``init``) of the checkpoint it fine-tunes, so that a resume
    needs the checkpoint no more: its path (``source``), format name and the fields it did not state
    (``assumed``), its model type and layout line (which the exports' ``complete_options`` read: a SigLIP
    classifier's class, a RoPE or NaFlexVit source's timm name), all the exports need (``export_targets``,
    ``check_exports``, ``export``)."""
    return {
        "source": report.source,
        "format": report.format,
        "assumed": list(report.assumed),
        "model_type": report.model_type,
        "layout": report.layout,
    }


def resumed_init(
    saved: Mapping[str, Any],
    data: Dataset,
    *,
    image_size: tuple[int, int] | None = None,
    given: Mapping[str, Any] | None = None,
    preprocess: Mapping[str, Any] | None = None,
) -> Init:
    """The Init of a fine-tuning run resumed from its folder, without reading its ``--init`` checkpoint
    again: ``saved`` is the run's config.json (``model``, ``preprocess``, ``init``: ``init_record``'s),
    ``data``, ``image_size`` (H, W), ``given`` and ``preprocess`` as ``load_init``'s. The config is the
    run's, with the image size, the given runtime fields (``dtype`` float32 unless given) and the given
    preprocessing fields on top, so a flag the run was not started with shows as a config difference
    when ``vit_jax.loop.fit`` compares the two.
    ``weights`` is None (the run's checkpoint holds them).

    Raises:
        ValueError: a field of ``given`` that changes the function and is not the run's (as
            ``check_given``); a config.json without the sections named above, naming the file's section.
    """
    missing = [k for k in ("model", "preprocess", "init") if not isinstance(saved.get(k), Mapping)]
    if missing:
        raise ValueError(f"the run's config.json has no {', '.join(missing)} section: it cannot be resumed")
    given = dict(given or {})
    record = saved["init"]
    runtime = {k: v for k, v in given.items() if k in RUNTIME_FIELDS}
    cfg = ViTConfig.from_dict(dict(saved["model"]))
    check_given(cfg, {k: v for k, v in given.items() if k not in RUNTIME_FIELDS | NOT_GIVEN}, record["source"])
    cfg = cfg.replace(**{"dtype": "float32", **runtime}, param_dtype="float32", image_size=image_size or cfg.image_size)
    pre = Preprocess.from_dict(dict(saved["preprocess"])).replace(**dict(preprocess or {}))
    info = ModelInfo(pre, "the run's config.json")
    kept = {k: record[k] for k in ("model_type", "layout") if isinstance(record.get(k), str)}  # runs since 2026-12
    report = Report(
        source=record["source"], format=record["format"], assumed=list(record["assumed"]), config=cfg, **kept
    )
    return Init(cfg, None, info, report, data.fit(cfg.image_size, cfg.in_chans, pre))


def check_given(cfg: ViTConfig, given: Mapping[str, Any], path: str) -> None:
    """Every field of ``given`` must have the value ``cfg`` (a checkpoint's) has; an int patch size
    stands for a square one.

    Raises:
        ValueError: naming each field, the value asked for and the checkpoint's.
    """
    bad = []
    for k, v in given.items():
        have = getattr(cfg, k)
        want = (v, v) if k == "patch_size" and isinstance(v, int) else v
        if want != have:
            shown = have[0] if k == "patch_size" and have[0] == have[1] else have
            bad.append(f"{k}={v!r}, the checkpoint has {k}={shown!r}")
    if bad:
        raise ValueError(
            f"{path} is not the model asked for: {'; '.join(bad)} (a field the file stores wrongly is "
            "corrected as an override of the read: vit train --set FIELD=VALUE)"
        )


def match_head(
    state: dict[str, np.ndarray], have: tuple[str, ...], want: tuple[str, ...], report: Report
) -> dict[str, np.ndarray]:
    """The head for the dataset's class order ``want``, given the checkpoint's class names ``have``
    (both K long, the head ``head.weight`` [K, D], ``head.bias`` [K]): kept if they are the same list,
    rows reordered if they are the same names in another order, zero-initialised otherwise; each change
    a note of ``report``. A state without a head is returned as it is."""
    if tuple(have) == tuple(want) or "head.weight" not in state:
        return state
    if sorted(have) == sorted(want):
        order = [have.index(c) for c in want]
        report.notes.append(f"head rows reordered from the checkpoint's class order {list(have)} to the dataset's")
        return {
            **state,
            "head.weight": np.asarray(state["head.weight"])[order],
            "head.bias": np.asarray(state["head.bias"])[order],
        }
    report.notes.append(
        f"new {len(want)}-class head, zero-initialised: the checkpoint's classes {list(have)} are not the "
        f"dataset's {list(want)}"
    )
    return {**state, "head.weight": np.zeros_like(state["head.weight"]), "head.bias": np.zeros_like(state["head.bias"])}


@dataclass
class Exported:
    """What ``export`` wrote: ``paths`` {format: path} of the exports besides ours, ``load_calls``
    {format: the library call that loads that export strictly}, ``lines`` what to tell the user (each
    export's notes and warnings, each format that could not hold the model)."""

    paths: dict[str, Path] = field(default_factory=dict)
    load_calls: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def export_targets(out: Path, source: Report | None) -> dict[str, Path]:
    """{format: path} of the exports besides ours: model_timm.safetensors, and after fine-tuning the
    model in the checkpoint's own format, named by its registry entry (``Format.export_name``:
    model_hf/, model_big_vision.npz, model_orbax/, a timm .pth/.bin source as model_timm.pth/.bin)."""
    targets = {"timm": out / REGISTRY["timm"].export_name()}
    if source is not None and source.format != "canonical":
        targets[source.format] = out / REGISTRY[source.format].export_name(Path(source.source))
    return targets


def check_exports(out: Path, cfg: ViTConfig, source: Report | None, accept_assumed: Sequence[str] | str = ()) -> None:
    """Refuse, before any training, an export path that holds something vit did not write, and an export
    that would state as fact a field the fine-tuned checkpoint did not state (``source.assumed``, unless in
    ``accept_assumed``: --accept-assumed).

    Raises:
        DestinationError: naming the path (``vit_common.system.io.check_destination``).
        ValueError: naming the export and the fields (``vit_common.checkpoints.convert.check_assumed``).
    """
    for fmt, path in export_targets(out, source).items():
        check_destination(path, folder=REGISTRY[fmt].writes_folder(path))
        check_assumed(path, fmt, cfg, source.assumed if source is not None else (), accept_assumed)


def export(
    out: Path,
    cfg: ViTConfig,
    weights: Mapping[str, np.ndarray],
    *,
    preprocess: Preprocess,
    classes: tuple[str, ...] | None,
    source: Report | None = None,
    writers: Mapping[str, Any] | None = None,
    accept_assumed: Sequence[str] | str = (),
) -> Exported:
    """Write ``out``/model.safetensors (ours: config, preprocessing and class names in its metadata) and
    the ``export_targets``; ``weights`` the canonical state of ``cfg``, ``source`` the report of the
    checkpoint fine-tuned (None for a fresh model), ``writers`` container writers besides orbax's
    (``vit_torch.formats.WRITERS`` for .pth/.bin). Fields the source did not state (``source.assumed``)
    stay recorded as assumed where a format can say so; ``accept_assumed`` as ``save_checkpoint``'s
    (``check_exports`` refused the others before the training). A timm .safetensors export shares the
    bytes of ours (one copy of the tensors on disk: ``TimmWriteOptions.weights_from``). A format that
    cannot hold the model, or whose writer is not given, is skipped with a line saying why.

    Raises:
        ValueError: ours cannot be written (as ``save_checkpoint``).
    """
    ours = REGISTRY["canonical"]
    kept = dict(assumed=source.assumed if source is not None else (), accept_assumed=accept_assumed)
    save_checkpoint(out / ours.export_name(), cfg, weights, ours.name, preprocess=preprocess, classes=classes, **kept)
    done = Exported()
    for fmt, path in export_targets(out, source).items():
        options = REGISTRY[fmt].write_options()
        if fmt == "timm":
            options = TimmWriteOptions(weights_from=str(out / ours.export_name()))
        # as ``convert``: a RoPE backbone keeps its source's q/k/v spelling and timm name, an hf_family
        # folder its source's model type (a SigLIP classifier, a NaFlex SigLIP 2)
        options = REGISTRY[fmt].complete_options(options, source)
        try:
            r = save_checkpoint(
                path,
                cfg,
                weights,
                fmt,
                writers={**WRITERS, **(writers or {})},
                options=options,
                preprocess=preprocess,
                classes=classes,
                **kept,
            )
        except (ValueError, ImportError) as e:
            done.lines.append(f"not exported as {fmt}: {e}")
            continue
        done.lines += [f"{path.name}: {line}" for line in r.notes + r.warnings]
        done.paths[fmt] = path
        if r.load_call:
            done.load_calls[fmt] = r.load_call
    return done


def adapter_rules(out: Path, cfg: ViTConfig, tcfg: TrainConfig, source: Report | None, spelling: str) -> list:
    """The rules of the transformers model a run's PEFT adapter folder is for (``out``/adapter_peft;
    ``vit_common.checkpoints.adapter.transformers_rules`` of the checkpoint's format and model type),
    checked before any training.

    Raises:
        ValueError: a run without ``tcfg.lora``, or a model no transformers model holds.
        DestinationError: the folder holds something vit did not write.
    """
    if tcfg.lora is None:
        raise ValueError(f"--export-adapter {spelling}: expected --lora RANK too: a run without adapters has none")
    check_destination(out / ADAPTER_FOLDER, folder=True)
    fmt, model_type = (source.format, source.model_type) if source is not None else (None, None)
    return transformers_rules(cfg, fmt, spelling, model_type)[1]


def adapter_warning(cfg: ViTConfig, source: Report | None, spelling: str) -> str | None:
    """``vit_common.checkpoints.adapter.spelling_warning`` for the adapter folder of ``adapter_rules``."""
    fmt, model_type = (source.format, source.model_type) if source is not None else (None, None)
    return spelling_warning(cfg, fmt, spelling, model_type)


def export_adapter(out: Path, weights: Mapping[str, np.ndarray], rules: list, tcfg: TrainConfig) -> Path:
    """Write ``out``/adapter_peft, the PEFT LoRA folder of ``weights`` (the canonical state with its
    adapters unmerged, ``vit_jax.trainer.Trainer.weights(merged=False)``) in float32, laid out by ``rules``
    (``adapter_rules``), with ``tcfg``'s rank, alpha and dropout. Returns the folder."""
    state = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    alpha = tcfg.lora_alpha if tcfg.lora_alpha is not None else tcfg.lora
    config, tensors = peft_adapter(state, rules, rank=tcfg.lora, alpha=alpha, dropout=tcfg.lora_dropout)
    write_peft_adapter(out / ADAPTER_FOLDER, config, tensors)
    return out / ADAPTER_FOLDER
