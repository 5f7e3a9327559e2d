"""`vit train`'s TensorBoard event files (read back with tensorboard's EventAccumulator) and its
jax.profiler trace; an unwritable event folder and a profile window outside the run are refused first."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vit_cli.main import main
from vit_common.config import ViTConfig
from vit_common.system.extras import install_hint
from vit_common.system.peaks import TRAIN_FLOPS_FACTOR, datasheet_peak

# digits: 1,437 train images; batch 256 -> 6 steps
TINY = (
    "--dataset digits --image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 "
    "--batch-size 256 --epochs 1 --no-progress --no-parity --log-every 2 --cpu-devices 1"
).split()


def scalars(folder) -> dict[str, dict[int, float]]:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
def test_event_files_hold_the_metrics_lines_and_the_profile_traces_the_steps(tmp_path, capsys):
    """Also: --eval-every in steps, top-5 accuracy, and --keep-best beside --keep 1."""
    run = tmp_path / "run"
    extra = ["--peak-tflops", "0.5", "--profile-steps", "2:3", "--eval-every", "4steps"]
    extra += ["--keep", "1", "--keep-best", "test_loss"]
    assert main(["train", *TINY, "--out", str(run), *extra]) == 0
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in lines if "loss" in r}
    test = {r["step"]: r for r in lines if "test_loss" in r}
    got = scalars(run / "tensorboard")
    f32 = np.float32
    for k in ("loss", "accuracy", "lr", "grad_norm"):
        assert got[f"train/{k}"] == {s: f32(r[k]) for s, r in train.items()}, k  # float32, as the file stores
    assert got["perf/images_per_s_per_device"] == {s: f32(r["images_per_s"]) for s, r in train.items()}  # 1 device
    cfg = ViTConfig.from_dict(json.loads((run / "config.json").read_text())["model"])
    mfu = {s: f32(r["images_per_s"] * TRAIN_FLOPS_FACTOR * cfg.flops() / 0.5e12) for s, r in train.items()}
    assert got["perf/mfu"] == pytest.approx(mfu, rel=1e-6)
    assert sorted(got["perf/step_time_s"]) == sorted(train) and all(v > 0 for v in got["perf/step_time_s"].values())
    assert got["test/accuracy"] == {s: f32(r["test_accuracy"]) for s, r in test.items()}
    assert got["test/loss"] == {s: f32(r["test_loss"]) for s, r in test.items()}
    assert sorted(test) == [4, 6]  # every 4 steps, and at the end
    assert got["test/top5_accuracy"] == {s: f32(r["test_top5_accuracy"]) for s, r in test.items()}
    assert all(r["test_accuracy"] <= r["test_top5_accuracy"] <= 1 for r in test.values())
    best = min(test, key=lambda s: test[s]["test_loss"])
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == sorted({best, 6})
    out = capsys.readouterr().out
    assert f"best checkpoint by test_loss: step {best}" in out, [ln for ln in out.splitlines() if "best" in ln]
    assert got["model/parameters"] == {0: cfg.param_count()} and cfg.param_count() == 2_762
    assert got["model/gflops_per_image"] == {0: f32(cfg.flops() / 1e9)}
    traces = list((run / "profile").glob("plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


@pytest.mark.slow
def test_a_resume_after_a_kill_shows_each_step_once(tmp_path):
    """A run killed after its checkpoint at step 2 had logged steps 3 and 4 (simulated: 4 steps checkpointed
    every 2, the last removed), then --resume: tensorboard's EventAccumulator, which drops what a restart
    marker (SessionLog.START) follows, reads each step once, as metrics.jsonl holds it, and the step-0
    constants once; so does the one TensorBoard serves from without its data server (plugin_event_accumulator,
    which takes a folder's first marker for the first start, not a restart). Before, steps 3 and 4 and
    step 0 showed twice (no marker; constants at every start)."""
    import shutil

    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (20, 8, 8), np.uint8), y=np.arange(20) % 2)
    run = tmp_path / "run"
    args = [
        *"train --image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4".split(),
        *"--epochs 1 --no-progress --no-parity --ckpt-every 2 --keep 5 --log-every 1".split(),
        *["--eval-every", "1steps", "--dataset", f"npz:{tmp_path / 'd.npz'}", "--out", str(run)],
    ]
    assert main(args) == 0
    shutil.rmtree(run / "checkpoints" / "4")
    assert main([*args, "--resume"]) == 0
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    served = plugin_event_accumulator.EventAccumulator(str(run / "tensorboard"))
    served.Reload()
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one a start
    for tag, key in (
        ("train/loss", "loss"),
        ("train/lr", "lr"),
        ("test/loss", "test_loss"),
        ("test/accuracy", "test_accuracy"),
    ):
        rows = [r for r in lines if key in r]
        assert [r["step"] for r in rows] == [1, 2, 3, 4], key
        want = [(r["step"], np.float32(r[key])) for r in rows]
        assert [(e.step, e.value) for e in acc.Scalars(tag)] == want, tag
        assert [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in served.Tensors(tag)] == want, tag
    assert [e.step for e in acc.Scalars("model/parameters")] == [0]
    assert [e.step for e in served.Tensors("model/parameters")] == [0]


def test_no_mfu_without_a_known_peak(tmp_path, tiny_cfg):
    assert datasheet_peak("cpu", "float32") is None and datasheet_peak("TPU v5 lite", "bfloat16") == 197e12
    assert (
        datasheet_peak("TPU v5p", "bfloat16") == 459e12 and datasheet_peak("NVIDIA H100 80GB HBM3", "float32") == 67e12
    )
    from vit_jax.observe import Summaries

    cfg = tiny_cfg.replace(num_classes=10)
    summaries = Summaries(tmp_path, cfg, devices=2, peak_flops=None)
    line = {"step": 3, "loss": 1.5, "accuracy": 0.25, "lr": 1e-3, "grad_norm": 2.0, "images_per_s": 100.0}
    summaries.train(line, step_time=0.5)
    summaries.close()
    got = scalars(tmp_path)
    assert "perf/mfu" not in got
    assert got["perf/images_per_s_per_device"] == {3: 50.0} and got["perf/step_time_s"] == {3: 0.5}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--profile-steps", "5:7"], "vit train: error: --profile-steps 5:7: the run has steps 1 to 6"),
        (
            ["--tensorboard", "{tmp}/f/tb"],
            "vit train: error: --tensorboard {tmp}/f/tb: cannot be written ({tmp}/f is not a folder); "
            "choose another path",
        ),
        pytest.param(
            ["--tensorboard", "{tmp}/locked/tb"],
            "vit train: error: --tensorboard {tmp}/locked/tb: cannot be written (folder {tmp}/locked is not writable); "
            "choose another path",
            marks=pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder"),
        ),
    ],
)
def test_bad_observability_values_exit_2_with_one_line_and_change_nothing(tmp_path, capsys, extra, message):
    (tmp_path / "f").write_text("x")
    (tmp_path / "locked").mkdir(mode=0o500)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["train", *TINY, "--out", str(tmp_path / "run"), *(e.format(tmp=tmp_path) for e in extra)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == message.format(tmp=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run folder, nothing in the others
    assert list((tmp_path / "locked").iterdir()) == []


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--profile-steps", "3:2", "'3:2': expected A:B with 1 <= A <= B"),
        ("--profile-steps", "x", "'x': expected A:B, two step numbers, e.g. 10:15"),
        ("--eval-every", "0steps", "'0steps': expected N (epochs), Nepochs or Nsteps with N >= 1, e.g. 500steps"),
        ("--eval-every", "2min", "'2min': expected N (epochs), Nepochs or Nsteps"),
    ],
)
def test_a_malformed_window_is_a_usage_error(flag, value, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *TINY, flag, value])
    assert e.value.code == 2
    assert f"vit train: error: argument {flag}: {message}" in capsys.readouterr().err


def wandb_records(path) -> list:
    """The records of a wandb transaction log (``run-ID.wandb``), parsed with wandb's own protobuf schema
    (``wandb.proto.wandb_internal_pb2.Record``). wandb 0.31 writes the file from its Go core and ships no
    Python reader; the framing is LevelDB's log format: the 7-byte header b":W&B" + magic 0xBEE1 + version
    0, then 32 KiB blocks of records, each crc32c (4 bytes), length (2, little-endian), type (1: whole, 2-4:
    first, middle, last part)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:7] == b":W&B\xe1\xbe\x00"
    pos, part, out = 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if left < 7 or kind == 0:  # the zero padding at a block's end
            pos += left
            continue
        part, pos = part + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


