"""Multi-process start-up from the environment (processes that disagree, a port in use, a process that
never starts: one line each, before any work), and the settings a resumed run may change.

The processes themselves (training, a lost process, resume) are tested in
parity_tests/test_train_multiprocess.py.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from vit_common.training.train_config import TrainConfig
from vit_jax import distributed
from vit_jax.distributed import cluster_env, disagreement, roll_call, run_digest
from vit_jax.resume import config_mismatch

ROOT = Path(__file__).resolve().parents[1]


def test_the_environment_names_the_processes_or_leaves_one():
    assert cluster_env({}) is None
    assert cluster_env({"SLURM_NTASKS": "1", "OMPI_COMM_WORLD_SIZE": "1"}) is None
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert cluster_env(env) == {"num_processes": 4, "process_id": 3}
    assert cluster_env({**env, "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}) is None
    assert cluster_env({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}) == {}  # jax finds the rest (cluster detection)
    assert cluster_env({"SLURM_NTASKS": "8"}) == {} and cluster_env({"OMPI_COMM_WORLD_SIZE": "2"}) == {}
    with pytest.raises(ValueError, match="JAX_PROCESS_ID='one': expected an int"):
        cluster_env({**env, "JAX_PROCESS_ID": "one"})
    with pytest.raises(ValueError, match="^JAX_NUM_PROCESSES=0: expected an int >= 1$"):
        cluster_env({**env, "JAX_NUM_PROCESSES": "0", "JAX_PROCESS_ID": "0"})
    for given, missing in (("JAX_NUM_PROCESSES", "JAX_PROCESS_ID"), ("JAX_PROCESS_ID", "JAX_NUM_PROCESSES")):
        with pytest.raises(ValueError, match=f"^{given} is set but {missing} is not: set both"):
            cluster_env({k: v for k, v in env.items() if k != missing})


def test_resume_may_change_the_timeouts_but_nothing_else():
    assert TrainConfig.settings() == ["heartbeat_timeout", "init_timeout", "shutdown_timeout", "barrier_timeout"]
    saved = {"model": {}, "train": TrainConfig().to_dict()}
    now = {"model": {}, "train": TrainConfig(heartbeat_timeout=5, barrier_timeout=60, lr=1e-3).to_dict()}
    assert config_mismatch(saved, now) == ["train.lr: checkpoint has 0.002, now 0.001"]
    # a run started by a version without a field (recipe, mlp_type): the field counts as its default
    older = {"model": {"width": 16}, "train": {k: v for k, v in TrainConfig().to_dict().items() if k != "recipe"}}
    older["train"]["augment"].pop("mixup_mode")
    newer = {"model": {"width": 16, "qk_norm": False}, "train": TrainConfig().to_dict()}
    assert config_mismatch(older, newer) == []
    other = {**newer, "train": TrainConfig(recipe="timm").to_dict(), "model": {"width": 16, "qk_norm": True}}
    assert config_mismatch(older, other) == [
        "model.qk_norm: checkpoint has False, now True",
        "train.recipe: checkpoint has 'twins', now 'timm'",
    ]
    for name in TrainConfig.settings():
        with pytest.raises(ValueError, match=f"{name}=0: expected an integer in \\[1, "):
            TrainConfig(**{name: 0})


# Two `vit train` processes on localhost, as in parity_tests/test_train_multiprocess.py, stopped before any work.
TINY = "train --image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4 --epochs 1"
DRIVER = "import sys; from vit_cli.main import main; sys.exit(main(sys.argv[1:]))"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes(tmp_path, flags: list[list[str]], port: int | None = None, n: int | None = None) -> list:
    """Start one `vit train` per entry of ``flags`` (its extra flags) as the processes of one job of ``n``;
    return (exit code, stderr) of each."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (8, 8, 8), np.uint8), y=np.arange(8) % 2)
    port = port or _free_port()
    procs = []
    for i, extra in enumerate(flags):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}"}
        env |= {"JAX_NUM_PROCESSES": str(n or len(flags)), "JAX_PROCESS_ID": str(i), "JAX_PLATFORMS": "cpu"}
        argv = [*TINY.split(), "--dataset", f"npz:{tmp_path / 'd.npz'}", "--no-progress", "--no-parity"]
        argv += ["--compile-cache", "off", "--cpu-devices", "1", "--init-timeout", "20", *extra]
        procs.append(
            subprocess.Popen([sys.executable, "-c", DRIVER, *argv], env=env, stderr=subprocess.PIPE, text=True)
        )
    return [(p.wait(timeout=120), p.stderr.read()) for p in procs]


