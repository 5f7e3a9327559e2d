"""Damaged orbax folders to every command that reads one: `vit info`, `convert`, `predict`, `evaluate`,
`parity`, `train --init`, `vit_jax.load_model` (a model folder vit wrote) and `train --resume` (a run's
checkpoints). A read of a damaged folder fails inside tensorstore at its first error, which closes orbax's
asyncio loop while tensorstore's threads go on with the reads under way; their done-callbacks then raise
"Event loop is closed", reported through ``sys.unraisablehook`` as a traceback each, some after vit's error
(before: 1 to 31 tracebacks in a third of the reads that got that far, as measured), and asyncio's "Task
exception was never retrieved". Each read is refused in one line naming the folder and what is wrong, and
nothing else: the hook is the one that prints, as in a plain ``vit``."""

from __future__ import annotations

import gc
import json
import logging
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from vit_cli.main import main

from .harness import TRAIN, child_env, npz_dataset, small_model, snapshot, write_png
from .test_train import _finished_run


def _truncated(state: Path) -> None:
    """Every data and b-tree file cut to half its bytes (a disk that filled, a copy cut short)."""
    for f in [*(state / "d").iterdir(), *(state / "ocdbt.process_0" / "d").iterdir()]:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _zero_filled(state: Path) -> None:
    """The root b-tree file(s) of zeros, their size kept."""
    for f in (state / "d").iterdir():
        f.write_bytes(bytes(f.stat().st_size))


def _manifest_deleted(state: Path) -> None:
    (state / "manifest.ocdbt").unlink()


def _metadata_garbled(state: Path) -> None:
    (state / "_METADATA").write_bytes(b"\x07not json" * 50)


def _sub_folder_missing(state: Path) -> None:
    shutil.rmtree(state / "ocdbt.process_0")


# damage -> what the line says is wrong (a regex)
DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "data truncated": (_truncated, r"Requested byte range .* is not valid for value of size"),
    "b-tree zero-filled": (_zero_filled, r"Error decoding b-tree node"),
    "manifest deleted": (_manifest_deleted, r"does not exist"),
    "_METADATA garbled": (_metadata_garbled, r"a metadata file of orbax's is not JSON"),
    "sub-folder missing": (_sub_folder_missing, r"Not enough data"),
}

DATA_DAMAGES = {"data truncated", "b-tree zero-filled"}  # named as damaged data files, tensorstore's reason after


def _refused_as(ob: Path, damage: str) -> str:
    """The start of the refusal (a regex) of folder ``ob`` with ``damage``: damaged data files, or what orbax
    could not restore."""
    if damage in DATA_DAMAGES:
        return f"{re.escape(str(ob))}: the data files were changed or damaged \\(tensorstore: "
    return f"{re.escape(str(ob))}: orbax could not restore the state for the stored config \\("


COMMANDS = {
    "info": lambda ob, tmp: ["info", ob],
    "convert": lambda ob, tmp: ["convert", ob, str(tmp / "out.safetensors")],
    "predict": lambda ob, tmp: ["predict", ob, str(write_png(tmp / "img.png"))],
    "evaluate": lambda ob, tmp: ["evaluate", ob, "--dataset", f"npz:{npz_dataset(tmp / 'd.npz', [0, 1], [0, 1])}"],
    "parity": lambda ob, tmp: ["parity", ob],
    "train --init": lambda ob, tmp: [
        *TRAIN[:1],
        *TRAIN[-4:],
        *["--init", ob, "--dataset", f"npz:{npz_dataset(tmp / 'd.npz', [0, 1] * 4)}", "--out", str(tmp / "run")],
        *["--batch-size", "4"],
    ],
}


@pytest.fixture(scope="module")
def orbax_folder(tmp_path_factory) -> Path:
    """The small model as an orbax folder vit wrote (copied and damaged by each case)."""
    tmp = tmp_path_factory.mktemp("orbax")
    assert main(["convert", str(small_model(tmp)), str(tmp / "ob"), "--to", "orbax"]) == 0
    return tmp / "ob"


def _damaged(orbax_folder: Path, tmp: Path, damage: str) -> Path:
    shutil.copytree(orbax_folder, tmp / "ob")
    DAMAGES[damage][0](tmp / "ob" / "state")
    return tmp / "ob"


def _settled_stderr(capsys, caplog) -> str:
    """stderr once the late callbacks of a failed read have run (they follow the error by milliseconds),
    orbax's logged errors included (asyncio's "Task exception was never retrieved": pytest captures logs)."""
    time.sleep(0.2)
    gc.collect()
    logged = "".join(f"{r.levelname}:{r.name}:{r.getMessage()}\n" for r in caplog.records if r.levelno >= logging.ERROR)
    caplog.clear()
    return capsys.readouterr().err + logged


def _printing_hook(monkeypatch) -> None:
    """Unraisable errors printed on stderr as Python prints them (pytest's own hook collects them instead)."""
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)


