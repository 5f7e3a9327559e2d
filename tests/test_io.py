"""vit_common.io: the one module that writes files (atomic writes, JSON); nothing else writes on its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vit_common import io

ROOT = Path(__file__).resolve().parents[1]
# Ways to write a file (or rename one into place) without going through vit_common.io. Writing to the
# temporary path an io.atomic_write callback receives ("tmp") is going through it.
WRITES = re.compile(
    r"os\.replace\(|os\.rename\(|mkstemp\(|\.write_text\(|\.write_bytes\(|json\.dump\(|"
    r"open\((?!tmp\b)[^)]*[\"'](?:w|a|wb|ab|x)[\"']"
)


def test_no_module_writes_files_except_through_io():
    offenders = []
    for package in ("vit_common", "vit_jax", "vit_torch", "vit_cli", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "vit_common" / "io.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if WRITES.search(code) and "io.write_text(" not in code and "report.write_text(" not in code:
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_json_round_trip_and_errors_name_the_path(tmp_path):
    io.write_json(tmp_path / "sub" / "a.json", {"b": [1, 2]})
    assert (tmp_path / "sub" / "a.json").read_text() == '{\n  "b": [\n    1,\n    2\n  ]\n}\n'
    assert io.read_json(tmp_path / "sub" / "a.json") == {"b": [1, 2]}
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match="bad.json: not readable JSON"):
        io.read_json(tmp_path / "bad.json")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    io.write_text(tmp_path / "f.txt", "old")

    def fail(tmp: str) -> None:
        Path(tmp).write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        io.atomic_write(tmp_path / "f.txt", fail)
    with pytest.raises(OSError, match="disk full"):
        io.atomic_write_dir(tmp_path / "d", lambda tmp: fail(str(tmp / "x")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"] and (tmp_path / "f.txt").read_text() == "old"


def test_log_appends_lines(tmp_path):
    for line in ("a", "b"):
        with io.open_log(tmp_path / "logs" / "m.jsonl") as log:
            log.write(line + "\n")
    assert (tmp_path / "logs" / "m.jsonl").read_text() == "a\nb\n"