def _one_line(err: str) -> str:
    assert "Traceback" not in err and "Check failure" not in err and "*** " not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("vit train: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.slow
def test_processes_that_disagree_stop_before_any_work_naming_the_fields(tmp_path):
    out = tmp_path / "run"
    results = _processes(tmp_path, [["--out", str(out)], ["--out", str(out), "--lr", "0.01", "--seed", "3"]])
    for rc, err in results:
        assert rc == 2
        assert _one_line(err) == (
            "vit train: error: the processes of this run disagree on --lr (process 0: 0.002, process 1: 0.01); "
            "--seed (process 0: 0, process 1: 3); start every process with the same flags"
        )
    assert not out.exists()  # no work: not even the lock


@pytest.mark.slow
def test_a_coordinator_port_in_use_is_one_line_naming_the_address(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        [(rc, err)] = _processes(tmp_path, [["--out", str(tmp_path / "run")]], port=port, n=2)
    assert rc == 2
    assert _one_line(err).startswith(f"vit train: error: JAX_COORDINATOR_ADDRESS=127.0.0.1:{port}: process 0 cannot")


@pytest.mark.slow
def test_a_process_that_never_starts_is_named_in_one_line_by_every_process_that_came(tmp_path):
    out = tmp_path / "run"
    results = _processes(tmp_path, [["--out", str(out), "--init-timeout", "3"]] * 2, n=3)
    for i, (rc, err) in enumerate(results):
        assert rc == 2
        line = _one_line(err)
        assert re.fullmatch(
            f"vit train: error: process {i} of 3: process 2 did not join the coordinator 127.0.0.1:[0-9]+ within "
            "--init-timeout 3 s \\(never started, or another JAX_COORDINATOR_ADDRESS\\); start all processes "
            "with the same environment",
            line,
        ), line
    assert not out.exists()


def _roll_call(port: int, processes: list[tuple[int, int]], timeout: int = 5) -> list[str | None]:
    """``roll_call`` in one thread per (process id, process count); each one's error line or None."""
    results: list[str | None] = [None] * len(processes)

    def one(k: int, pid: int, n: int) -> None:
        try:
            roll_call(f"127.0.0.1:{port}", n, pid, timeout)
        except ValueError as e:
            results[k] = str(e)

    threads = [threading.Thread(target=one, args=(k, *p)) for k, p in enumerate(processes)]
    for t in threads:
        t.start()
        time.sleep(0.05)  # process 0 first, usually; the others retry until it listens
    for t in threads:
        t.join(timeout + 60)
    return results


@pytest.mark.slow
def test_the_roll_call_returns_once_every_process_came_and_ignores_strangers():
    port = _free_port()
    strangers = []

    def knock() -> None:  # a port scanner and a client speaking another protocol, while process 0 waits
        time.sleep(0.3)
        for payload in (b"", b"GET / HTTP/1.1\r\n\r\n", b"[" * 5000 + b"\n", b'{"vit-roll-call": 2}\n'):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(payload)
                try:
                    strangers.append(s.recv(100))
                except ConnectionResetError:  # closed with the overlong line unread
                    strangers.append(b"")

    knocker = threading.Thread(target=knock)
    knocker.start()
    assert _roll_call_with_late(port, knocker) == [None, None, None]
    assert strangers == [b""] * 4  # each dropped unanswered


def _roll_call_with_late(port: int, knocker: threading.Thread) -> list[str | None]:
    """Processes 0 and 2 at once, 1 after the strangers knocked."""
    results: list[str | None] = [None] * 3

    def one(pid: int) -> None:
        try:
            roll_call(f"127.0.0.1:{port}", 3, pid, 20)
        except ValueError as e:
            results[pid] = str(e)

    threads = [threading.Thread(target=one, args=(pid,)) for pid in (0, 2)]
    for t in threads:
        t.start()
    knocker.join()
    late = threading.Thread(target=one, args=(1,))
    late.start()
    for t in (*threads, late):
        t.join(60)
    return results


def test_the_roll_call_names_two_processes_with_one_id_or_another_count():
    port = _free_port()
    lines = _roll_call(port, [(0, 3), (1, 3), (1, 3)])
    assert lines == [
        f"process {i} of 3: two processes say JAX_PROCESS_ID=1; start all processes with the same environment"
        for i in (0, 1, 1)
    ]
    port = _free_port()
    lines = _roll_call(port, [(0, 2), (1, 3)])
    assert lines == [
        f"process {i} of {n}: process 1 has JAX_NUM_PROCESSES=3, process 0 has 2; start all processes with the "
        "same environment"
        for i, n in ((0, 2), (1, 3))
    ]


def test_the_roll_call_names_a_process_0_that_never_answers_and_an_id_out_of_range():
    port = _free_port()
    [line] = _roll_call(port, [(1, 2)], timeout=1)
    assert line == (
        f"process 1 of 2: process 0 did not answer at the coordinator 127.0.0.1:{port} within --init-timeout 1 s "
        "(not started, or listening elsewhere); start all processes with the same environment"
    )
    with pytest.raises(ValueError, match="^JAX_PROCESS_ID=2: expected 0 to 1 \\(JAX_NUM_PROCESSES\\)$"):
        roll_call(f"127.0.0.1:{port}", 2, 2, 1)


def test_disagreement_names_every_differing_field_and_only_those():
    runs = {
        0: {"--lr": 0.1, "--out": "/a", "--seed": 0},
        1: {"--lr": 0.1, "--out": "/b", "--seed": 0},
        2: {"--lr": 0.1},
    }
    assert disagreement(runs) == (
        "the processes of this run disagree on --out (process 0: /a, process 1: /b, process 2: (not given)); "
        "--seed (process 0: 0, process 1: 0, process 2: (not given)); start every process with the same flags"
    )
    assert disagreement({0: {"--lr": [1, 2]}, 1: {"--lr": [1, 2]}}) is None
    assert run_digest({"b": 1, "a": 2}) == run_digest({"a": 2, "b": 1})


def test_a_silent_program_on_the_coordinator_port_is_named_within_the_acknowledgement_time(monkeypatch):
    """Something else accepts connections on the port and says nothing (or it is JAX's service of a job whose
    processes had all come): the process stops after ``_ACK_SECONDS``, not after twice its --init-timeout."""
    monkeypatch.setattr(distributed, "_ACK_SECONDS", 1)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        [line] = _roll_call(port, [(1, 2)], timeout=30)
    assert time.monotonic() - t0 < 10
    assert line == (
        f"process 1 of 2: the coordinator 127.0.0.1:{port} did not answer as process 0 of this job does: another "
        "program listens there, or the job's processes had all come already (a process too many, whose id "
        "another has?); start all processes with the same environment"
    )


def _slurm(port: int, ntasks: int, procid: int) -> dict:
    """The variables of a SLURM job step on this machine (what JAX's SlurmCluster reads)."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_NODELIST": "127.0.0.1",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid),
        "JAX_COORDINATOR_PORT": str(port),
    }


def test_a_slurm_job_is_detected_as_jax_detects_it(monkeypatch):
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in _slurm(6000, 3, 1).items():
        monkeypatch.setenv(k, v)
    assert cluster_env() == {}
    assert distributed.detected_job({}, 5) == ("127.0.0.1:6000", 3, 1)


@pytest.mark.slow
def test_a_slurm_task_that_never_starts_is_named_by_the_others(tmp_path):
    """Tasks 0 and 1 of a 3-task SLURM step (its variables, faked on localhost): both name task 2."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (8, 8, 8), np.uint8), y=np.arange(8) % 2)
    port, procs = _free_port(), []
    for i in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_", "OMPI_"))}
        env |= {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", **_slurm(port, 3, i)}
        argv = [*TINY.split(), "--dataset", f"npz:{tmp_path / 'd.npz'}", "--no-progress", "--no-parity"]
        argv += ["--compile-cache", "off", "--cpu-devices", "1", "--init-timeout", "3", "--out", str(tmp_path / "run")]
        procs.append(
            subprocess.Popen([sys.executable, "-c", DRIVER, *argv], env=env, stderr=subprocess.PIPE, text=True)
        )
    for i, p in enumerate(procs):
        assert p.wait(timeout=120) == 2
        line = _one_line(p.stderr.read())
        assert line.startswith(
            f"vit train: error: process {i} of 3: process 2 did not join the coordinator 127.0.0.1:{port} within"
        ), line
    assert not (tmp_path / "run").exists()


def test_agreed_batches_yield_each_batch_read_and_stop_at_the_one_a_process_could_not_read():
    """The damage flag per batch (one process here: the all-gather of one); the 2-process stop at an
    evaluation is parity_tests/test_train_multiprocess.py's."""
    from vit_common.data.stored_datasets import DataReadError
    from vit_jax.preemption import DamageStop, agreed_batches

    def batches():
        yield {"image": np.zeros(2)}
        raise DataReadError("imgs/b/0.png: unreadable image")

    it = agreed_batches(batches())
    assert next(it)["image"].shape == (2,)
    with pytest.raises(DamageStop, match=r"^\(process 0 of 1\): imgs/b/0.png: unreadable image$"):
        next(it)
    assert list(agreed_batches(iter([1, 2]))) == [1, 2]


def test_agree_damage_says_whether_a_process_could_not_read_its_rows_or_lost_a_data_worker():
    """The flag's kind (one process here: the all-gather of one; the 2-process stop on a killed data worker
    is parity_tests/test_train_multiprocess.py's)."""
    from vit_common.data.stored_datasets import DataReadError
    from vit_jax.data import DataWorkerError
    from vit_jax.preemption import DamageStop, WorkerStop, agree_damage

    assert agree_damage(None) is None
    lost = agree_damage(DataWorkerError("a data worker process (pid 7) was killed by SIGKILL"))
    assert (
        type(lost) is WorkerStop
        and str(lost) == "(process 0 of 1): a data worker process (pid 7) was killed by SIGKILL"
    )
    damaged = agree_damage(DataReadError("imgs/b/0.png: unreadable image"))
    assert type(damaged) is DamageStop and str(damaged) == "(process 0 of 1): imgs/b/0.png: unreadable image"


def test_a_data_worker_dead_at_a_test_batch_stops_every_process_before_it_naming_where():
    """A worker of the test set's batches that died: ``WorkerStop`` from the per-batch flag (one process here;
    the stops at an evaluation are parity_tests/test_preemption.py's), its line naming the evaluation."""
    from vit_jax.data import DataWorkerError
    from vit_jax.preemption import WorkerStop, agreed_batches, located

    def batches():
        yield {"image": np.zeros(2)}
        raise DataWorkerError("a data worker process (pid 7) was killed by SIGKILL")

    it = agreed_batches(batches())
    assert next(it)["image"].shape == (2,)
    with pytest.raises(WorkerStop) as stop:
        next(it)
    said = located(stop.value, "step 7's evaluation")
    assert type(said) is WorkerStop
    assert str(said) == "step 7's evaluation (process 0 of 1): a data worker process (pid 7) was killed by SIGKILL"
    alone = located(DataWorkerError("a data worker process (pid 7) exited"), "step 7's evaluation")
    assert type(alone) is DataWorkerError and str(alone) == "step 7's evaluation: a data worker process (pid 7) exited"
