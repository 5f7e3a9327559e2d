"""Time from `vit train`'s start to its first finished training step, with JAX's persistent compilation
cache cold (an empty folder), warm (the folder the cold run filled) and off.

Each round runs ``vit train --epochs 1 --no-parity --no-progress`` (the demo model on mnist5k, or what the
arguments after ``--`` say) three times in a row: cold, warm, off, each in a fresh run folder, the round
on a new cache folder; rounds repeat the three so that a slow spell of a shared machine falls on all of
them. The figure is the ``time_to_first_step_s`` of the run's ``metrics.jsonl``: seconds from the start
of `vit`'s ``main`` (after Python itself started, about 0.1 s) to the end of the first training step,
imports, data loading, model initialisation, tracing and compilation (or the cache read) included.
One JSON line per run goes to ``--out``; the summary gives each kind's median and, per round, warm / cold.

    python -m benchmarks.startup --out benchmarks/results/startup-cpu.jsonl
    python -m benchmarks.startup --rounds 2 -- --variant Ti/16 --dataset digits --image-size 32

``--phases`` runs ``vit train`` (cache off) under ``python -X importtime`` instead and splits each run's wall
time into phases (``PHASES``: a call of the named function, its own time without the phases it calls),
with the import time of each top-level package (its modules' own import time, whichever phase imported
them); one ``vit-startup-phases/1`` JSON line per run:

    python -m benchmarks.startup --phases --rounds 2 -- --init tiny.safetensors --dataset digits
"""

from __future__ import annotations

import argparse
import functools
import importlib.abc
import importlib.util
import json
import os
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import report
from benchmarks.harness import host
from vit_common.system import io

SCHEMA = "vit-startup/1"
KINDS = ("cold", "warm", "off")
# Every record (one JSON line) has exactly these keys.
RECORD_FIELDS: dict[str, str] = {
    "schema": SCHEMA,
    "time": "start of the run, UTC ISO 8601",
    "machine": "cpu model, cpu_flags (AVX-512, AMX, ...), usable cores, load average (1, 5, 15 min) at the start",
    "arguments": "vit train's arguments besides --out and --compile-cache",
    "round": "index of the round (cold, warm, off on one new cache folder)",
    "cache": "the run's kind: 'cold' (empty cache folder), 'warm' (filled by the cold run) or 'off'",
    "compile_cache": "what vit train reported for its training step: 'cold', 'warm' or 'off'",
    "time_to_first_step_s": "seconds from vit's main to the end of the first training step",
    "wall_s": "seconds the whole process took (the epoch, evaluation and export included)",
    "exit_code": "the process's exit status",
}
DEFAULT_ARGS = ["--epochs", "1", "--no-parity", "--no-progress"]
PHASES_ARGS = ["--epochs", "1", "--no-progress"]  # --phases: the export check is a phase

PHASES_SCHEMA = "vit-startup-phases/1"
# (module, function, phase): a call's own time (less the phases it calls) goes to the phase; "run" is what
# `vit_jax.launch.train` does outside the others (importing JAX, the checks, the memory plan's analysis).
PHASES = (
    ("vit_jax.launch", "train", "run"),
    ("vit_common.data.datasets", "read_dataset", "dataset"),
    ("vit_jax.launch", "finetune_start", "checkpoint read"),
    ("vit_jax.launch", "fresh_start", "checkpoint read"),
    ("vit_jax.trainer", "Trainer.__init__", "model build"),
    ("vit_jax.trainer", "Trainer.compile", "first compilation"),
    ("vit_jax.trainer", "Trainer.init_state", "state init"),
    ("vit_jax.trainer", "Trainer.train_iterator", "data pipeline start"),
    ("vit_jax.data", "BatchIterator.start_prefetch", "data pipeline start"),
    ("vit_jax.data", "BatchIterator.__next__", "waiting for data"),
    ("vit_jax.trainer", "Trainer.evaluate", "evaluation"),
    ("vit_jax.loop", "fit", "training"),
    ("vit_jax.finetune", "export", "export"),
    ("vit_jax.launch", "plot_curves", "curves"),
    ("vit_compare.exports", "export_parity", "export check"),
)
MARK = "vit-startup-phase: "  # a phase's start (+NAME) and end (-) on stderr
# Besides PHASES: "python" (interpreter start to the first line of the run), "cli" (vit's own imports and
# flags, up to `train`), "exit" (main's return to the process's end).
PHASES_FIELDS: dict[str, str] = {
    "schema": PHASES_SCHEMA,
    "time": "start of the run, UTC ISO 8601",
    "machine": "as the start-up records' machine",
    "arguments": "vit train's arguments besides --out and --compile-cache (off)",
    "round": "index of the run",
    "phases_s": "{phase: seconds}: python, cli, the phases of PHASES, exit; they sum to wall_s",
    "imports_s": "{top-level package: seconds its modules took to import (-X importtime's self times)}",
    "phase_imports_s": "{phase: seconds of phases_s[phase] spent importing}",
    "wall_s": "seconds the whole process took, as the parent saw it",
    "exit_code": "the process's exit status",
}


