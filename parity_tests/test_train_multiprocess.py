"""`vit train` over several processes on this machine (jax.distributed over localhost), as on a cluster.

Two processes with one CPU device each train bit for bit as one process with two devices (data
parallel; FSDP from a one-process checkpoint on), each output written once by process 0; a lost
process (SIGKILL, or SIGSTOP: a process that stops answering, which leaves the others stuck in a
collective) stops the others within the heartbeat timeout with one line; an image (of a batch or of the
test set) or an ArrayRecord shard (a record overwritten, the shard cut short; read through data worker
processes) one process finds damaged stops both at one step with its checkpoint; `--resume` continues
bit-exactly on the same devices and correctly on fewer (one process after two). Runs share a compilation cache and
XLA:CPU optimisation level 0 (conftest.py's ``env``).
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from test_train_runs import TINY, assert_same_run, metric_values, tensors

from vit_common.tolerance import compare

ROOT = Path(__file__).resolve().parents[1]
HEARTBEAT = 10  # seconds; short, so that a lost process is noticed quickly

# `vit train` that records the files it writes, and (on request) SIGKILLs, SIGSTOPs or SIGTERMs itself
# right after dispatching a given step. After a SIGTERM it holds that step until every process has told
# the coordination service its step counter (the keys JAX's preemption sync manager writes, under
# PREEMPTION_CURRENT_COUNTER/, in xla/tsl/distributed_runtime/preemption/preemption_sync_manager.cc):
# from then on each process's next `reached_preemption_sync_point` waits for the sync point, one past the
# highest counter, and no process can run ahead of the held step's collective, so the sync point is
# reached before the run ends whatever the notice's latency.
DRIVER = textwrap.dedent("""
    import builtins, os, signal, sys, time
    stop_at, signame, record, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    from vit_cli.main import build_parser, main
    from vit_common.system.host_devices import split_cpu
    a = build_parser().parse_args(argv)
    split_cpu(a.cpu_devices, a.batch_size, a.accum_steps)  # as `vit train` does, before JAX is imported
    replace, open_ = os.replace, builtins.open
    def note(path):
        with open_(record, "a") as f:
            f.write(f"{os.path.abspath(path)}\\n")
    def replacing(src, dst, *a, **k):  # atomic writes end here
        note(dst)
        return replace(src, dst, *a, **k)
    def opening(file, mode="r", *a, **k):
        if isinstance(file, (str, os.PathLike)) and set(mode) & set("wax+"):
            note(file)
        return open_(file, mode, *a, **k)
    os.replace, builtins.open = replacing, opening
    if stop_at:
        from vit_jax import trainer
        step = trainer.Trainer.train_step
        def stopping_step(self, state, batch):
            done = int(state["step"])  # read first: the step donates the state's buffers
            out = step(self, state, batch)
            if done + 1 == stop_at:
                print(f"stopping at {time.time()}", flush=True)
                os.kill(os.getpid(), getattr(signal, signame))
                if signame == "SIGTERM":
                    from jax._src import distributed
                    client, n = distributed.global_state.client, int(os.environ["JAX_NUM_PROCESSES"])
                    deadline = time.time() + 120
                    while len(client.key_value_dir_get("PREEMPTION_CURRENT_COUNTER/")) < n:
                        assert time.time() < deadline, "the preemption notice did not reach every process"
                        time.sleep(0.05)
            return out
        trainer.Trainer.train_step = stopping_step
    if os.environ.get("KILL_WORKER_AT") and os.environ["JAX_PROCESS_ID"] == "0":  # one data worker of process 0
        import multiprocessing
        from vit_jax import trainer
        kill_at, step = int(os.environ["KILL_WORKER_AT"]), trainer.Trainer.train_step
        def killing_step(self, state, batch):
            done = int(state["step"]) + 1  # read first: the step donates the state's buffers
            out = step(self, state, batch)
            if done == kill_at:  # grain's workers are this process's only multiprocessing children
                test = os.environ.get("KILL_WORKER_OF") == "test"  # the test set's, started at the first evaluation
                pid = (list(self._test_batches._workers) if test else multiprocessing.active_children())[0].pid
                os.kill(pid, signal.SIGKILL)
                print(f"test: killed {pid}", file=sys.stderr, flush=True)
            return out
        trainer.Trainer.train_step = killing_step
    if os.environ.get("DAMAGE_AT"):  # the last process breaks an example its rows of that step read (see train)
        import shutil
        from pathlib import Path
        import vit_common.data.datasets as datasets
        from vit_common.data.batches import TrainPlan, process_rows
        logs, read = Path(record).parent, datasets.read_dataset
        me, n = int(os.environ["JAX_PROCESS_ID"]), int(os.environ["JAX_NUM_PROCESSES"])
        def read_then_damage(*args, **kwargs):
            data = read(*args, **kwargs)
            (logs / f"checked{me}").touch()  # after every process's up-front check of every image
            if me == n - 1:
                while not all((logs / f"checked{k}").exists() for k in range(n)):
                    time.sleep(0.05)
                how = os.environ.get("DAMAGE_HOW", "file")
                if os.environ["DAMAGE_AT"] == "test":  # its first row of the test set's first batch
                    name = data.test.name(me * process_rows(a.batch_size, me, n))
                else:
                    at, shard = int(os.environ["DAMAGE_AT"]), lambda i: data.train.name(i).rpartition(": record ")[0]
                    plans = [
                        TrainPlan(len(data.train), a.batch_size, a.epochs, a.seed, process_index=k, process_count=n)
                        for k in range(n)
                    ]
                    def rows(k, s):  # process k's rows of step s
                        return [plans[k][(s - 1) * plans[k].rows + r]["index"] for r in range(plans[k].rows)]
                    mine = rows(me, at)
                    if how == "truncate":  # its first row of a shard that no process reads before, nor another now
                        before = {shard(i) for s in range(1, at) for k in range(n) for i in rows(k, s)}
                        before |= {shard(i) for k in range(n) if k != me for i in rows(k, at)}
                        mine = [i for i in mine if shard(i) not in before]
                    name = data.train.name(mine[0])
                path = name.rpartition(": record ")[0] or name
                shutil.copy(path, logs / "original")
                (logs / "damaged").write_text(path)
                (logs / "named").write_text(name)
                if how == "file":
                    with open(path, "wb") as f:
                        f.write(b"not an image any more")
                elif how == "truncate":  # half its bytes, as a copy still being written
                    os.truncate(path, os.path.getsize(path) // 2)
                else:  # the record's image bytes overwritten, the shard's layout kept
                    from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter
                    from vit_common.data.arrayrecord import decode_record, encode_record
                    k = int(name.rpartition(": record ")[2])
                    reader = ArrayRecordReader(path)
                    records = reader.read(list(range(reader.num_records())))
                    reader.close()
                    records[k] = encode_record(b"not an image any more", decode_record(records[k], name)[0])
                    writer = ArrayRecordWriter(path, "group_size:1")
                    for record in records:
                        writer.write(record)
                    writer.close()
            return data
        datasets.read_dataset = read_then_damage
    sys.exit(main(argv))
""")


@dataclass
class Proc:
    returncode: int
    stdout: str
    stderr: str
    ended: float  # time.time() when it exited
    writes: list[str]  # absolute paths it opened for writing or renamed into place


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(
    env, n: int, out: Path, *args, stop: tuple[int, int, str] | None = None, dataset: str | None = None
) -> list[Proc]:
    """Run `vit train` as ``n`` processes (one CPU device each when n > 1) into ``out``, on ``dataset``
    (default the module's npz). ``env["DAMAGE_AT"]`` = step: the last process overwrites the image it reads
    first at that step (= "test": at the first evaluation), after every process checked the dataset
    (logs/damaged names the file, logs/original holds its bytes, logs/named the example the run's line
    names); ``env["DAMAGE_HOW"]`` = "record": that example's record of its ArrayRecord shard is overwritten
    instead, "truncate": its first row of that step whose shard no process reads before (nor another then)
    has its shard cut to half its bytes.

    ``stop`` = (process, step, signal name): that process signals itself after dispatching that step;
    a stopped (SIGSTOP) process is killed once the others have exited.
    """
    port, logs, procs = free_port(), out.parent / f"{out.name}-logs", []
    logs.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        penv = {**env}
        if n > 1:
            penv |= {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": str(n)}
            penv["JAX_PROCESS_ID"] = str(i)
        at, sig = (stop[1], stop[2]) if stop and stop[0] == i else (0, "SIGKILL")
        cmd = [sys.executable, "-c", DRIVER, str(at), sig, str(logs / f"writes{i}"), "train", *TINY]
        cmd += [
            "--dataset",
            dataset or f"npz:{env['TINY_NPZ']}",
            *map(str, args),
            "--out",
            str(out),
        ]  # args last: they win
        with open(logs / f"out{i}", "w") as o, open(logs / f"err{i}", "w") as e:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=penv, stdout=o, stderr=e))
    ended, deadline = {}, time.time() + 600
    victim = stop[0] if stop and stop[2] == "SIGSTOP" else None
    while len(ended) < n and time.time() < deadline:
        for i, p in enumerate(procs):
            if i not in ended and p.poll() is not None:
                ended[i] = time.time()
        if victim is not None and victim not in ended and len(ended) == n - 1:
            procs[victim].kill()
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    assert len(ended) == n, f"processes still running after 600 s: {sorted(set(range(n)) - set(ended))}"

    def read(name):
        path = logs / name
        return path.read_text() if path.exists() else ""

    return [
        Proc(p.returncode, read(f"out{i}"), read(f"err{i}"), ended[i], read(f"writes{i}").split())
        for i, p in enumerate(procs)
    ]


def ok(procs: list[Proc]) -> list[Proc]:
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{p.stderr[-3000:]}"
    return procs


@pytest.fixture(scope="module")
def menv(env, npz):
    return {**env, "TINY_NPZ": str(npz)}


@pytest.fixture(scope="module")
def runs(menv, tmp_path_factory):
    """Uninterrupted runs, made on first use: (processes, sharding) -> (run folder, processes)."""
    made = {}

    def get(n: int, sharding: str):
        if (n, sharding) not in made:
            out = tmp_path_factory.mktemp("runs") / f"{n}p-{sharding}"
            devices = ["--cpu-devices", "2" if n == 1 else "1"]
            parity = [] if n == 2 else ["--no-parity"]  # the export's PyTorch check: once, by 2 processes
            made[n, sharding] = out, ok(train(menv, n, out, "--sharding", sharding, *devices, *parity))
        return made[n, sharding]

    return get


def outputs(proc: Proc, run: Path) -> list[str]:
    """Files a process wrote into the run folder, outside the checkpoints (orbax's), temporaries left out."""
    rel = [Path(w).relative_to(run.absolute()) for w in proc.writes if Path(w).is_relative_to(run.absolute())]
    rel = [Path("tensorboard/events") if r.parts[0] == "tensorboard" else r for r in rel]  # named by time and host
    return sorted(str(r) for r in rel if r.parts[0] != "checkpoints" and not r.name.startswith("."))


def assert_written_by_process_0_once(procs: list[Proc], run: Path, files: list[str]) -> None:
    assert outputs(procs[0], run) == sorted(files)  # each as often as listed
    assert outputs(procs[1], run) == []
    assert "test accuracy" in procs[0].stdout
    assert [ln for ln in procs[1].stdout.splitlines() if not ln.startswith("[Gloo]")] == []  # gloo's own line


def assert_checkpoints_of_two_processes(run: Path, steps) -> None:
    """One checkpoint per step in the one folder: process 0's metadata, and the shards of each process."""
    for step in steps:
        state = run / "checkpoints" / str(step) / "state"
        assert sorted(p.name for p in state.glob("ocdbt.process_*")) == ["ocdbt.process_0", "ocdbt.process_1"]
        assert (run / "checkpoints" / str(step) / "meta" / "metadata").is_file()


def test_two_processes_train_bit_for_bit_as_one_process_with_as_many_devices(runs):
    one, _ = runs(1, "dp")
    two, procs = runs(2, "dp")
    assert_same_run(two, one)  # parameters, optimizer state, RNG, every metric line
    config = json.loads((two / "config.json").read_text())
    assert (config["devices"], config["processes"]) == ("2 x cpu", 2)
    exports = ["model.safetensors", "model_timm.safetensors", "curves.png", "parity.json"]
    assert_written_by_process_0_once(procs, two, ["config.json", "metrics.jsonl", "tensorboard/events", *exports])
    assert json.loads((two / "parity.json").read_text())["ok"]
    assert_checkpoints_of_two_processes(two, (6, 8, 9))
    assert [p.name for p in (one / "checkpoints" / "9" / "state").glob("ocdbt.process_*")] == ["ocdbt.process_0"]


@pytest.mark.slow
def test_two_processes_continue_an_fsdp_run_of_one_process_bit_for_bit(runs, menv, tmp_path):
    """FSDP: one process with two devices writes checkpoint 6; two processes with one device each restore
    their halves of every sharded array (orbax, onto the new mesh) and train on to where the one-process
    run ends, bit for bit (the same total device count, two: a sum of two terms is the same in either
    order)."""
    ref, _ = runs(1, "fsdp")
    out = tmp_path / "grown"
    shutil.copytree(ref, out)
    for step in (8, 9):
        shutil.rmtree(out / "checkpoints" / str(step))
    procs = ok(train(menv, 2, out, "--sharding", "fsdp", "--cpu-devices", "1", "--no-parity", "--resume"))
    assert_same_run(out, ref)
    assert_checkpoints_of_two_processes(out, (8, 9))
    exports = ["model.safetensors", "model_timm.safetensors", "curves.png"]
    metrics = ["metrics.jsonl"] * 2  # cut back to step 6, then appended to
    assert_written_by_process_0_once(procs, out, ["config.json", *metrics, "tensorboard/events", *exports])


def assert_one_line_and_bounded(procs: list[Proc], victim: int, run: Path) -> float:
    """The survivors' report; returns the seconds from the victim's stop to the last survivor's exit."""
    stopped = float(procs[victim].stdout.split("stopping at ")[1].split()[0])
    steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    line = (
        f"vit train: lost process {victim} of 2 (heartbeats stopped; --heartbeat-timeout {HEARTBEAT}); stopping. "
        f"Start all 2 processes again with --resume to continue from the checkpoint of step {steps[-1]}."
    )
    for i, p in enumerate(procs):
        if i == victim:
            continue
        assert p.returncode == 75, (p.returncode, p.stderr[-3000:])
        assert p.stderr.count("vit train: lost process") == 1 and line in p.stderr.splitlines(), p.stderr
        for noise in ("Traceback", "stack trace", "Terminating process", "ERROR"):
            assert noise not in p.stderr, p.stderr
    waited = max(p.ended for i, p in enumerate(procs) if i != victim) - stopped
    assert waited < HEARTBEAT + 30, waited
    return waited


@pytest.mark.slow
def test_a_killed_process_stops_the_other_with_one_line_and_resume_ends_bit_exact(runs, menv, tmp_path):
    uninterrupted, _ = runs(2, "dp")
    out = tmp_path / "killed"
    args = ["--cpu-devices", "1", "--no-parity"]
    procs = train(menv, 2, out, *args, "--heartbeat-timeout", HEARTBEAT, stop=(1, 5, "SIGKILL"))
    assert procs[1].returncode == -signal.SIGKILL
    assert_one_line_and_bounded(procs, 1, out)
    assert not (out / "model.safetensors").exists()
    ok(train(menv, 2, out, *args, "--resume"))
    assert_same_run(out, uninterrupted)


def assert_close_run(run: Path, ref: Path) -> None:
    """Parameters and logged losses within float32 rounding of ``ref``'s (another device count sums in
    another order). The key bias is left out: its gradient is exactly zero (softmax ignores a shift shared
    by all keys), so its Adam updates are normalised rounding noise."""
    a, b = tensors(run / "model.safetensors"), tensors(ref / "model.safetensors")
    d = a["blocks.0.attn.qkv.bias"].shape[0] // 3
    for t in (a, b):
        t["blocks.0.attn.qkv.bias"] = np.delete(t["blocks.0.attn.qkv.bias"], np.s_[d : 2 * d])
    for k in b:
        c = compare(k, a[k], b[k], "tensor", "float32")
        assert c.ok, c
    rows, ref_rows = metric_values(run), metric_values(ref)
    assert [r["step"] for r in rows] == [r["step"] for r in ref_rows]  # every step logged once
    for r, s in zip(rows, ref_rows, strict=True):
        for k in ("loss", "test_loss"):
            if k in s:
                assert abs(r[k] - s[k]) <= 1e-5 * abs(s[k]), (r, s)


@pytest.mark.slow
def test_a_process_that_stops_answering_is_declared_lost_and_one_process_resumes_the_run(runs, menv, tmp_path):
    """SIGSTOP leaves the survivor inside a collective that never returns (as a GPU collective waits for a
    lost peer); the watchdog stops it. One process with one device then resumes what two wrote with FSDP."""
    ref, _ = runs(1, "fsdp")
    out = tmp_path / "stuck"
    procs = train(
        menv,
        2,
        out,
        "--sharding",
        "fsdp",
        "--cpu-devices",
        "1",
        "--no-parity",
        "--heartbeat-timeout",
        HEARTBEAT,
        stop=(1, 5, "SIGSTOP"),
    )
    assert_one_line_and_bounded(procs, 1, out)
    ok(train(menv, 1, out, "--sharding", "fsdp", "--cpu-devices", "1", "--no-parity", "--resume"))
    assert json.loads((out / "config.json").read_text())["processes"] == 1
    assert_close_run(out, ref)


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_at_one_step_with_a_checkpoint_and_resume_ends_bit_exact(
    runs, menv, tmp_path
):
    """JAX's preemption service tells every process; both save the step of the sync point, exit 3, and
    `--resume` on both ends where the uninterrupted run ends. (SIGINT and SIGHUP are passed on to the
    service as SIGTERM: the same path, run by hand with SIGINT, left out here for the suite's time.)"""
    uninterrupted, _ = runs(2, "dp")
    out = tmp_path / "stopped"
    args = ["--cpu-devices", "1", "--no-parity"]
    procs = train(menv, 2, out, *args, stop=(1, 4, "SIGTERM"))
    assert [p.returncode for p in procs] == [3, 3], [p.stderr[-2000:] for p in procs]
    line = [ln for ln in procs[0].stderr.splitlines() if "stopped by" in ln]
    assert len(line) == 1 and "Traceback" not in procs[0].stderr + procs[1].stderr, procs[0].stderr
    step = int(line[0].split("after step ")[1].split(",")[0])
    assert step in (4, 5) and f"after step {step}, its checkpoint written" in line[0]  # see DRIVER
    assert "--resume continues from it" in line[0]
    assert_checkpoints_of_two_processes(out, [step])
    assert not (out / "model.safetensors").exists()
    ok(train(menv, 2, out, *args, "--resume"))
    assert_same_run(out, uninterrupted)


@pytest.mark.slow
def test_two_processes_of_four_devices_train_a_2x4_mesh_as_one_process_of_eight(menv, tmp_path):
    """--mesh replica=2,fsdp=4 on two processes with four CPU devices each (each process one replica, its
    four devices the fsdp axis) against one process with eight: parameters and losses within float32
    rounding (the processes' gloo sums add in another order than XLA within one process)."""
    flags = ["--mesh", "replica=2,fsdp=4", "--no-parity"]
    devices = menv["XLA_FLAGS"] + " --xla_force_host_platform_device_count="
    ok(train({**menv, "XLA_FLAGS": devices + "8"}, 1, tmp_path / "one", *flags))
    procs = ok(train({**menv, "XLA_FLAGS": devices + "4"}, 2, tmp_path / "two", *flags))
    assert_close_run(tmp_path / "two", tmp_path / "one")
    for run, n in (("one", 1), ("two", 2)):
        config = json.loads((tmp_path / run / "config.json").read_text())
        assert (config["devices"], config["mesh"], config["processes"]) == ("8 x cpu", {"replica": 2, "fsdp": 4}, n)
    assert_checkpoints_of_two_processes(tmp_path / "two", (6, 8, 9))
    assert "(mesh replica=2,fsdp=4)" in procs[0].stderr


@pytest.fixture(scope="module")
def image_run(menv, tmp_path_factory):
    """A folder of 40 8x8 images (32 train: 4 steps of 8 an epoch; 8 test) and an undamaged 2-process run
    on it: (images, run, the run's flags)."""
    from PIL import Image

    root, rng = tmp_path_factory.mktemp("images"), np.random.default_rng(0)
    for c in ("a", "b"):
        (root / "imgs" / c).mkdir(parents=True)
        for i in range(20):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), np.uint8)).save(root / "imgs" / c / f"{i}.png")
    args = ["--cpu-devices", "1", "--no-parity", "--data-workers", "0"]
    ok(train(menv, 2, root / "ref", *args, dataset=f"imagefolder:{root / 'imgs'}"))
    return root / "imgs", root / "ref", args