@pytest.mark.slow
def test_wandb_offline_gets_the_tensorboard_scalars_and_the_config_and_the_ema_is_evaluated(
    tmp_path, capsys, monkeypatch
):
    """--wandb with WANDB_MODE=offline: a run under RUN/wandb whose history holds every TensorBoard scalar at
    its step and whose config is config.json's; --ema adds test_ema/* beside test/* in both and in
    metrics.jsonl, and the summary line."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    extra = ["--ema", "0.9", "--wandb", "--eval-every", "2steps", "--keep", "1", "--keep-best", "test_ema_loss"]
    assert main(["train", *TINY, "--out", str(run), *extra]) == 0
    out = capsys.readouterr().out
    assert "EMA weights: test accuracy " in out
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    test = {r["step"]: r for r in lines if "test_loss" in r}
    assert sorted(test) == [2, 4, 6] and all(r["test_ema_loss"] != r["test_loss"] for r in test.values())
    best = min(test, key=lambda s: test[s]["test_ema_loss"])  # the EMA's best, kept beside the last
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == sorted({best, 6})
    assert f"best checkpoint by test_ema_loss: step {best}" in out
    tb = scalars(run / "tensorboard")
    for k in ("loss", "accuracy", "top5_accuracy"):
        assert tb[f"test_ema/{k}"] == {s: np.float32(r[f"test_ema_{k}"]) for s, r in test.items()}, k
    (log,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(log)
    history: dict[str, dict[int, float]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            for item in r.history.item:
                history.setdefault(item.key or "/".join(item.nested_key), {})[r.history.step.num] = json.loads(
                    item.value_json
                )
    history = {k: v for k, v in history.items() if not k.startswith("_")}  # wandb's own _step, _runtime, ...
    assert sorted(history) == sorted(tb)
    for tag, values in tb.items():  # TensorBoard stores float32
        assert {s: np.float32(v) for s, v in history[tag].items()} == values, tag
    (header,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {i.key: json.loads(i.value_json) for i in header.config.update}
    saved = json.loads((run / "config.json").read_text())
    assert header.project == "vit-twins" and header.display_name == "run"
    assert {k: config[k] for k in ("model", "train")} == {k: saved[k] for k in ("model", "train")}
    assert saved["train"]["ema"] == 0.9 and saved["exports"] == {"weights": "raw"}


@pytest.mark.slow
def test_wandb_not_installed_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # import wandb raises ImportError
    assert main(["train", *TINY, "--out", str(tmp_path / "run"), "--wandb"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"vit train: error: --wandb: wandb is not installed ({install_hint('wandb')})"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_ema_metric_for_keep_best_needs_ema(tmp_path, capsys):
    assert main(["train", *TINY, "--out", str(tmp_path / "run"), "--keep-best", "test_ema_accuracy"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        "vit train: error: --keep-best test_ema_accuracy: this run keeps no moving average of the weights; "
        "pass --ema DECAY too"
    )
    assert list(tmp_path.iterdir()) == []


def test_tensorboardx_loads_without_torch():
    """tensorboardX's package imports torch where it can (seconds, for type annotations only): the event
    writer loads without it, and torch stays importable afterwards."""
    import subprocess
    import sys

    code = (
        "import importlib.util, sys; from vit_jax.observe import tensorboardx; tensorboardx(); "
        "print('torch' in sys.modules, importlib.util.find_spec('torch') is not None)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.stdout.split() == ["False", "True"], p.stderr[-2000:]