class _Timed(importlib.abc.MetaPathFinder):
    """Wraps the functions of ``PHASES`` as their modules are imported (nothing is imported early, so the
    import times stay where the run puts them); ``spans``: (phase, start, own seconds) of each call."""

    def __init__(self):
        self.spans: list[tuple[str, float, float]] = []
        self.stack: list[float] = []  # per open call: the seconds its timed callees took

    def find_spec(self, name, path, target=None):
        if name not in {m for m, _, _ in PHASES}:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        exec_module = spec.loader.exec_module

        def run(module):
            exec_module(module)
            for m, qualname, phase in PHASES:
                if m == name:
                    *owner, attr = qualname.split(".")
                    holder = getattr(module, owner[0]) if owner else module
                    setattr(holder, attr, self.wrap(getattr(holder, attr), phase))

        spec.loader.exec_module = run
        return spec

    def wrap(self, fn, phase: str):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.time()
            self.stack.append(0.0)
            print(f"{MARK}+{phase}", file=sys.stderr, flush=True)  # between -X importtime's lines
            try:
                return fn(*args, **kwargs)
            finally:
                print(f"{MARK}-", file=sys.stderr, flush=True)
                took, inner = time.time() - t0, self.stack.pop()
                if self.stack:
                    self.stack[-1] += took
                self.spans.append((phase, t0, took - inner))

        return timed


