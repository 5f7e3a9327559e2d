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
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.harness import host
from vit_common.system import in_place

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
    arguments = [*DEFAULT_ARGS, *args.train_args]
    command = command or vit_train()
    records = []
    with tempfile.TemporaryDirectory(prefix="vit_startup_") as tmp:
        for index in range(args.rounds):
            for record in run_round(index, arguments, Path(tmp), command, args.timeout):
                records.append(record)
                if args.out:
                    with in_place.open_log(args.out) as f:
                        f.write(json.dumps(record) + "\n")
    print("\n".join(summary(records)))
    return 0 if all(r["exit_code"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
