"""`vit train` stopped by signals (one process; two processes: test_train_multiprocess.py): SIGTERM at a
random step, a second signal during the stop's checkpoint, SIGTERM during a periodic checkpoint's write
and during the final export; each stop exits 3 with one line, and `--resume` ends bit-exactly where the
uninterrupted run ends, metrics lines included (the checkpoint holds the sums behind the next line). A
data worker killed is one line with the resume line (also one killed as it starts); no process of a run
outlives it, SIGKILL included.

Each run's processes are found by a marker in their environment (grain's workers and Python's
resource tracker inherit it), read from /proc.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from test_train_runs import TINY, assert_same_run

ROOT = Path(__file__).resolve().parents[1]
# --log-every 4 (after TINY's 1: the last flag wins): a stop between two lines must not change the next one
ARGS = [*TINY, "--log-every", "4", "--no-parity", "--data-workers", "1"]

# `vit train` that signals itself at the points a plan names: {"step": [k, SIG]} after dispatching step k,
# {"finalize": [k, SIG]} while orbax renames checkpoint k into place, {"export": [name, SIG]} while the file
# name is written, {"worker": k} SIGKILL to its data workers after step k ({"one worker": k}: to the first;
# {"test worker": k}: to the first of the test set's, whose evaluations have begun).
DRIVER = textwrap.dedent("""
    import json, multiprocessing, os, signal, sys
    plan, argv = json.loads(sys.argv[1]), sys.argv[2:]
    from vit_cli.main import build_parser
    from vit_common.system.host_devices import split_cpu
    a = build_parser().parse_args(argv)
    split_cpu(a.cpu_devices, a.batch_size, a.accum_steps)  # as `vit train` does, before JAX is imported
    send = lambda name: os.kill(os.getpid(), getattr(signal, name))
    from vit_jax import trainer
    step = trainer.Trainer.train_step
    def signalling_step(self, state, batch):
        done = int(state["step"]) + 1  # read first: the step donates the state's buffers
        out = step(self, state, batch)
        if plan.get("step", [0])[0] == done:
            send(plan["step"][1])
        if plan.get("worker") == done:
            for child in multiprocessing.active_children():
                os.kill(child.pid, signal.SIGKILL)
        if plan.get("one worker") == done:  # grain's workers are this process's only multiprocessing children
            pid = multiprocessing.active_children()[0].pid
            os.kill(pid, signal.SIGKILL)
            print(f"test: killed {pid}", file=sys.stderr)
        if plan.get("test worker") == done:  # the test set's worker, started at the first evaluation
            pid = next(iter(self._test_batches._workers)).pid
            os.kill(pid, signal.SIGKILL)
            print(f"test: killed {pid}", file=sys.stderr)
        return out
    trainer.Trainer.train_step = signalling_step
    from orbax.checkpoint.path import atomicity
    finalize = atomicity.AtomicRenameTemporaryPath.finalize
    async def signalling_finalize(self, *a, **k):
        if plan.get("finalize", [""])[0] == self.get_final().name:
            send(plan["finalize"][1])
        return await finalize(self, *a, **k)
    atomicity.AtomicRenameTemporaryPath.finalize = signalling_finalize
    from vit_common.system import io
    atomic_write = io.atomic_write
    def signalling_write(path, write):
        if plan.get("export", [""])[0] == os.path.basename(path):
            send(plan["export"][1])
        return atomic_write(path, write)
    io.atomic_write = signalling_write
    from vit_cli.main import main
    sys.exit(main(argv))
