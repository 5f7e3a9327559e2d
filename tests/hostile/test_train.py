"""Hostile inputs to `vit train`: bad flags, a model too large to start, run folders that are the
user's or in use, a planted lock link, --init inside --out, damaged --init-optimizer state, exports it
would refuse only at the end, and full disks (before and during a checkpoint, under its run files, before
the exports)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from vit_cli.main import main
from vit_common.checkpoints.convert import save_checkpoint
from vit_common.data.images import Preprocess
from vit_common.state import random_state
from vit_common.system import io

from .harness import (
    HOLDERS,
    SMALL,
    TIME_LIMIT,
    TRAIN,
    Case,
    cached,
    check_case,
    child_env,
    fill_disk,
    flag,
    npz_dataset,
    ours,
    params,
    write_png,
)


def deep_model_flags(tmp: Path) -> list[str]:
    return [*TRAIN, "--depth", "100000000", "--dataset", "digits", "--out", str(tmp / "run")]


def train_into_a_user_folder(tmp: Path) -> list[str]:
    (tmp / "run").mkdir()
    (tmp / "run" / "config.json").write_text('{"mine": true}\n')
    data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
    return [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run")]


def train_while_another_runs(tmp: Path) -> list[str]:
    """``vit train`` on a folder whose lock another process holds (the lock ``vit train`` takes)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from vit_common.system import in_place\n"
            "with in_place.folder_lock(sys.argv[1], 'vit train'):\n    print('held', flush=True); time.sleep(600)",
            str(tmp / "run"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert holder.stdout.readline().strip() == "held"
    HOLDERS.append(holder)
    data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
    return [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run"), "--resume"]


def lock_is_a_link(target: str) -> Callable[[Path], list[str]]:
    """A ``.vit-lock`` planted in a run folder as a link to a file of the user's (or a dangling one)."""

    def build(tmp: Path) -> list[str]:
        (tmp / "run").mkdir()
        if target == "file":
            (tmp / "victim.txt").write_text("the user's file\n")
        os.symlink(tmp / "victim.txt", tmp / "run" / io.LOCK)
        data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
        return [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run")]

    build.__name__ = f"lock linked to {'a file' if target == 'file' else 'nothing'}"
    return build


def mesh_flags(*flags: str) -> Callable[[Path], list[str]]:
    """The tiny training run on a small npz dataset with ``flags`` (a mesh, sharding rules)."""

    def build(tmp: Path) -> list[str]:
        data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
        return [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run"), *flags]

    build.__name__ = " ".join(flags)
    return build


def init_inside_out(tmp: Path) -> list[str]:
    """Fine-tuning a run's own model.safetensors into that run folder (its export would replace it)."""
    (tmp / "run").mkdir()
    ours(tmp / "run" / "model.safetensors", SMALL.replace(image_size=8, patch_size=4).to_json(), None)
    data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
    init = ["--init", str(tmp / "run" / "model.safetensors")]
    return ["train", *init, "--no-progress", "--no-parity", "--dataset", f"npz:{data}", "--out", str(tmp / "run")]


def export_onto_a_users_folder(tmp: Path) -> list[str]:
    """Fine-tuning an HF folder into a run folder whose model_hf/ (the export in --init's format) is the
    user's: refused before the training, not after it."""
    save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
    (tmp / "run" / "model_hf").mkdir(parents=True)
    (tmp / "run" / "model_hf" / "notes.txt").write_text("mine\n")
    data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
    flags = ["--no-progress", "--no-parity", "--compile-cache", "off", "--epochs", "1", "--batch-size", "4"]
    return ["train", "--init", str(tmp / "hf"), "--dataset", f"npz:{data}", "--out", str(tmp / "run"), *flags]


def assumed_into_train_exports(tmp: Path) -> list[str]:
    """Fine-tuning HF weights without their config.json: the model_hf export's config.json would state the
    assumed GELU and eps as fact to transformers (the timm state_dict export is written freely)."""
    data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
    flags = ["--no-progress", "--no-parity", "--compile-cache", "off", "--epochs", "1", "--batch-size", "4"]
    save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
    (tmp / "hf" / "model.safetensors").rename(tmp / "weights.safetensors")
    init = ["--init", str(tmp / "weights.safetensors")]
    return ["train", *init, "--dataset", f"npz:{data}", "--out", str(tmp / "run"), *flags]


def adam_state(what: str, damage) -> Callable[[Path], list[str]]:
    """Fine-tuning with --init-optimizer from a timm-style training checkpoint (``state_dict``, and an
    ``optimizer`` of one AdamW group, step 3) whose Adam state ``damage(step, exp_avg, exp_avg_sq)`` of the
    head's weight changed (it returns the step; the moments it changes in place)."""

    def build(tmp: Path) -> list[str]:
        import torch

        state = {k: torch.from_numpy(v) for k, v in random_state(SMALL, scale=0.2).items()}
        moments = {
            i: {"step": torch.tensor(3.0), "exp_avg": v * 0.1, "exp_avg_sq": v * v}
            for i, v in enumerate(state.values())
        }
        head = list(state).index("head.weight")
        m = moments[head]
        m["step"] = damage(m["step"], m["exp_avg"], m["exp_avg_sq"])
        if m["step"] is not None:
            for other in moments.values():
                other["step"] = m["step"]
        groups = [{"weight_decay": 0.0, "lr": 1e-3, "params": list(moments)}]
        torch.save({"state_dict": state, "optimizer": {"state": moments, "param_groups": groups}}, tmp / "ckpt.pth")
        data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
        flags = ["--no-progress", "--no-parity", "--compile-cache", "off", "--epochs", "1", "--batch-size", "4"]
        init = ["--init", str(tmp / "ckpt.pth"), "--init-optimizer", "--source-image-size", "32"]
        return ["train", *init, "--dataset", f"npz:{data}", "--out", str(tmp / "run"), *flags]

    build.__name__ = f"--init-optimizer {what}"
    return build


def resume_without_checkpoints(what: str, damage: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """A finished run whose checkpoints ``damage(run)`` took away, resumed: it would train again from step
    0 and replace the exports."""

    def build(tmp: Path) -> list[str]:
        data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
        argv = [*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp / "run")]
        shutil.copytree(_finished_run(tmp.parents[1], data), tmp / "run", symlinks=True)
        damage(tmp / "run")
        return [*argv, "--resume"]

    build.__name__ = f"--resume with {what}"
    return build


def resume_changed(what: str, damage: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """A finished run whose latest checkpoint ``damage(run)`` changed, resumed on the run's own data: it
    would go on from other values."""

    def build(tmp: Path) -> list[str]:
        done = _finished_run(tmp.parents[1], npz_dataset(tmp / "d.npz", [0, 1] * 4))
        shutil.copytree(done, tmp / "run", symlinks=True)
        damage(tmp / "run")
        dataset = json.loads((done / "config.json").read_text())["train"]["dataset"]
        return [*TRAIN, "--dataset", dataset, "--out", str(tmp / "run"), "--resume"]

    build.__name__ = f"--resume with {what}"
    return build


def naflex_init(*flags: str, fixed: bool = False) -> Callable[[Path], list[str]]:
    """``vit train --init`` of ``SMALL`` as a NaFlex model (no class token, its stored preprocessing a
    budget of 16 patches), or with ``fixed`` as it is, on an npz dataset, with ``flags``."""

    def build(tmp: Path) -> list[str]:
        cfg = SMALL if fixed else SMALL.replace(class_token=False, pool="gap", posemb_resample="bilinear_aa")
        pre = None if fixed else Preprocess(max_patches=16)
        save_checkpoint(tmp / "n.safetensors", cfg, random_state(cfg, scale=0.2), "canonical", preprocess=pre)
        data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
        init = ["--init", str(tmp / "n.safetensors"), "--dataset", f"npz:{data}", "--out", str(tmp / "run")]
        return [*TRAIN[:1], *TRAIN[-4:], *init, "--batch-size", "4", *flags]

    build.__name__ = f"train --init {'FIXED' if fixed else 'NAFLEX'} {' '.join(flags)}"
    return build


def plan_over_the_memory(tmp: Path) -> list[str]:
    """``--plan`` of a step over ``--device-memory``: refused as the run would be, not printed as if it fit."""
    data = npz_dataset(tmp / "d.npz", [0, 1] * 4)
    return [*TRAIN, "--dataset", f"npz:{data}", "--plan", "--device-memory", str(10 / 2**20), *cached(tmp.parents[1])]


def _finished_run(base: Path, data: Path) -> Path:
    """A finished run on ``data``'s images, trained once a session under ``base`` (the session's temporary
    folder) and copied by each case: a run folder copied elsewhere is the same run (config.json)."""
    done = base / "finished-run"
    if not done.is_dir():
        work = base / f"finished-run-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        assert main([*TRAIN, "--dataset", f"npz:{data}", "--out", str(work / "run"), *cached(base)]) == 0
        with contextlib.suppress(OSError):  # another worker was first: its run is the same
            os.rename(work, done)
    return done / "run"


def _checkpoints_removed(run: Path) -> None:
    shutil.rmtree(run / "checkpoints")


def _checkpoints_half_written(run: Path) -> None:
    """Every step folder renamed as orbax names one still being written."""
    for step in (run / "checkpoints").iterdir():
        step.rename(step.with_name(f"{step.name}.orbax-checkpoint-tmp-1"))


def _data_file(run: Path) -> Path:
    """The latest checkpoint's data file of the arrays (the largest; the others are b-tree nodes)."""
    step = max((run / "checkpoints").iterdir(), key=lambda p: int(p.name))
    return max((step / "state" / "ocdbt.process_0" / "d").iterdir(), key=lambda f: f.stat().st_size)


def _restored(step: Path) -> list:
    """The arrays of a checkpoint's state folder as orbax reads them (onto one device), in the state's order."""
    import jax
    import orbax.checkpoint as ocp

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as ckptr:
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), ckptr.metadata(step).item_metadata
        )
        return [np.asarray(x) for x in jax.tree.leaves(ckptr.restore(step, target))]


def _changed_in_place(change: Callable[[bytearray, int], None]) -> Callable[[Path], None]:
    """``change(data, at)`` of the data file's bytes at the first of its sixteenths where orbax still reads
    the checkpoint, and reads other values, without an error (where zstd left stored floats as they are: the
    layout varies from run to run; each try in a copy of its own, tensorstore caching what it read)."""

    def damage(run: Path) -> None:
        f = _data_file(run)
        data, step = f.read_bytes(), f.parents[3]
        before = _restored((step / "state").absolute())
        for i in range(1, 16):
            changed = bytearray(data)
            change(changed, len(data) * i // 16)
            trial = run.parent / f"trial-{i}"
            shutil.copytree(step, trial)
            (trial / f.relative_to(step)).write_bytes(bytes(changed))
            try:
                after = _restored(trial.absolute() / "state")
            except Exception:  # the zstd frame no longer decodes: orbax refuses it without a checksum
                continue
            finally:
                shutil.rmtree(trial)
            if any(not np.array_equal(a, b) for a, b in zip(after, before, strict=True)):
                f.write_bytes(bytes(changed))
                return
        raise AssertionError(f"{f}: no change of one sixteenth that orbax reads as other values")

    return damage


def _zeroed(data: bytearray, at: int) -> None:
    data[at : at + 8] = bytes(8)


def _flipped(data: bytearray, at: int) -> None:
    data[at] ^= 0x01


CHANGED = (
    r"{tmp}/run/checkpoints/\d+: the state's [\w.]+ does not match the checksum recorded when the checkpoint "
    "was written: its data files were changed or damaged"
)


def batch_larger_than_the_data(spec: str, batch: int) -> Callable[[Path], list[str]]:
    """``vit train --batch-size batch`` on ``spec``: "npz" 8 training images (and 2 test), "imagefolder" 4
    (of 6, the rest the test split)."""

    def build(tmp: Path) -> list[str]:
        if spec == "npz":
            data = f"npz:{npz_dataset(tmp / 'd.npz', [0, 1] * 4, [0, 1])}"
        else:
            for c in ("a", "b"):
                (tmp / "imgs" / c).mkdir(parents=True)
                for i in range(3):
                    write_png(tmp / "imgs" / c / f"{i}.png", (8, 8))
            data = f"imagefolder:{tmp / 'imgs'}"
        return [*TRAIN, "--batch-size", str(batch), "--dataset", data, "--out", str(tmp / "run")]

    build.__name__ = f"batch {batch} on {spec}"
    return build


def relative_paths(what: str, *flags: str) -> Callable[[Path], list[str]]:
    """``vit train`` run in the case's folder with ``flags`` (``{tmp}``: the folder; ``CACHE``: the session's
    compilation cache) and relative output paths: its run folder ``--out a/b/run`` or, without one, the
    default ``runs/npz``, perhaps a ``--compile-cache`` folder; refused, or a ``--plan`` that writes
    nothing. No folder is left that the command made on its way (before: ``runs/``, ``a/b/``, the cache
    folder stayed, empty)."""

    def build(tmp: Path) -> list[str]:
        data = npz_dataset(tmp / "d.npz", [0, 1] * 4, [0, 1])
        given = [f.replace("{tmp}", str(tmp)) for f in flags]
        given = [x for f in given for x in (cached(tmp.parents[1]) if f == "CACHE" else [f])]
        return [*TRAIN, "--dataset", f"npz:{data}", *given]

    build.__name__ = f"relative paths, {what}"
    return build


def _plan_printed(tmp: Path, output: str) -> None:
    assert output.startswith("memory plan per device: "), output


def _set(tensor, value):
    tensor.view(-1)[0] = value


CASES = [
    # silent wrong results
    Case(flag("train", "--mixup", "nan"), r"--mixup: 'nan': expected a finite number in \[0, inf\)"),
    Case(flag("train", "--rotate", "nan"), r"--rotate: 'nan': expected a finite number in \[0, 180\]"),
    Case(
        flag("train", "--cutmix-minmax", "0.8", "0.2"),
        r"cutmix_minmax=\(0.8, 0.2\): expected two fractions MIN MAX with 0 <= MIN < MAX <= 1",
    ),
    Case(flag("train", "--lr", "inf"), r"--lr: 'inf': expected a finite number in \(0, inf\)"),
    Case(flag("train", "--val-fraction", "1"), r"--val-fraction: '1': expected a finite number in \(0, 1\)"),
    Case(flag("train", "--epochs", "0"), r"--epochs: '0': expected an integer in \[1, "),
    Case(
        flag("train", "--plan", "--device-memory", "0"), r"--device-memory: '0': expected a finite number in \(0, inf\)"
    ),
    Case(flag("train", "--plan", "--device-memory", "1e-12"), r"--device-memory: '1e-12': expected at least one byte"),
    Case(flag("train", "--depth", "1e9"), r"--depth: '1e9': expected an integer"),
    Case(
        flag("train", "--ema", "0.5", "--ema-warmup", "--ema-min-decay", "0.99"),
        r"ema_min_decay=0.99: expected at most ema=0.5 \(the warm-up's lowest decay cannot lie above its highest\)",
    ),
    Case(flag("train", "--ema-warmup", "--ema-min-decay", "0.3"), r"ema_warmup=True: expected --ema DECAY too"),
    Case(
        deep_model_flags,
        r"the model flags: a model with depth=100000000, .* \(parameters, gradients, optimizer state",
        child=True,
    ),
    Case(flag("train", "--mesh", "replica=2,model=4"), r"mesh='replica=2,model=4': expected replica=R,fsdp=F"),
    Case(
        mesh_flags("--mesh", "replica=2,fsdp=4", "--cpu-devices", "2"),
        r"mesh='replica=2,fsdp=4': expected sizes whose product is the device count, 2 .*, not 8",
        child=True,
    ),
    Case(mesh_flags("--shard-rules", "qkv=largest"), r"shard_rules: 'qkv=largest' decides no parameter"),
    Case(
        mesh_flags("--cpu-devices", "2", "--mesh", "fsdp=2", "--shard-rules", r"patch_embed\.proj\.kernel=.,.,fsdp,."),
        r"splits dimension 2 of patch_embed.proj.kernel \[4, 4, 1, 16\] over fsdp \(2 devices\), which does not "
        r"divide 1",
        child=True,
    ),
    Case(
        naflex_init("--mixup", "0.8"),
        r"mixup=0.8, cutmix=0.0, cutmix_minmax=None with a NaFlex model: its images have grids of their own",
    ),
    Case(
        naflex_init("--max-patches", "16", fixed=True),
        r"max_patches=16 for a fixed-size model \(preprocessing .*\): expected a NaFlex model",
    ),
    Case(flag("train", "--max-patches", "16"), r"--max-patches 16 without --init: NaFlex training fine-tunes a NaFlex"),
    # cost out of proportion
    Case(
        batch_larger_than_the_data("npz", 9), r"batch_size=9: expected at most the 8 training images of npz:{tmp}/d.npz"
    ),
    Case(
        batch_larger_than_the_data("imagefolder", 4096),
        r"batch_size=4096: expected at most the 4 training images of imagefolder:{tmp}/imgs \(a larger batch is",
    ),
    # nothing left that a refused command made
    Case(
        relative_paths("default --out, batch refused", "--batch-size", "9"),
        r"batch_size=9: expected at most the 8 training images",
    ),
    Case(
        relative_paths(
            "--init missing", "--out", "a/b/run", "--compile-cache", "c/jax", "--init", "{tmp}/none.safetensors"
        ),
        r"{tmp}/none.safetensors: no such file",
    ),
    Case(
        relative_paths("over the device's memory", "--out", "a/b/run", "--device-memory", "1e-5", "CACHE"),
        r"the training step needs .* per device, beyond the 10.5 KiB of cpu",
    ),
    Case(
        relative_paths("--plan", "--out", "a/b/run", "--plan", "CACHE"),
        "",
        code=0,
        check=_plan_printed,
    ),
    Case(train_into_a_user_folder, r"{tmp}/run/config.json: exists and vit cannot tell it wrote it"),
    Case(train_while_another_runs, r"{tmp}/run: in use by another vit train \(pid \d+\)"),
    Case(lock_is_a_link("file"), r"{tmp}/run/.vit-lock: a symbolic link where vit keeps its lock file"),
    Case(lock_is_a_link("nothing"), r"{tmp}/run/.vit-lock: a symbolic link where vit keeps its lock file"),
    Case(init_inside_out, r"{tmp}/run: the output holds --init {tmp}/run/model.safetensors; write the output"),
    Case(export_onto_a_users_folder, r"{tmp}/run/model_hf: a folder holding things vit did not write .*notes.txt"),
    Case(
        adam_state("step 2.5", lambda step, mu, nu: step * 0 + 2.5),
        r"{tmp}/ckpt.pth: optimizer state of '.*': Adam step 2.5: expected a whole number in \[0, 2147483647\]",
    ),
    Case(
        adam_state("step 2**33", lambda step, mu, nu: step * 0 + 2.0**33),
        r"{tmp}/ckpt.pth: optimizer state of '.*': Adam step 8.58993e\+09: expected a whole number",
    ),
    Case(
        adam_state("exp_avg -inf", lambda step, mu, nu: _set(mu, -float("inf")) or step),
        r"{tmp}/ckpt.pth: optimizer: exp_avg of 'head.weight' holds 1 bad value\(s\) \(e.g. -inf\): expected finite",
    ),
    Case(
        adam_state("exp_avg_sq -1e-3", lambda step, mu, nu: _set(nu, -1e-3) or step),
        r"{tmp}/ckpt.pth: optimizer: exp_avg_sq of 'head.weight' holds 1 bad .*: expected finite values >= 0",
    ),
    Case(
        resume_without_checkpoints("checkpoints/ removed", _checkpoints_removed),
        r"{tmp}/run: nothing to resume from: the run trained \({tmp}/run/model.safetensors exists\), but no checkpoint",
    ),
    Case(
        resume_without_checkpoints("only half-written checkpoints", _checkpoints_half_written),
        r"{tmp}/run: nothing to resume from: .*{tmp}/run/checkpoints holds no complete checkpoint\)",
    ),
    Case(resume_changed("8 data bytes zeroed", _changed_in_place(_zeroed)), CHANGED),
    Case(resume_changed("a data byte flipped", _changed_in_place(_flipped)), CHANGED),
    Case(
        assumed_into_train_exports,
        r"{tmp}/run/model_hf: its config.json states every field as fact to transformers, and .*--accept-assumed",
    ),
]


# The cases the fast loop leaves to the full suite (docs/contributors.md): those that train or run long.
SLOW = {
    "deep_model_flags",
    "train_into_a_user_folder",
}


@pytest.mark.parametrize("case", params(CASES, slow=SLOW))
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)


@pytest.mark.slow  # a finished run trained and exported again: beyond the fast loop's budget
def test_a_resume_that_checks_no_exports_leaves_no_earlier_parity(tmp_path, capsys):
    """A finished run whose parity.json (vit's) checked its exports, resumed with --no-parity: the exports
    are written again, and parity.json, which described the earlier ones, is removed with a line saying
    so (before: it stayed, claiming parity of exports nothing checked)."""
    data = npz_dataset(tmp_path / "d.npz", [0, 1] * 4)
    # its own run: the session's shared finished run is another case's, on another dataset path
    assert main([*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp_path / "run"), *cached(tmp_path.parent)]) == 0
    io.write_json(tmp_path / "run" / "parity.json", {"ok": True, "agreement": 1.0})
    capsys.readouterr()
    resume = ["--resume", *cached(tmp_path.parent)]
    assert main([*TRAIN, "--dataset", f"npz:{data}", "--out", str(tmp_path / "run"), *resume]) == 0
    err = capsys.readouterr().err
    assert f"vit train: {tmp_path / 'run' / 'parity.json'} of the earlier exports removed" in err, err
    assert not (tmp_path / "run" / "parity.json").exists()
    assert (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.slow  # compiles the training step for its plan (25 s on the loaded 2-core machine)
def test_plan_beyond_the_device_memory(tmp_path, capsys, monkeypatch):
    refused = r"the training step needs [\d.]+ KiB per device, beyond the 10 KiB of cpu \(parameters "
    check_case(Case(plan_over_the_memory, refused), tmp_path, capsys, monkeypatch)


# --------------------------------------------------------------------------------- a full disk


@pytest.mark.slow
def test_a_training_checkpoint_the_disk_cannot_hold_is_one_line_before_orbax_writes(small_disk, tmp_path):
    """vit train whose run folder's disk has 64 KiB left: the config, metrics and event files fit, the
    checkpoint (orbax's folder) does not. Refused before orbax starts (before: orbax's threads failed on
    the full disk and printed 84 "Event loop is closed" tracebacks and five absl ERROR lines beside the
    error), naming the folder, the step, the bytes needed and free, and where --resume continues; no
    checkpoint folder, complete or temporary, is left."""
    out = small_disk / "run"
    fill_disk(small_disk, leave=64 << 10)
    child = _train_child(out)
    errors = [ln for ln in child.stderr.splitlines() if not ln.startswith("vit train: warning: ")]
    assert child.returncode == 2 and "Traceback" not in child.stderr, child.stderr
    assert [ln for ln in errors if "error" in ln.lower()] == errors[-1:], child.stderr
    head = f"vit train: error: {out / 'checkpoints'}: no space for the checkpoint of step "
    assert errors[-1].startswith(head), errors
    assert "needs " in errors[-1] and errors[-1].endswith("--resume continues from step 0"), errors[-1]
    assert not (out / "checkpoints").exists()  # no checkpoint folder, complete or temporary: not even an empty one


def _train_child(
    out: Path, *flags: str, check: bool = True, prelude: str = "", data: str | None = None, cache: bool = True
) -> subprocess.CompletedProcess:
    """``vit train`` into ``out`` in a child, on ``data`` (default: 8 training and 2 test images of an npz
    beside the disk, 2 steps) with the compilation cache of the session's runs (``cache``; off: the step is
    compiled); with ``check`` off the free-space check before each checkpoint needs nothing, so that
    orbax's own write meets the full disk; ``prelude``: code run first."""
    base = out.parent.parent  # the test's folder, which holds the small disk
    if data is None:  # a warm-up within its 2 steps: no warning line
        npz = base / "d.npz" if (base / "d.npz").exists() else npz_dataset(base / "d.npz", [0, 1] * 4, [0, 1])
        data, flags = f"npz:{npz}", ("--warmup-steps", "1", *flags)
    caching = cached(base.parent) if cache else []
    code = "\n".join(
        [
            "import sys",
            "from vit_common.system import io",
            "" if check else "io.FOLDER_OVERHEAD = -(1 << 40)",
            prelude,
            "from vit_cli.main import main",
            "sys.exit(main(sys.argv[1:]))",
        ]
    )
    argv = [*TRAIN, "--dataset", data, "--out", str(out), *caching, *flags]
    env = child_env()
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=TIME_LIMIT
    )


@pytest.mark.slow
def test_a_disk_that_fills_during_a_training_checkpoint_is_one_line_and_the_folder_is_removed(small_disk):
    """The free-space check passed (here: turned off) and the disk fills while orbax's threads write the
    final checkpoint: the run waits for the write, then stops with one line naming the folder, the step,
    the OS's cause and where --resume continues (before: orbax's threads printed 59 tracebacks, "Task
    exception was never retrieved", "Event loop is closed", absl ERROR lines, and the error was
    tensorstore's 1,500-character ValueError); the incomplete checkpoint folder is removed, freeing its
    space."""
    out = small_disk / "run"
    fill_disk(small_disk, leave=64 << 10)  # config.json, metrics.jsonl and the event file fit; the checkpoint not
    child = _train_child(out, "--ckpt-every", "0", check=False)
    assert child.returncode == 2 and child.stderr.count("\n") == 2, child.stderr
    line = child.stderr.splitlines()[1]
    assert line == (
        f"vit train: error: {out / 'checkpoints'}: the checkpoint of step 2 could not be written (No space "
        "left on device); free some space, then the same command with --resume continues from step 0"
    )
    assert not (out / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize("tensorboard", [True, False], ids=["tensorboard", "metrics-only"])
def test_run_files_on_a_full_disk_are_one_line_naming_the_file_and_no_hang(tensorboard, small_disk):
    """A disk with 8 KiB left: config.json fits, then metrics.jsonl's lines or TensorBoard's event file
    fill it. One line naming the file, the step and where --resume continues. Before, tensorboardX's writer
    thread died on the full disk with a traceback and its queue filled, so the next add_scalar blocked for
    ever (the run hung until killed); without TensorBoard the line was a bare "[Errno 28] No space left on
    device" (the log's close after the failed flush raised over the named error)."""
    out = small_disk / "run"
    fill_disk(small_disk, leave=8 << 10)
    off = [] if tensorboard else ["--tensorboard", "off"]
    child = _train_child(out, "--ckpt-every", "0", "--log-every", "1", *off, data="digits")  # lines to fill 8 KiB
    assert child.returncode == 2 and child.stderr.count("\n") == 2, child.stderr
    line = child.stderr.splitlines()[1]
    named = re.fullmatch(
        "vit train: error: (.+): could not be written at step [0-9]+ \\(No space left on device\\); free "
        "some space, then the same command with --resume continues from step 0",
        line,
    )
    files = [str(out / "metrics.jsonl")] + ([str(out / "tensorboard")] if tensorboard else [])
    assert named and named[1] in files, line


def test_a_run_whose_config_the_disk_cannot_hold_leaves_no_folder(small_disk):
    """4 KiB left: config.json does not fit. One line naming it; the run folder and its checkpoints folder,
    which this run made, are gone again (before: both stayed, empty)."""
    out = small_disk / "run"
    fill_disk(small_disk, leave=4 << 10)
    child = _train_child(out, "--tensorboard", "off")
    assert child.returncode == 2 and child.stderr.splitlines()[1:] == [
        f"vit train: error: {out / 'config.json'}: could not be written (No space left on device); nothing was written"
    ], child.stderr
    assert not out.exists()


@pytest.mark.slow
def test_a_disk_that_fills_before_the_exports_says_the_training_is_kept_and_resume_exports(small_disk):
    """The disk fills after the last checkpoint, before the exports (here: the child fills it as the exports
    start, in front of vit_jax.finetune.export). One line naming the export, the checkpoint that holds the
    training and that --resume writes the exports (before: "nothing was written" and no word of the
    finished training); after space is freed the same command with --resume writes them without training
    again."""
    out = small_disk / "run"
    prelude = "\n".join(
        [
            "import os, vit_jax.finetune",
            "export = vit_jax.finetune.export",
            "def full_then_export(out, *a, **k):",
            f"    fd = os.open({str(small_disk / 'filler')!r}, os.O_WRONLY | os.O_CREAT)",
            "    try:",
            "        while True: os.write(fd, bytes(4096))",
            "    except OSError: os.close(fd)",
            "    return export(out, *a, **k)",
            "vit_jax.finetune.export = full_then_export",
        ]
    )
    child = _train_child(out, "--ckpt-every", "0", "--tensorboard", "off", prelude=prelude)
    assert child.returncode == 2 and child.stderr.count("\n") == 2, child.stderr
    line = child.stderr.splitlines()[1]
    assert line.startswith(f"vit train: error: {out}/") and "could not be written (No space left on device)" in line
    assert line.endswith(
        f"; the training is complete (the checkpoint of step 2 in {out / 'checkpoints'}): the same command "
        "with --resume writes the exports"
    ), line
    (small_disk / "filler").unlink()
    again = _train_child(out, "--ckpt-every", "0", "--tensorboard", "off", "--resume")
    assert again.returncode == 0, again.stderr
    assert "nothing to train, exported again" in again.stderr + again.stdout
    assert (out / "model.safetensors").is_file() and (out / "curves.png").is_file()


# --------------------------------------------------------------------------------- signals


@pytest.mark.slow
def test_sigterm_while_xla_compiles_is_the_stop_line_alone(tmp_path):
    """SIGTERM delivered while the first training step compiles, inside a garbage-collection callback of
    JAX's own (as ``jax._src.lib``'s XLA one, which Python calls at each collection and where an exception
    raised was printed as "Exception ignored ... Traceback", or left XLA to crash the process at exit):
    one stop line, exit code 3, the run folder removed."""
    fire = "def _fire(phase, info):\n    if phase == 'start' and ARMED:\n        globals()['ARMED'] = False\n"
    fire += "        import os, signal\n        os.kill(os.getpid(), signal.SIGTERM)\n"
    prelude = "\n".join(
        [
            "import gc, jax._src.lib as lib, vit_jax.trainer as T",
            f"exec({fire!r}, lib.__dict__)",  # a callback whose frame is JAX's module, as XLA's is
            "lib.ARMED = False",
            "gc.callbacks.append(lib._fire)",
            "compile = T.Trainer.compile",
            "def armed(self):",  # the first call only: the memory plan compiles, then the loop finds it done
            "    lib.ARMED = not getattr(lib, 'USED', False)",
            "    lib.USED = True",
            "    return compile(self)",
            "T.Trainer.compile = armed",
        ]
    )
    proc = _train_child(tmp_path / "run", prelude=prelude, data="digits", cache=False)  # the step is compiled
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "vit train: stopped by SIGTERM before training began; the same command starts it again"
    )
    assert not (tmp_path / "run").exists()
