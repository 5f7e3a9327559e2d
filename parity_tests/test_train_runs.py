"""`vit train` end to end on a tiny config: export and PyTorch parity, evaluate/predict, exact resume
after SIGKILL (while training and while writing a checkpoint), NaN stop, resume with another config.

Runs that get killed happen in subprocesses. All runs share a persistent compilation cache so that
only the first one compiles (a cached executable is the same program, so results stay bit-exact) and
run XLA:CPU at optimisation level 0, which compiles twice as fast and is the same in every run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from PIL import Image

from vit_cli.main import main
from vit_common.checkpoints.formats.source import read_safetensors
from vit_common.system import io
from vit_common.tolerance import compare

ROOT = Path(__file__).resolve().parents[1]
# 28 images, val_fraction 0.2: 22 train (batches 8, 8, 6: the last one partial) / 6 test; 3 epochs = 9 steps
TINY = (
    "--image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 8 "
    "--epochs 3 --warmup-steps 2 --shift 1 --dropout 0.1 --log-every 1 --ckpt-every 2 --no-progress"
).split()

# Run `vit train` with orbax or the trainer patched so that the process SIGKILLs itself at a given point.
KILLER = textwrap.dedent("""
    import os, signal, sys
    mode, at, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    from vit_cli.main import build_parser
    from vit_common.system.host_devices import split_cpu
    a = build_parser().parse_args(argv)
    split_cpu(a.cpu_devices, a.batch_size, a.accum_steps)  # as `vit train` does, before JAX is imported
    if mode == "train":  # right after dispatching step `at`
        from vit_jax import trainer
        step = trainer.Trainer.train_step
        def killing_step(self, state, batch):
            done = int(state["step"])  # read first: the step donates the state's buffers
            out = step(self, state, batch)
            if done + 1 == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        trainer.Trainer.train_step = killing_step
    else:  # checkpoint: step `at` has written its files into a temporary folder, not renamed yet
        from orbax.checkpoint.path import atomicity
        finalize = atomicity.AtomicRenameTemporaryPath.finalize
        async def killing_finalize(self, *a, **k):
            if self.get_final().name == str(at):
                os.kill(os.getpid(), signal.SIGKILL)
            return await finalize(self, *a, **k)
        atomicity.AtomicRenameTemporaryPath.finalize = killing_finalize
    from vit_cli.main import main
    sys.exit(main(argv))
""")


def vit(env, *args, killer: tuple[str, int] | None = None) -> subprocess.CompletedProcess:
    cmd = (
        [sys.executable, "-c", KILLER, *map(str, killer), *args]
        if killer
        else [sys.executable, "-m", "vit_cli.main", *args]
    )
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def ref(env, npz, tmp_path_factory) -> Path:
    """An uninterrupted run, with the PyTorch parity check."""
    out = tmp_path_factory.mktemp("runs") / "ref"
    proc = vit(env, "train", "--dataset", f"npz:{npz}", *TINY, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def tensors(path: Path) -> dict:
    return read_safetensors(path)[0]


def final_state(run: Path):
    """The last checkpoint's train state as stored (PRNG keys as key data)."""
    import jax

    steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    path = (run / "checkpoints" / str(steps[-1]) / "state").absolute()
    checkpointer = ocp.StandardCheckpointer()
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # saved on every core's device; read on one
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here), checkpointer.metadata(path).item_metadata
    )
    return checkpointer.restore(path, target)


def metric_values(run: Path) -> list[dict]:
    """metrics.jsonl without the timing fields and the start-up line of each process."""
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time_to_first_step_s" not in r]
    return [{k: v for k, v in r.items() if k not in ("images_per_s", "time")} for r in rows]


