"""Orbax folders vit wrote whose data file was changed, its size kept: zero-filled, a byte flipped, or another
model's data file of the same layout in its place. Orbax and tensorstore store no checksum, so each read back
as other values without a word (before: `vit convert` wrote them out, exit 0); every command that reads the
folder now checks each array against the CRC-32 vit_config.json recorded when vit wrote it, and refuses in one
line naming the folder and the array."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from vit_cli.main import main

from .harness import SMALL, ours, small_model, snapshot
from .test_orbax_reads import COMMANDS, _printing_hook, _settled_stderr


def _data_file(folder: Path) -> Path:
    """The folder's largest data file (the small model's arrays; the others are b-tree nodes)."""
    return max((folder / "state" / "ocdbt.process_0" / "d").iterdir(), key=lambda f: f.stat().st_size)


def _arrays(folder: Path) -> list[bytes]:
    """The bytes of every array of the folder's state, in the state's order."""
    from flax import nnx

    from vit_jax.formats import load_orbax

    return [np.asarray(v[...]).tobytes() for _, v in nnx.to_flat_state(nnx.state(load_orbax(folder)))]


def _data_zeroed(folder: Path, other: Path) -> None:
    f = _data_file(folder)
    f.write_bytes(bytes(f.stat().st_size))


def _data_byte_flipped(folder: Path, other: Path) -> None:
    f = _data_file(folder)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))


def _data_of_another_model(folder: Path, other: Path) -> None:
    """The data file as the same layout of ``other``'s arrays would be: each array whose bytes occur once in
    the file replaced by ``other``'s (a copy of another model's file, which orbax reads without an error)."""
    f = _data_file(folder)
    data, replaced = f.read_bytes(), 0
    for old, new in zip(_arrays(folder), _arrays(other), strict=True):
        if old != new and data.count(old) == 1:
            data, replaced = data.replace(old, new), replaced + 1
    assert replaced >= 2 * SMALL.depth, replaced  # the kernels at least
    f.write_bytes(data)


DAMAGES: dict[str, Callable[[Path, Path], None]] = {
    "zero-filled": _data_zeroed,
    "byte flipped": _data_byte_flipped,
    "another model's": _data_of_another_model,
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """The small model as an orbax folder vit wrote (copied and changed by each case)."""
    tmp = tmp_path_factory.mktemp("orbax")
    assert main(["convert", str(small_model(tmp)), str(tmp / "ob"), "--to", "orbax"]) == 0
    return tmp / "ob"


@pytest.fixture(scope="module")
def other_folder(tmp_path_factory) -> Path:
    """An orbax folder of another model of the small model's config (other seeded weights)."""
    from vit_common.state import random_state

    tmp = tmp_path_factory.mktemp("other")
    ours(tmp / "m.safetensors", SMALL.to_json(), random_state(SMALL, seed=1, scale=0.2))
    assert main(["convert", str(tmp / "m.safetensors"), str(tmp / "ob"), "--to", "orbax"]) == 0
    return tmp / "ob"


def _changed_copy(written: Path, other_folder: Path, tmp: Path, damage: str) -> Path:
    shutil.copytree(written, tmp / "ob")
    DAMAGES[damage](tmp / "ob", other_folder)
    return tmp / "ob"


def _refusal(ob: Path) -> str:
    """The message (a regex) naming the folder's state and an array."""
    return (
        f"{re.escape(str(ob))}/state: array [a-z_0-9.]+ does not match the checksum vit_config.json recorded "
        "when vit wrote it: the data files were changed or damaged"
    )


# each damage to two commands (`parity`, which starts torch, left to the full suite)
PAIRS = [
    ("info", "zero-filled"),
    ("convert", "byte flipped"),
    ("predict", "another model's"),
    ("evaluate", "zero-filled"),
    ("parity", "another model's"),
    ("train --init", "byte flipped"),
]


def _one_line_refusal(command: str, ob, tmp_path, capsys, caplog) -> str:
    """Run ``command`` on the folder ``ob``: exit 2, stderr exactly one line (returned), no traceback,
    nothing written under ``tmp_path``."""
    argv = COMMANDS[command](str(ob), tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    err = _settled_stderr(capsys, caplog)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert snapshot(tmp_path) == before
    return lines[0]


@pytest.mark.parametrize(
    ("command", "damage"),
    [pytest.param(c, d, id=f"{c}-{d}", marks=pytest.mark.slow if c == "parity" else ()) for c, d in PAIRS],
)
def test_a_changed_data_file_is_one_line(command, damage, written, other_folder, tmp_path, capsys, caplog, monkeypatch):
    """Exit 2, stderr exactly one line naming the folder's state and an array, no traceback, nothing written."""
    monkeypatch.chdir(tmp_path)
    _printing_hook(monkeypatch)
    ob = _changed_copy(written, other_folder, tmp_path, damage)
    line = _one_line_refusal(command, ob, tmp_path, capsys, caplog)
    assert re.fullmatch(f"vit {command.split()[0]}: error: " + _refusal(ob), line), line


def test_load_model_of_another_models_data_file_raises_and_prints_nothing(
    written, other_folder, tmp_path, capsys, caplog, monkeypatch
):
    """The Python API: FormatError naming the folder's state and the array, nothing on stderr."""
    import vit_jax
    from vit_common.checkpoints.formats.errors import FormatError

    _printing_hook(monkeypatch)
    ob = _changed_copy(written, other_folder, tmp_path, "another model's")
    before = snapshot(tmp_path)
    with pytest.raises(FormatError, match=f"^{_refusal(ob)}$"):
        vit_jax.load_model(ob)
    assert _settled_stderr(capsys, caplog) == ""
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("command", "field", "value"), [("info", "crc32", -1), ("convert", "dtype", "object")], ids=["crc32", "dtype"]
)
def test_a_malformed_checksum_entry_is_one_line_naming_it(
    command, field, value, written, tmp_path, capsys, caplog, monkeypatch
):
    """An entry of vit_config.json's state_crc32 of a value no array has (before: refused as damaged data
    files): exit 2, one line naming the JSON file's entry as malformed, nothing written."""
    import json

    monkeypatch.chdir(tmp_path)
    _printing_hook(monkeypatch)
    ob = tmp_path / "ob"
    shutil.copytree(written, ob)
    config = json.loads((ob / "vit_config.json").read_text())
    path = next(iter(config["state_crc32"]))
    config["state_crc32"][path][field] = value
    (ob / "vit_config.json").write_text(json.dumps(config))
    line = _one_line_refusal(command, ob, tmp_path, capsys, caplog)
    want = f"vit {command}: error: {ob}/state: vit_config.json's state_crc32 entry is malformed: {path} has {field} "
    assert line.startswith(want), line