# every damage to `vit info`, two to each other command but `train --init` (whose refusal costs more)
PAIRS = [
    *[("info", damage) for damage in DAMAGES],
    *[("convert", "data truncated"), ("convert", "sub-folder missing")],
    *[("predict", "b-tree zero-filled"), ("predict", "manifest deleted")],
    *[("evaluate", "data truncated"), ("evaluate", "_METADATA garbled")],
    *[("parity", "b-tree zero-filled"), ("parity", "sub-folder missing")],
    ("train --init", "manifest deleted"),
]


@pytest.mark.parametrize(("command", "damage"), PAIRS, ids=[f"{c}-{d}" for c, d in PAIRS])
def test_a_damaged_orbax_folder_is_one_line(command, damage, orbax_folder, tmp_path, capsys, caplog, monkeypatch):
    """Read twice in one process (the callbacks race the error): exit 2 each time, stderr exactly one line
    naming the folder and what is wrong, no traceback, nothing written."""
    monkeypatch.chdir(tmp_path)
    _printing_hook(monkeypatch)
    ob = _damaged(orbax_folder, tmp_path, damage)
    argv = COMMANDS[command](str(ob), tmp_path)
    before = snapshot(tmp_path)
    prefix = f"vit {command.split()[0]}: error: " + _refused_as(ob, damage)
    for _ in range(2):
        capsys.readouterr()
        assert main(argv) == 2
        err = _settled_stderr(capsys, caplog)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in err and "Event loop is closed" not in err, err
        assert re.match(prefix + ".*" + DAMAGES[damage][1], lines[0]) and "tensorstore_spec" not in err, lines[0]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("damage", ["data truncated", "_METADATA garbled", "sub-folder missing"])
def test_load_model_of_a_damaged_orbax_folder_raises_and_prints_nothing(
    damage, orbax_folder, tmp_path, capsys, caplog, monkeypatch
):
    """The Python API: FormatError naming the folder and what is wrong, and nothing on stderr."""
    import vit_jax
    from vit_common.checkpoints.formats.errors import FormatError

    _printing_hook(monkeypatch)
    ob = _damaged(orbax_folder, tmp_path, damage)
    before = snapshot(tmp_path)
    for _ in range(2):
        with pytest.raises(FormatError, match=f"^{_refused_as(ob, damage)}.*{DAMAGES[damage][1]}"):
            vit_jax.load_model(ob)
        assert _settled_stderr(capsys, caplog) == ""
    assert snapshot(tmp_path) == before


def test_resume_from_damaged_checkpoints_is_one_line(tmp_path, capsys, caplog, monkeypatch):
    """A finished run whose every checkpoint's files were cut to half, resumed: after the run's start line (and its
    settings' warnings), a warning for each checkpoint but the earliest, then one error line naming the
    checkpoints folder, the earliest step and what is wrong; no traceback, nothing written."""
    monkeypatch.chdir(tmp_path)
    _printing_hook(monkeypatch)
    done = _finished_run(tmp_path.parent, npz_dataset(tmp_path / "d.npz", [0, 1] * 4))
    shutil.copytree(done, tmp_path / "run", symlinks=True)
    steps = sorted((tmp_path / "run" / "checkpoints").iterdir(), key=lambda p: int(p.name))
    for step in steps:
        _truncated(step / "state")
    dataset = json.loads((done / "config.json").read_text())["train"]["dataset"]  # the run's own data
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main([*TRAIN, "--dataset", dataset, "--out", str(tmp_path / "run"), "--resume"]) == 2
    err = _settled_stderr(capsys, caplog)
    assert "Traceback" not in err and "Event loop is closed" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    *warnings, error = [ln for ln in lines if "restore" in ln]
    assert error == lines[-1] and len(warnings) == len(steps) - 1, err
    assert all(w.startswith("vit train: warning: ") and "does not restore (" in w for w in warnings), err
    others = [ln for ln in lines if "restore" not in ln]  # the run's start line and its settings' warnings
    assert any(ln.startswith(f"vit train: {dataset}: ") for ln in others), err
    assert all(ln.startswith("vit train: ") and "error" not in ln for ln in others), err
    folder = tmp_path / "run" / "checkpoints"
    expected = f"vit train: error: {folder}: no checkpoint restores; {folder}/{steps[0].name}: does not restore \\("
    assert re.match(expected + ".*" + DAMAGES["data truncated"][1], error) and "tensorstore_spec" not in error, error
    assert snapshot(tmp_path) == before


def test_late_callbacks_print_nothing_in_a_vit_process(orbax_folder, tmp_path):
    """A child process reads three damaged folders twice each and exits: all it writes on fd 2, up to its
    end (callbacks after the error and at exit included), is its error lines."""
    damages = ["data truncated", "b-tree zero-filled", "sub-folder missing"]
    folders = [str(_damaged(orbax_folder, tmp_path / damage.replace(" ", "_"), damage)) for damage in damages]
    code = "import sys\nfrom vit_cli.main import main\nsys.exit(max(main(['info', f]) for f in sys.argv[1:]))"
    child = subprocess.run(
        [sys.executable, "-c", code, *folders * 2], capture_output=True, text=True, env=child_env(), timeout=300
    )
    lines = child.stderr.splitlines()
    assert child.returncode == 2 and len(lines) == 2 * len(folders), child.stderr
    assert all(ln.startswith("vit info: error: ") for ln in lines), child.stderr