def phases_child(out: str, argv: list[str]) -> int:
    """``vit train argv`` in this process with ``PHASES`` timed; {"spans", "main_start", "main_end"}
    (time.time() values) written to ``out`` as JSON."""
    main_start = time.time()
    print(f"{MARK}+cli", file=sys.stderr, flush=True)
    timed = _Timed()
    sys.meta_path.insert(0, timed)
    sys.argv = ["vit", "train", *argv]  # as the `vit` script calls it, its exit included
    try:  # run as `python -m vit_cli.main` runs it, without importing the CLI into this package
        runpy.run_module("vit_cli.main", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        record = {"spans": timed.spans, "main_start": main_start, "main_end": time.time()}
        io.write_text(out, json.dumps(record))
    return code


def import_times(stderr: str) -> tuple[dict[str, float], dict[str, float]]:
    """({top-level package: seconds}, {phase: seconds}) from ``python -X importtime``'s lines (each
    module's self time), a module's phase the innermost one open when it was imported (``MARK`` lines;
    "python" before the first)."""
    packages: dict[str, int] = {}  # microseconds
    phases: dict[str, int] = {}
    open_phases = ["python"]
    for line in stderr.splitlines():
        if line.startswith(MARK):
            mark = line[len(MARK) :]
            open_phases.append(mark[1:]) if mark.startswith("+") else open_phases.pop()
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        own, _, name = line[len("import time:") :].split("|")
        root, us = name.strip().split(".")[0], int(own)
        packages[root] = packages.get(root, 0) + us
        phases[open_phases[-1]] = phases.get(open_phases[-1], 0) + us
    ranked = sorted(packages.items(), key=lambda kv: -kv[1])
    return {k: us / 1e6 for k, us in ranked}, {k: us / 1e6 for k, us in phases.items()}


def phase_seconds(child: dict, launched: float, ended: float) -> dict[str, float]:
    """{phase: seconds} of one run: "python", "cli", each phase of ``child["spans"]``, "exit"; they sum to
    ``ended - launched``."""
    seconds = {"python": child["main_start"] - launched}
    spans = child["spans"]
    run_start = min((t0 for phase, t0, _ in spans if phase == "run"), default=child["main_end"])
    seconds["cli"] = run_start - child["main_start"]
    for phase, _, own in spans:
        seconds[phase] = seconds.get(phase, 0.0) + own
    timed = sum(own for _, _, own in spans)
    seconds["cli"] += child["main_end"] - run_start - timed  # vit's main around `train`: the summary printed
    seconds["exit"] = ended - child["main_end"]
    return seconds


def run_phases(index: int, arguments: list[str], scratch: Path, timeout_s: float) -> dict:
    """Round ``index`` of ``--phases``: one run of ``vit train arguments`` under -X importtime."""
    result = scratch / f"phases{index}.json"
    flags = ["--out", str(scratch / f"phases{index}"), "--compile-cache", "off"]
    code = f"import sys; from benchmarks.startup import phases_child as c; sys.exit(c({str(result)!r}, sys.argv[1:]))"
    record = {
        "schema": PHASES_SCHEMA,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": host(),
        "arguments": arguments,
        "round": index,
    }
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    }
    launched = time.time()
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *arguments, *flags],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
    ended = time.time()
    phases = phase_seconds(json.loads(result.read_text()), launched, ended) if result.is_file() else {}
    packages, phase_imports = import_times(p.stderr)
    record |= {
        "phases_s": phases,
        "imports_s": packages,
        "phase_imports_s": phase_imports,
        "wall_s": ended - launched,
        "exit_code": p.returncode,
    }
    assert set(record) == set(PHASES_FIELDS)
    if p.returncode != 0:
        tail = "\n".join(ln for ln in p.stderr.splitlines() if not ln.startswith(("import time:", MARK)))
        print(f"round {index}: exit {p.returncode}: {(p.stdout + tail)[-1500:]}", file=sys.stderr)
    return record


def phases_summary(records: list[dict]) -> list[str]:
    """Lines: each phase's and each package's median seconds over the finished runs, largest first."""
    ok = [r for r in records if r["exit_code"] == 0]
    if not ok:
        return []
    lines = [f"wall: median {statistics.median(r['wall_s'] for r in ok):.2f} s over {len(ok)} run(s)"]
    for key, title in (("phases_s", "phase"), ("imports_s", "imports")):
        names = {n for r in ok for n in r[key]}
        medians = {n: statistics.median(r[key].get(n, 0.0) for r in ok) for n in names}
        for name, s in sorted(medians.items(), key=lambda kv: -kv[1]):
            if s >= 0.05:
                imported = (
                    statistics.median(r["phase_imports_s"].get(name, 0.0) for r in ok) if key == "phases_s" else 0
                )
                lines.append(
                    f"{title} {name}: {s:.2f} s" + (f" ({imported:.2f} s importing)" if imported >= 0.05 else "")
                )
    return lines


def first_step(metrics: Path) -> tuple[float | None, str | None]:
    """(time_to_first_step_s, compile_cache) from the first line of a run's metrics.jsonl, (None, None)
    when the run wrote none."""
    if not metrics.is_file():
        return None, None
    for line in metrics.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if "time_to_first_step_s" in record:
            return record["time_to_first_step_s"], record["compile_cache"]
    return None, None