@pytest.mark.slow
@pytest.mark.parametrize(
    ("at", "found", "saved"),
    [("4", "step 4's batch", [2, 3]), ("test", "step 4's evaluation", [2, 4])],
    ids=["batch", "evaluation"],
)
def test_an_image_one_process_finds_damaged_stops_both_at_one_step_with_a_checkpoint(
    image_run, menv, tmp_path, at, found, saved
):
    """Process 1 cannot read an image of its rows (broken after both checked the dataset) of step 4's batch,
    or of the test set at step 4's evaluation (the end of epoch 1): both processes learn it before that
    batch's computation, write the checkpoint of the step reached together (3, or 4 marked so that a
    resumed run takes its evaluation first), print one line naming the step, the process and the file,
    and exit 2; the image restored, `--resume` on both ends where an undamaged run ends, bit for bit."""
    from vit_jax.checkpointing import saved_steps

    images, ref, args = image_run
    shutil.copytree(images, tmp_path / "imgs")
    data, out = f"imagefolder:{tmp_path / 'imgs'}", tmp_path / "damaged"
    procs = train({**menv, "DAMAGE_AT": at}, 2, out, *args, dataset=data)
    logs = out.parent / f"{out.name}-logs"
    path = (logs / "damaged").read_text()
    for i, p in enumerate(procs):
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("vit train: error: ")]
        assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in p.stderr, (i, p.stderr[-3000:])
        assert errors[0].startswith(f"vit train: error: {found} (process 1 of 2): {path}: unreadable image")
        assert errors[0].endswith(f"the same command with --resume continues from the checkpoint of step {saved[-1]}")
    assert saved_steps(out / "checkpoints") == saved
    assert_checkpoints_of_two_processes(out, saved[-1:])
    assert not (out / "model.safetensors").exists()
    Path(path).write_bytes((logs / "original").read_bytes())  # repaired
    ok(train(menv, 2, out, *args, "--resume", dataset=data))
    assert_same_run(out, ref)  # with step 4's evaluation line, taken first by the resumed run