""")


def marked(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker``."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker.encode() in (p / "environ").read_bytes():
                pids.append(int(p.name))
        except OSError:  # ended meanwhile, or not ours to read
            pass
    return pids


def assert_none_left(marker: str, seconds: float = 5.0) -> None:
    deadline = time.time() + seconds
    while marked(marker) and time.time() < deadline:
        time.sleep(0.1)
    left = marked(marker)
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]


def vit(env, out: Path, *extra, plan: dict | None = None) -> subprocess.CompletedProcess:
    marker = f"VIT_TEST_RUN={uuid.uuid4().hex}"
    args = ["train", *ARGS, "--out", str(out), *map(str, extra)]
    penv = {**env, "VIT_TEST_RUN": marker.split("=")[1]}
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(plan or {}), *args],
        cwd=ROOT,
        env=penv,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert_none_left(marker)  # workers and the resource tracker end with the run
    return proc


def stop_lines(proc) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if "vit train: stopped by" in ln]


def assert_clean(proc) -> None:
    assert "Traceback" not in proc.stderr and "leaked shared_memory" not in proc.stderr, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def ref(env, npz, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "ref"
    proc = vit(env, out, "--dataset", f"npz:{npz}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def saved(out: Path) -> list[int]:
    return sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_signals_at_a_random_step_during_checkpoints_and_the_export_then_resume_is_bit_exact(ref, env, npz, tmp_path):
    at = random.Random().randint(1, 7)  # 9 steps; checkpoints every 2 and at 9; metrics lines at 4, 8, 9
    out, data = tmp_path / "run", ["--dataset", f"npz:{npz}"]
    # SIGTERM after step `at`, and Ctrl-C while its checkpoint is written: one more line, the save goes on
    first = vit(env, out, *data, plan={"step": [at, "SIGTERM"], "finalize": [str(at), "SIGINT"]})
    assert first.returncode == 3, (at, first.stderr[-3000:])
    assert_clean(first)
    assert stop_lines(first) == [
        f"vit train: stopped by SIGTERM after step {at}, its checkpoint written; the same command with --resume "
        "continues from it"
    ], first.stderr[-2000:]
    again = [ln for ln in first.stderr.splitlines() if "SIGINT again" in ln]
    assert len(again) == 1 and f"still writing the checkpoint of step {at}" in again[0], first.stderr[-2000:]
    assert saved(out)[-1] == at and not (out / "model.safetensors").exists()
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in lines) <= at

    # SIGTERM while the next periodic checkpoint is renamed into place: that checkpoint is kept, the run
    # stops at a later step (or, past the last step, before the exports)
    periodic = at + 2 - at % 2
    second = vit(env, out, *data, "--resume", plan={"finalize": [str(periodic), "SIGTERM"]})
    assert second.returncode == 3, (at, second.stderr[-3000:])
    assert_clean(second)
    assert len(stop_lines(second)) == 1 and periodic in saved(out), (saved(out), second.stderr[-2000:])

    # SIGHUP while the timm export is written: no half-written file; the canonical export was done before
    third = vit(env, out, *data, "--resume", plan={"export": ["model_timm.safetensors", "SIGHUP"]})
    assert third.returncode == 3, (at, third.stderr[-3000:])
    assert_clean(third)
    assert stop_lines(third) == [
        "vit train: stopped by SIGHUP after the last step, before the exports were all written; the same "
        "command with --resume writes them"
    ]
    assert not (out / "model_timm.safetensors").exists()
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]

    last = vit(env, out, *data, "--resume")
    assert last.returncode == 0, last.stderr[-3000:]
    assert_same_run(out, ref)  # parameters, optimizer state, RNG and every metrics line


def test_a_killed_data_worker_is_one_line_and_a_killed_run_leaves_no_worker(env, npz, tmp_path):
    out, data = tmp_path / "oom", ["--dataset", f"npz:{npz}"]
    proc = vit(env, out, *data, plan={"worker": 3})
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert_clean(proc)
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("vit train: error:")]
    reached = saved(out)[-1]
    assert reached >= 3  # the step reached when the worker's death came through is kept
    assert re.match(
        r"vit train: error: a data worker process \(pid \d+\) was killed by SIGKILL \(what the kernel's OOM", line
    )
    assert line.endswith(f"The same command with --resume continues from the checkpoint of step {reached}")
    # SIGKILL to vit train itself: its worker ends with it (vit() asserts that no process is left)
    killed = vit(env, out, *data, "--resume", plan={"step": [reached + 1, "SIGKILL"]})
    assert killed.returncode == -9, killed.stderr[-3000:]


@pytest.mark.slow
def test_a_data_worker_killed_as_it_appears_is_one_line_and_exit_75_within_seconds(env, tmp_path):
    """SIGKILL to a data worker the moment it appears, while multiprocessing still writes its start-up data
    (the pickled pipeline with its 2000 images, over a pipe's 64 KiB) and before any batch: exit 75 within
    30 s with one line naming its pid, and no process left; the write used to block for ever (CPython
    gh-118981), the run hanging with it."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "big.npz", x=rng.integers(0, 256, (2000, 8, 8), dtype=np.uint8), y=np.arange(2000) % 3)
    marker = uuid.uuid4().hex
    args = ["train", *ARGS, "--data-workers", "2", "--epochs", "1", "--dataset", f"npz:{tmp_path / 'big.npz'}"]
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "{}", *args, "--out", str(tmp_path / "run")],
        cwd=ROOT,
        env={**env, "VIT_TEST_RUN": marker},
        stderr=subprocess.PIPE,
        text=True,
    )
    workers = []
    while not workers and proc.poll() is None:  # grain's workers: spawned, their command line spawn_main's
        for p in marked(marker):
            with contextlib.suppress(OSError):  # ended meanwhile
                workers += [p] if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes() else []
    pid = workers[0]
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    try:
        stderr = proc.communicate(timeout=30)[1]
    finally:
        proc.kill()
    assert time.time() - killed < 30 and proc.returncode == 75, stderr[-3000:]
    assert "Traceback" not in stderr and "leaked shared_memory" not in stderr, stderr[-3000:]
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("vit train: error:")]
    assert line.startswith(f"vit train: error: a data worker process (pid {pid}) was killed by SIGKILL ("), line
    # the other worker's first batch may make step 1 (round-robin) before the dead one's is wanted
    assert re.search(r"continues from (step 0 \(no checkpoint was written yet\)|the checkpoint of step 1)$", line)
    assert_none_left(marker)