def assert_same_run(run: Path, ref: Path) -> None:
    a, b = tensors(run / "model.safetensors"), tensors(ref / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # bit for bit
    leaves = zip(*(__import__("jax").tree.leaves(final_state(r)) for r in (run, ref)), strict=True)
    for x, y in leaves:
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # optimizer state, step, RNG too
    assert metric_values(run) == metric_values(ref)  # every step logged once, same values
    ckpt = run / "checkpoints"
    assert all(p.name.isdigit() for p in ckpt.iterdir() if not p.name.startswith(".")), list(ckpt.iterdir())


@pytest.mark.slow
def test_export_agrees_in_pytorch_and_timm(ref, npz):
    parity = json.loads((ref / "parity.json").read_text())
    assert parity["images"] == 6 and parity["agreement"] == 1.0 and parity["rel"] <= 1e-5 and parity["ok"]
    assert parity["jax_accuracy"] == parity["torch_accuracy"]
    assert (ref / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((ref / "config.json").read_text())
    assert config["model"]["width"] == 16 and config["train"]["epochs"] == 3 and config["classes"] == ["0", "1", "2"]
    cores = len(os.sched_getaffinity(0))
    assert config["devices"] == f"{max(d for d in range(1, cores + 1) if 8 % d == 0)} x cpu"  # one per core
    rows = [json.loads(ln) for ln in (ref / "metrics.jsonl").read_text().splitlines()]
    train_rows, test_rows = [r for r in rows if "loss" in r], [r for r in rows if "test_loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, 10))
    assert all({"loss", "accuracy", "lr", "images_per_s"} <= r.keys() for r in train_rows)
    assert [(r["step"], r["test_count"]) for r in test_rows] == [(3, 6), (6, 6), (9, 6)]

    # independently: both twins on the exported file, and timm on the timm-named file
    import timm
    import torch
    from flax import nnx

    import vit_jax
    import vit_torch
    from vit_common.data.datasets import load_dataset
    from vit_common.data.images import normalize

    data = load_dataset(f"npz:{npz}", (8, 8), 1)
    x = normalize(data.test.images)
    lj = np.asarray(nnx.jit(lambda m, x: m(x))(vit_jax.load_model(ref / "model.safetensors"), x))
    tmodel = vit_torch.load_model(ref / "model.safetensors")
    with torch.no_grad():
        lt = tmodel(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
    c = compare("logits", lt, lj, "tensor", "float32")
    assert c.ok, c
    assert (lt.argmax(-1) == lj.argmax(-1)).all()
    assert np.mean(lj.argmax(-1) == data.test.labels) == parity["jax_accuracy"]
    # the timm export carries its config and says how timm loads it strictly (the demo's fc_norm=False
    # included): run exactly that code
    from vit_common.checkpoints.convert import load_checkpoint
    from vit_common.checkpoints.formats.timm_state import timm_load_call

    timm_file = ref / "model_timm.safetensors"
    exported = load_checkpoint(timm_file)
    assert exported.report.assumed == [] and exported.cfg.num_heads == 2
    code = timm_load_call(timm_file, exported.cfg)
    assert "fc_norm=False" in code and "global_pool='avg'" in code
    scope = {}
    exec(code, scope)
    assert isinstance(scope["model"], timm.models.vision_transformer.VisionTransformer)
    with torch.no_grad():
        got = scope["model"].eval()(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
    np.testing.assert_array_equal(got, lt)


def test_evaluate_and_predict(ref, npz, tmp_path, capsys):
    parity = json.loads((ref / "parity.json").read_text())
    for fw in ("jax", "torch"):
        png = tmp_path / f"{fw}.png"
        assert (
            main(
                [
                    "evaluate",
                    str(ref / "model.safetensors"),
                    "--dataset",
                    f"npz:{npz}",
                    "--framework",
                    fw,
                    "--confusion",
                    str(png),
                    "--json",
                ]
            )
            == 0
        )
        out = json.loads(capsys.readouterr().out)
        assert out["images"] == 6 and out["accuracy"] == parity[f"{fw}_accuracy"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    x = np.load(npz)["x"]
    files = []
    for i in (0, 1):
        files.append(tmp_path / f"{i}.png")
        Image.fromarray(x[i]).save(files[-1])
    tops = {}
    for fw in ("jax", "torch"):
        assert (
            main(
                [
                    "predict",
                    str(ref / "model.safetensors"),
                    *map(str, files),
                    "--framework",
                    fw,
                    "--top-k",
                    "2",
                    "--json",
                ]
            )
            == 0
        )
        lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
        assert [len(ln["top"]) for ln in lines] == [2, 2]
        assert all(ln["top"][0]["probability"] >= ln["top"][1]["probability"] for ln in lines)
        tops[fw] = [ln["top"][0]["class"] for ln in lines]
    assert tops["jax"] == tops["torch"]
    # the timm export stores its config (num_heads included) in the header, so it predicts as it is;
    # the same tensors without that header cannot be read without being told the head count
    timm_file = str(ref / "model_timm.safetensors")
    assert main(["predict", timm_file, *map(str, files), "--strict", "--json"]) == 0
    assert [json.loads(ln)["top"][0]["class"] for ln in capsys.readouterr().out.splitlines()] == tops["jax"]
    from vit_common.system.io import save_safetensors

    save_safetensors(tmp_path / "bare.safetensors", tensors(timm_file))
    assert main(["predict", str(tmp_path / "bare.safetensors"), str(files[0])]) == 2
    assert "cannot guess num_heads for width 16" in capsys.readouterr().err


@pytest.mark.slow
def test_sigkill_while_training_and_while_writing_a_checkpoint_then_resume_is_bit_exact(ref, env, npz, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--dataset", f"npz:{npz}", *TINY, "--out", out, "--no-parity"]
    killed = vit(env, *args, killer=("train", 5))  # checkpoints at 2 and 4 (maybe still being written)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (out / "model.safetensors").exists()
    killed = vit(env, *args, "--resume", killer=("checkpoint", 8))  # resumes, dies renaming step 8 into place
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert "6" in left and "8" not in left and any(n.startswith("8.") and "tmp" in n for n in left), left
    resumed = vit(env, *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(out, ref)  # includes: no temporary (half-written) checkpoint folder left


@pytest.mark.slow
def test_a_run_stopped_before_its_first_checkpoint_is_started_again_by_the_same_command(ref, npz, tmp_path):
    out = tmp_path / "early"
    (out / "checkpoints" / "2.orbax-checkpoint-tmp-1").mkdir(parents=True)  # a half-written first checkpoint
    for name in ("config.json", "metrics.jsonl"):  # as the stopped run wrote them
        io.write_text(
            out / name,
            (ref / name).read_text().splitlines(keepends=True)[0]
            if name == "metrics.jsonl"
            else (ref / name).read_text(),
        )
    args = ["train", "--dataset", f"npz:{npz}", *TINY, "--out", str(out), "--no-parity"]
    assert main(args) == 0  # no checkpoint to lose: the same command starts it again, as --resume would
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 10))  # from step 0, each step once
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["6", "8", "9"]  # temporary folder gone


@pytest.mark.slow
def test_resume_refuses_another_config_and_fresh_runs_refuse_an_existing_folder(ref, npz, tmp_path, capsys):
    args = ["train", "--dataset", f"npz:{npz}", *TINY, "--out", str(ref)]
    assert main([*args, "--resume", "--width", "32", "--lr", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "different config" in err and "model.width: checkpoint has 16, now 32" in err and "train.lr" in err
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main([*args[:-1], str(tmp_path / "none"), "--resume"]) == 2
    assert "no run to resume" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_of_a_finished_run_exports_again_or_extends_it_with_more_epochs(ref, npz, tmp_path, capsys):
    """A finished run resumed as it was only exports again (and says so, not "9 steps in 0.1 s"); with
    more epochs it continues, the learning-rate schedule recomputed for the new total and said so; with
    fewer than it has done it is refused."""
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(ref, run)
    args = ["train", "--dataset", f"npz:{npz}", *TINY, "--out", str(run), "--resume", "--no-parity"]
    assert main([*args, "--epochs", "2"]) == 2
    assert "--epochs 2 (6 steps) ends before the checkpoint's step 9; expected --epochs >= 3" in capsys.readouterr().err
    assert main(args) == 0
    assert "the run had finished at step 9: nothing to train, exported again" in capsys.readouterr().out
    assert main([*args, "--epochs", "5"]) == 0
    out, err = capsys.readouterr()
    assert "--epochs 5 (the run was started with 3): the learning-rate schedule is recomputed for 15 steps" in err
    assert "6 steps (10-15, resumed)" in out
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 16))
    assert json.loads((run / "config.json").read_text())["train"]["epochs"] == 5


@pytest.mark.slow
def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(env, npz, tmp_path):
    out = tmp_path / "nan"
    args = ["--lr", "1e30", "--grad-clip", "0", "--warmup-steps", "0", "--ckpt-every", "1", "--no-parity"]
    proc = vit(env, "train", "--dataset", f"npz:{npz}", *TINY, "--out", out, *args)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "not finite" in proc.stderr and "last good checkpoint is step" in proc.stderr
    good = int(proc.stderr.split("last good checkpoint is step ")[1].split()[0])
    steps = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == good >= 1
    import jax

    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(final_state(out)["params"]))
    assert not (out / "model.safetensors").exists()


@pytest.mark.slow
def test_time_to_first_step_cold_then_warm_compilation_cache(env, npz, tmp_path):
    """The first run of a configuration compiles into --compile-cache ('cold'), the second reads its
    programs back ('warm'); 'off' uses none. Each run's first metrics.jsonl line says which, and when the
    first step was done."""
    cache = tmp_path / "cache"
    firsts = []
    for i, where in enumerate([cache, cache, "off"]):
        out = tmp_path / f"run{i}"
        args = ["--ckpt-every", "0", "--epochs", "1", "--no-parity", "--compile-cache", where, "--json"]
        proc = vit(env, "train", "--dataset", f"npz:{npz}", *TINY, "--out", out, *args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        summary = json.loads(proc.stdout)  # --json: the summary is one JSON object
        assert summary["steps"] > 0 and summary["images_per_s"] > 0, summary
        firsts.append(json.loads((out / "metrics.jsonl").read_text().splitlines()[0]))
    assert [f["compile_cache"] for f in firsts] == ["cold", "warm", "off"]
    assert all(f["step"] == 1 and f["time_to_first_step_s"] > 0 for f in firsts)
    assert any(cache.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["max", "avgmax"])
def test_the_demo_trains_with_max_and_avgmax_pooling(pool, tmp_path, capsys):
    """Poolings both twins and timm have (the flags come from ViTConfig's fields): the demo model (28 px,
    patch 7, width 128, depth 4, no class token) learns scikit-learn's digits with them, and its exports
    give the JAX twin's logits in vit_torch and in timm (global_pool='max' / 'avgmax'). Run at the suite's
    XLA optimisation level 0, where a max taken with JAX's own gradient rule turned the gradient norm NaN
    at step 3 (``vit_jax.layers.masked_max``)."""
    out = tmp_path / pool
    short = ["--dataset", "digits", "--epochs", "2", "--batch-size", "64", "--warmup-steps", "5", "--lr", "1e-3"]
    assert main(["train", "--pool", pool, *short, "--out", str(out), "--no-progress"]) == 0
    model = json.loads((out / "config.json").read_text())["model"]
    assert (model["pool"], model["class_token"], model["width"], model["depth"]) == (pool, False, 128, 4)
    assert final_accuracy(out) > 0.3  # 10 classes: chance is 0.1 (46 steps reach 0.46 with max pooling)
    parity = json.loads((out / "parity.json").read_text())
    lib = parity["library"]["timm"]
    assert parity["ok"] and lib["ok"] and lib["agreement"] == 1.0 and lib["library"].startswith("timm"), parity
    assert f"global_pool='{pool}'" in capsys.readouterr().out  # the printed timm call builds the same model


def final_accuracy(run: Path) -> float:
    return [m for m in metric_values(run) if "test_accuracy" in m][-1]["test_accuracy"]