def tagged_processes(tag: str) -> list[int]:
    """Ids of the live processes whose environment holds ``VIT_TEST_RUN=tag`` (a run's processes, their data
    workers and whatever else they started)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"VIT_TEST_RUN={tag}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:  # ended meanwhile, or another user's
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "why"),
    [("record", "unreadable image"), ("truncate", "a damaged ArrayRecord file")],
    ids=["record-overwritten", "shard-truncated"],
)
def test_a_shard_one_process_finds_damaged_through_data_workers_stops_both_and_leaves_no_worker(
    image_run, menv, tmp_path, how, why
):
    """The image folder as ArrayRecord shards of 2 records, read by 2 data worker processes per process.
    Process 1 finds a record of its rows of step 4's batch damaged (its image bytes overwritten, or its
    shard, first read at that step by process 1 alone, cut to half its bytes) after both checked the
    dataset: both processes save the checkpoint of step 3 together, print one line naming the process,
    the shard and the record, exit 2 within seconds of each other, and leave no worker process behind; the
    shard restored, `--resume` on both ends where the undamaged run (no workers) ends, bit for bit."""
    from vit_cli.main import main
    from vit_jax.checkpointing import saved_steps

    images, ref, args = image_run
    assert main(["data", "convert", str(images), str(tmp_path / "rec"), "--shard-size", "2"]) == 0
    data, out, tag = f"arrayrecord:{tmp_path / 'rec'}", tmp_path / "damaged", f"{how}-{time.time_ns()}"
    args = [*args[: args.index("--data-workers")], "--data-workers", "2"]
    procs = train({**menv, "DAMAGE_AT": "4", "DAMAGE_HOW": how, "VIT_TEST_RUN": tag}, 2, out, *args, dataset=data)
    logs = out.parent / f"{out.name}-logs"
    named = (logs / "named").read_text()
    for i, p in enumerate(procs):
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("vit train: error: ")]
        assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in p.stderr, (i, p.stderr[-3000:])
        assert errors[0].startswith(f"vit train: error: step 4's batch (process 1 of 2): {named}: {why}"), errors[0]
        assert errors[0].endswith("the same command with --resume continues from the checkpoint of step 3")
    assert abs(procs[0].ended - procs[1].ended) < 30
    assert saved_steps(out / "checkpoints") == [2, 3]
    assert_checkpoints_of_two_processes(out, [3])
    assert not (out / "model.safetensors").exists()
    deadline = time.time() + 10  # a worker ends once it sees its parent gone (a pidfd), at once
    while tagged_processes(tag) and time.time() < deadline:
        time.sleep(0.1)
    assert tagged_processes(tag) == []
    Path((logs / "damaged").read_text()).write_bytes((logs / "original").read_bytes())  # repaired
    ok(train({**menv, "VIT_TEST_RUN": tag}, 2, out, *args, "--resume", dataset=data))
    assert_same_run(out, ref)
    assert tagged_processes(tag) == []


def assert_both_stopped_for_a_lost_worker(procs, where: str, killed: str, reached: int, out, tag: str) -> None:
    """Both processes exited 75 with the same one line (``where``, process 0 and the killed worker's pid,
    the checkpoint of step ``reached`` to resume from), no traceback, that checkpoint written by both, no
    model export, and no worker of the run left after 10 s."""
    for i, p in enumerate(procs):
        said = [ln for ln in p.stderr.splitlines() if ln.startswith("vit train: ") and " train / " not in ln]
        assert p.returncode == 75 and len(said) == 1 and "Traceback" not in p.stderr, (i, p.stderr[-3000:])
        assert said[0].startswith(
            f"vit train: error: {where} (process 0 of 2): a data worker process (pid {killed}) was killed by SIGKILL ("
        ), said[0]
        assert said[0].endswith(f"The same command with --resume continues from the checkpoint of step {reached}")
    assert_checkpoints_of_two_processes(out, [reached])
    assert not (out / "model.safetensors").exists()
    deadline = time.time() + 10
    while tagged_processes(tag) and time.time() < deadline:
        time.sleep(0.1)
    assert tagged_processes(tag) == []


@pytest.mark.slow
def test_a_killed_data_worker_of_one_process_stops_both_at_one_step_with_a_checkpoint_and_resume_ends_bit_exact(
    menv, tmp_path
):
    """SIGKILL to one of process 0's 2 data workers after step 3 of a 30-step run: process 0 still takes the
    batches the worker had made (grain's buffers) and learns of the death at the worker's next batch; both
    processes save the checkpoint of the step reached together, print the same line naming the step,
    process 0 and the worker's pid, exit 75 (start again) within seconds of each other and leave no worker
    behind; `--resume` on both ends bit for bit where an undamaged run ends (one process with as many
    devices and no workers: the same run, as the first test shows)."""
    from vit_jax.checkpointing import saved_steps

    run = ["--no-parity", "--epochs", "10", "--ckpt-every", "4"]
    args, tag, out = [*run, "--cpu-devices", "1", "--data-workers", "2"], f"worker-{time.time_ns()}", tmp_path / "run"
    ok(train(menv, 1, tmp_path / "ref", *run, "--cpu-devices", "2", "--data-workers", "0"))
    procs = train({**menv, "KILL_WORKER_AT": "3", "VIT_TEST_RUN": tag}, 2, out, *args)
    killed = procs[0].stderr.split("test: killed ")[1].split()[0]
    reached = saved_steps(out / "checkpoints")[-1]
    assert 3 < reached < 30 and reached % 4, (reached, procs[0].stderr[-3000:])  # the step reached, not a periodic one
    assert abs(procs[0].ended - procs[1].ended) < 30
    assert_both_stopped_for_a_lost_worker(procs, f"step {reached + 1}'s batch", killed, reached, out, tag)
    ok(train({**menv, "VIT_TEST_RUN": tag}, 2, out, *args, "--resume"))
    assert_same_run(out, tmp_path / "ref")
    assert tagged_processes(tag) == []


@pytest.mark.slow
def test_a_killed_test_set_worker_of_one_process_stops_both_at_its_evaluation_with_a_checkpoint(menv, tmp_path):
    """SIGKILL to process 0's test-set data worker after step 2 of 9, evaluating after every step: at the
    evaluation that needs its next batch both processes learn it before that batch's computation, save the
    checkpoint of that step together (marked so that a resumed run takes the evaluation first), print the
    same line naming the step, process 0 and the worker's pid, and exit 75; `--resume` on both ends bit for
    bit where an undamaged run ends (one process with as many devices and no workers)."""
    from vit_jax.checkpointing import saved_steps

    run = ["--no-parity", "--eval-every", "1steps"]
    args, tag, out = (
        [*run, "--cpu-devices", "1", "--data-workers", "1"],
        f"test-worker-{time.time_ns()}",
        tmp_path / "run",
    )
    ok(train(menv, 1, tmp_path / "ref", *run, "--cpu-devices", "2", "--data-workers", "0"))
    procs = train({**menv, "KILL_WORKER_AT": "2", "KILL_WORKER_OF": "test", "VIT_TEST_RUN": tag}, 2, out, *args)
    killed = procs[0].stderr.split("test: killed ")[1].split()[0]
    reached = saved_steps(out / "checkpoints")[-1]
    assert 2 < reached <= 9, (reached, procs[0].stderr[-3000:])
    assert_both_stopped_for_a_lost_worker(procs, f"step {reached}'s evaluation", killed, reached, out, tag)
    ok(train({**menv, "VIT_TEST_RUN": tag}, 2, out, *args, "--resume"))
    assert_same_run(out, tmp_path / "ref")  # with the stopped step's evaluation line, taken first by the resumed run
