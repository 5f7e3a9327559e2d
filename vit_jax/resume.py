"""The rules of ``--resume``: what a run folder's config.json holds, and whether a run may continue from it.

``run_config`` is what config.json holds: the model, train and preprocessing configs, the class names,
the dataset's fingerprint, the devices. A resumed run must have the same config (``config_mismatch``
lists every field that differs; ``TrainConfig.settings()``, ``TrainConfig.placement()`` and ``epochs``
may change, and a field the saved config lacks counts as its default) and the same data (``check_same_data``, by
``vit_common.data.fingerprint.fingerprint_changes``); another epoch count recomputes the learning-rate
schedule for the new total (``schedule_change`` says how, and refuses a total that ends before the
checkpoint). Each refusal is a ValueError naming what differs. ``vit_jax.loop.fit`` applies
these rules; which checkpoints a folder holds is ``vit_jax.checkpointing.saved_steps``. The torch twin has
no counterpart (see ``vit_torch.train``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax

from vit_common.config import ViTConfig
from vit_common.data.augment import Augment
from vit_common.data.fingerprint import fingerprint_changes
from vit_common.training.train_config import TrainConfig
from vit_jax.optim import lr_schedule
from vit_jax.trainer import Trainer


def _json_defaults(cls) -> dict:
    """{field: its default as config.json stores it} of a config dataclass (tuples as lists)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = list(f.default) if isinstance(f.default, tuple) else f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def config_mismatch(saved: dict, current: dict) -> list[str]:
    """Fields (section.field) whose values differ between two config.json dicts, except those a resumed
    run may change: ``TrainConfig.settings()``, ``TrainConfig.placement()`` (the mesh, restored onto) and
    ``epochs`` (see ``schedule_change``). A field the saved config lacks (the run was started by a version
    without it; an ``Augment`` field too) counts as its default then."""
    out = []
    defaults = {"model": _json_defaults(ViTConfig), "train": _json_defaults(TrainConfig)}
    for section in ("model", "train", "preprocess"):
        a, b = saved.get(section, {}), current.get(section, {})
        a = {**{k: v for k, v in defaults.get(section, {}).items() if k in b}, **a}
        if isinstance(a.get("augment"), dict) and isinstance(b.get("augment"), dict):  # its fields likewise
            a["augment"] = {**{k: v for k, v in _json_defaults(Augment).items() if k in b["augment"]}, **a["augment"]}
        free = [*TrainConfig.settings(), *TrainConfig.placement(), "epochs"] if section == "train" else []
        out += [
            f"{section}.{k}: checkpoint has {a.get(k)!r}, now {b.get(k)!r}"
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and k not in free
        ]
    return out


def check_same_data(out: Path, saved: dict, fingerprint: dict, lead: bool) -> None:
    """Refuse to resume on data other than the run's (``vit_common.data.fingerprint.fingerprint_changes``
    against config.json's ``dataset``); files whose modification times alone changed are one warning
    line (process 0), as is a run folder written before fingerprints were stored.

    Raises:
        ValueError: the data changed; one line listing what changed.
    """
    if "dataset" not in saved:
        if lead:
            print(
                f"vit train: warning: {out}/config.json holds no dataset fingerprint; the data is not checked",
                file=sys.stderr,
            )
        return
    errors, warnings = fingerprint_changes(saved["dataset"], fingerprint)
    if errors:
        raise ValueError(
            f"{out}: the dataset changed since the run started ({'; '.join(errors)}); resume on the run's data, "
            "or start a new run with another --out"
        )
    for w in warnings if lead else []:
        print(f"vit train: warning: dataset: {w}; resuming as the same data", file=sys.stderr)


def check_checkpoints_left(out: Path, saved: list[int]) -> None:
    """Refuse a resume of a run that reached a checkpoint but has none left (``saved`` empty): its exports
    (``model.safetensors``) or an emptied ``checkpoints/`` folder (``vit_jax.loop.fit`` removes it when a
    run stops before its first checkpoint) show it trained, and starting again from step 0 would replace
    them without a word. A run stopped before its first checkpoint has neither and starts afresh.

    Raises:
        FileNotFoundError: one line naming the folder and what shows the run trained.
    """
    if saved:
        return
    shown = [f"{out / 'model.safetensors'} exists"] if (out / "model.safetensors").exists() else []
    if (out / "checkpoints").is_dir():
        shown.append(f"{out / 'checkpoints'} holds no complete checkpoint")
    if shown:
        raise FileNotFoundError(
            f"{out}: nothing to resume from: the run trained ({'; '.join(shown)}), but no checkpoint is left; "
            "train again with another --out"
        )


def schedule_change(trainer: Trainer, saved_epochs: int, step: int) -> str | None:
    """What resuming at ``step`` a run saved with ``saved_epochs`` changes when ``trainer`` has another
    epoch count: the learning-rate schedule (warmup + cosine decay) is recomputed for the new total, so
    from ``step`` on the rate follows the new curve (as timm's and transformers' Trainer do on a resume
    with more epochs). None when the epoch count is the same.

    Raises:
        ValueError: the new total ends before ``step``, where the checkpoint already is.
    """
    tcfg, total = trainer.tcfg, trainer.total_steps
    if saved_epochs == tcfg.epochs:
        return None
    if total < step:
        raise ValueError(
            f"--epochs {tcfg.epochs} ({total} steps) ends before the checkpoint's step {step}; expected "
            f"--epochs >= {-(-step // trainer.steps_per_epoch)}"
        )
    old = lr_schedule(tcfg, trainer.steps_per_epoch * saved_epochs, trainer.steps_per_epoch)
    was, now = float(old(step)), float(trainer.schedule(step))
    return (
        f"--epochs {tcfg.epochs} (the run was started with {saved_epochs}): the learning-rate schedule is "
        f"recomputed for {total} steps, so from step {step} on it follows the new one (lr {now:.3g} at step "
        f"{step + 1}, where the old schedule had {was:.3g})"
    )


def run_config(trainer: Trainer) -> dict:
    """What config.json holds: the model, train and preprocessing configs, the class names, the devices
    and their mesh ({axis: size})."""
    return {
        "model": trainer.cfg.to_dict(),
        "train": trainer.tcfg.to_dict(),
        "preprocess": trainer.preprocess.to_dict(),
        "classes": list(trainer.data.classes),
        "dataset": trainer.data.fingerprint,
        "devices": f"{trainer.mesh.size} x {jax.devices()[0].platform}",
        "mesh": dict(trainer.mesh.shape),
        "processes": jax.process_count(),
    }
