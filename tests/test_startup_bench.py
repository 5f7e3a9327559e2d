"""The start-up benchmark runs cold, warm and off per round on a new cache folder, and records every field."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import startup

# Stands in for `vit train`: its first metrics line says 'warm' when the cache folder holds a program.
FAKE_TRAIN = """
import json, pathlib, sys
args = sys.argv[1:]
out, cache = pathlib.Path(args[args.index("--out") + 1]), args[args.index("--compile-cache") + 1]
kind = "off" if cache == "off" else "warm" if (pathlib.Path(cache) / "program").exists() else "cold"
if cache != "off":
    pathlib.Path(cache).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(cache) / "program").write_text("compiled")
out.mkdir(parents=True)
line = {"step": 1, "time_to_first_step_s": {"cold": 9.0, "warm": 3.0, "off": 8.0}[kind], "compile_cache": kind}
(out / "metrics.jsonl").write_text(json.dumps(line) + "\\n")
"""


@pytest.mark.slow
def test_rounds_run_cold_warm_off_on_a_new_cache_each(tmp_path, capsys):
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    out = tmp_path / "startup.jsonl"
    args = ["--rounds", "2", "--out", str(out), "--", "--depth", "1"]
    assert startup.main(args, command=[sys.executable, str(script)]) == 0
    records = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert all(set(r) == set(startup.RECORD_FIELDS) for r in records)
    assert [(r["round"], r["cache"], r["compile_cache"]) for r in records] == [
        (0, "cold", "cold"), (0, "warm", "warm"), (0, "off", "off"),
        (1, "cold", "cold"), (1, "warm", "warm"), (1, "off", "off"),
    ]  # fmt: skip
    assert [r["time_to_first_step_s"] for r in records] == [9.0, 3.0, 8.0, 9.0, 3.0, 8.0]
    assert records[0]["arguments"] == [*startup.DEFAULT_ARGS, "--depth", "1"]
    printed = capsys.readouterr().out
    assert "warm: median 3.00 s over 2 run(s)" in printed and "warm / cold: 0.33, 0.33 (median 0.33)" in printed


def test_a_failed_run_is_reported_and_fails_the_benchmark(tmp_path, capsys):
    script = tmp_path / "fails.py"
    script.write_text("import sys; print('vit train: error: no such dataset'); sys.exit(2)")
    assert startup.main(["--rounds", "1"], command=[sys.executable, str(script)]) == 1
    assert "exit 2: vit train: error: no such dataset" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--out", "--compile-cache", "--out=x", "--compile-cache=off"])
def test_the_benchmark_keeps_its_own_folders(flag, capsys):
    with pytest.raises(SystemExit) as e:
        startup.parse_args(["--", flag, "x"])
    assert e.value.code == 2 and "chooses vit train's --out and --compile-cache" in capsys.readouterr().err


def test_phases_sum_to_the_wall_time_and_imports_go_to_the_open_phase():
    """--phases: each call's own time (less the timed calls inside it) goes to its phase, the rest to
    python, cli and exit; -X importtime's self times go to their package and to the innermost open phase."""
    child = {
        "main_start": 100.5,
        "main_end": 110.0,
        "spans": [["dataset", 102.0, 1.0], ["first compilation", 104.0, 3.0], ["run", 101.0, 5.0]],
    }
    phases = startup.phase_seconds(child, 100.0, 111.5)
    assert phases == {"python": 0.5, "cli": 0.5, "dataset": 1.0, "first compilation": 3.0, "run": 5.0, "exit": 1.5}
    stderr = "\n".join(
        [
            "import time: self [us] | cumulative | imported package",
            "import time:     10000 |      10000 | encodings",
            f"{startup.MARK}+cli",
            "import time:    200000 |     200000 | jax",
            f"{startup.MARK}+run",
            "import time:    100000 |     300000 |   torch.nn",
            f"{startup.MARK}+dataset",
            "import time:     50000 |      50000 | torch",
            f"{startup.MARK}-",
            "vit train: a line of the run",
            f"{startup.MARK}-",
        ]
    )
    packages, phases = startup.import_times(stderr)
    assert packages == {"jax": 0.2, "torch": 0.15, "encodings": 0.01}
    assert phases == {"python": 0.01, "cli": 0.2, "run": 0.1, "dataset": 0.05}