def _lost_worker_run(env, out, data: list[str], plan: dict) -> tuple[str, int, str]:
    """Run ``vit train`` into ``out`` with ``plan``'s worker kill: exit 75, clean (``assert_clean``), one
    error line. Returns (that line, the last saved step, the killed worker's pid)."""
    proc = vit(env, out, *data, plan=plan)
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert_clean(proc)
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("vit train: error:")]
    return line, saved(out)[-1], re.search(r"test: killed (\d+)", proc.stderr).group(1)


@pytest.mark.slow
def test_one_of_two_killed_data_workers_stops_the_run_later_and_resume_is_bit_exact(env, npz, tmp_path):
    """SIGKILL to one of 2 data workers after step 3 of a 30-step run: the batches it had made before (in
    grain's buffers) are still taken, the run stops at the step whose batch is the dead worker's next one
    (13 here) with that step's checkpoint, one line and exit 75, and `--resume` ends where an undamaged
    run ends, bit for bit (every metrics line too): the batches taken after the kill were the right ones."""
    data = ["--dataset", f"npz:{npz}", "--epochs", "10", "--ckpt-every", "4", "--data-workers", "2"]
    ref = tmp_path / "ref"
    assert vit(env, ref, *data).returncode == 0
    out = tmp_path / "run"
    line, reached, killed = _lost_worker_run(env, out, data, {"one worker": 3})
    assert 3 < reached < 30 and not (out / "model.safetensors").exists()
    assert line.startswith(f"vit train: error: a data worker process (pid {killed}) was killed by SIGKILL ("), line
    assert line.endswith(f"The same command with --resume continues from the checkpoint of step {reached}")
    last = vit(env, out, *data, "--resume")
    assert last.returncode == 0, last.stderr[-3000:]
    assert_same_run(out, ref)


@pytest.mark.slow
def test_a_killed_test_set_worker_stops_the_run_at_the_evaluation_with_its_step_and_resume_is_bit_exact(
    env, npz, tmp_path
):
    """SIGKILL to the test set's data worker after step 2 of 9, evaluating after every step: the evaluations
    take the batches it had made, and the one that needs its next batch stops the run with that step's
    checkpoint (marked so that a resumed run takes the evaluation first), one line naming the step and
    the worker's pid, and exit 75; `--resume` ends where an undamaged run ends, bit for bit."""
    data = ["--dataset", f"npz:{npz}", "--eval-every", "1steps"]
    ref = tmp_path / "ref"
    assert vit(env, ref, *data).returncode == 0
    out = tmp_path / "run"
    line, reached, killed = _lost_worker_run(env, out, data, {"test worker": 2})
    assert 2 < reached <= 9 and not (out / "model.safetensors").exists(), (reached, line)
    assert line.startswith(
        f"vit train: error: step {reached}'s evaluation: a data worker process (pid {killed}) was killed by SIGKILL ("
    ), line
    assert line.endswith(f"The same command with --resume continues from the checkpoint of step {reached}")
    last = vit(env, out, *data, "--resume")
    assert last.returncode == 0, last.stderr[-3000:]
    assert_same_run(out, ref)  # with the stopped step's evaluation line, taken first by the resumed run