def run_round(index: int, arguments: list[str], scratch: Path, command: list[str], timeout_s: float) -> list[dict]:
    """The three runs (cold, warm, off) of round ``index`` under ``scratch``; a record each."""
    cache = scratch / f"cache{index}"
    records = []
    for kind in KINDS:
        run_dir = scratch / f"round{index}-{kind}"
        record = {
            "schema": SCHEMA,
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": host(),
            "arguments": arguments,
            "round": index,
            "cache": kind,
        }
        flags = ["--out", str(run_dir), "--compile-cache", "off" if kind == "off" else str(cache)]
        t0 = time.perf_counter()
        p = subprocess.run([*command, *arguments, *flags], capture_output=True, text=True, timeout=timeout_s)
        seconds, reported = first_step(run_dir / "metrics.jsonl")
        record |= {
            "compile_cache": reported,
            "time_to_first_step_s": seconds,
            "wall_s": time.perf_counter() - t0,
            "exit_code": p.returncode,
        }
        assert set(record) == set(RECORD_FIELDS)
        if p.returncode != 0:
            print(f"round {index} {kind}: exit {p.returncode}: {(p.stdout + p.stderr)[-1500:]}", file=sys.stderr)
        else:
            print(f"round {index} {kind}: first step after {seconds:.2f} s (cache {reported})", file=sys.stderr)
        records.append(record)
    shutil.rmtree(cache, ignore_errors=True)
    return records


def summary(records: list[dict]) -> list[str]:
    """Lines: each kind's median time to first step, then each round's warm / cold."""
    ok = [r for r in records if r["exit_code"] == 0 and r["time_to_first_step_s"] is not None]
    times = {k: [r["time_to_first_step_s"] for r in ok if r["cache"] == k] for k in KINDS}
    lines = [f"{k}: median {statistics.median(v):.2f} s over {len(v)} run(s)" for k, v in times.items() if v]
    by_round = {}
    for r in ok:
        by_round.setdefault(r["round"], {})[r["cache"]] = r["time_to_first_step_s"]
    ratios = [t["warm"] / t["cold"] for t in by_round.values() if {"warm", "cold"} <= set(t)]
    if ratios:
        each = ", ".join(f"{x:.2f}" for x in ratios)
        lines.append(f"warm / cold: {each} (median {statistics.median(ratios):.2f})")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.startup", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of (cold, warm, off)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    p.add_argument("--out", help="append one JSON line per run to this file")
    p.add_argument("--phases", action="store_true", help="one run per round, split into phases (cache off)")
    p.add_argument("train_args", nargs="*", help="after --: vit train's arguments (default: %(default)s)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds={args.rounds}: expected a positive int")
    if args.timeout <= 0:
        p.error(f"--timeout={args.timeout}: expected seconds > 0")
    bad = [a for a in args.train_args if a.split("=")[0] in ("--out", "--compile-cache")]
    if bad:
        p.error(f"{bad[0]}: the benchmark chooses vit train's --out and --compile-cache itself")
    return args


def vit_train() -> list[str]:
    """The command users type: the ``vit`` script beside this Python, else ``python -m vit_cli.main``."""
    script = shutil.which("vit", path=str(Path(sys.executable).parent))
    return [script, "train"] if script else [sys.executable, "-m", "vit_cli.main", "train"]


def main(argv=None, command: list[str] | None = None) -> int:
    """``command``: what runs ``vit train`` (default ``vit_train()``)."""
    args = parse_args(argv)
    arguments = [*(PHASES_ARGS if args.phases else DEFAULT_ARGS), *args.train_args]
    command = command or vit_train()
    records = []
    with tempfile.TemporaryDirectory(prefix="vit_startup_") as tmp:
        for index in range(args.rounds):
            if args.phases:
                batch = [run_phases(index, arguments, Path(tmp), args.timeout)]
            else:
                batch = run_round(index, arguments, Path(tmp), command, args.timeout)
            for record in batch:
                records.append(record)
                if args.out:
                    report.append_jsonl([record], args.out)
    print("\n".join(phases_summary(records) if args.phases else summary(records)))
    return 0 if all(r["exit_code"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
