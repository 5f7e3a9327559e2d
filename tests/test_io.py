"""vit_common.system.io: the one module that writes files (atomic writes, JSON), with vit_common.system.in_place
for the two written in place (a folder's lock, a metrics log); nothing else writes on its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vit_common.system import in_place, io

ROOT = Path(__file__).resolve().parents[1]
# Ways to write a file (or rename one into place) without going through vit_common.system.io. Writing to the
# temporary path an io.atomic_write callback receives ("tmp") is going through it.
WRITES = re.compile(
    r"os\.replace\(|os\.rename\(|mkstemp\(|\.write_text\(|\.write_bytes\(|json\.dump\(|"
    r"open\((?!tmp\b)[^)]*[\"'](?:w|a|wb|ab|x)[\"']"
)


def test_no_module_writes_files_except_through_io():
    offenders = []
    for package in ("vit_common", "vit_jax", "vit_torch", "vit_cli", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() in (
                "vit_common/system/io.py",
                "vit_common/system/in_place.py",
                "vit_common/system/tensor_files.py",  # writes only into the temporary files io opens for it
            ):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if WRITES.search(code) and "io.write_text(" not in code and "report.write_text(" not in code:
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_json_round_trip_and_errors_name_the_path(tmp_path):
    io.write_json(tmp_path / "sub" / "a.json", {"b": [1, 2]}, mark=False)
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

    with io.overwriting(), pytest.raises(OSError, match="disk full"):
        io.atomic_write(tmp_path / "f.txt", fail)
    with pytest.raises(OSError, match="disk full"):
        io.atomic_write_dir(tmp_path / "d", lambda tmp: fail(str(tmp / "x")))
    with pytest.raises(OSError, match="disk full"):  # the folders made for it go too
        io.atomic_write(tmp_path / "a" / "b" / "f.txt", fail)
    (tmp_path / "kept").mkdir()
    with pytest.raises(OSError, match="disk full"):  # those that were there stay
        io.atomic_write_dir(tmp_path / "kept" / "c" / "d", lambda tmp: fail(str(tmp / "x")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt", "kept"] and (tmp_path / "f.txt").read_text() == "old"
    assert not any((tmp_path / "kept").iterdir())


def test_a_write_from_a_mapped_input_that_shrank_says_so(tmp_path):
    """``write()`` from a memory-mapped view whose file another process truncated fails with EFAULT (the
    kernel's "Bad address"): the line names the input's shrinking as the cause, not the destination."""
    import errno

    def fault(tmp: str) -> None:
        raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))

    want = r"^\S+f\.bin: could not be written \(Bad address: an input read memory-mapped shrank while it was read\); "
    with pytest.raises(OSError, match=want + "nothing was written$"):
        io.atomic_write(tmp_path / "f.bin", fault)
    assert not any(tmp_path.iterdir())


def test_log_appends_lines(tmp_path):
    for line in ("a", "b"):
        with in_place.open_log(tmp_path / "logs" / "m.jsonl") as log:
            log.write(line + "\n")
    assert (tmp_path / "logs" / "m.jsonl").read_text() == "a\nb\n"


def test_only_what_is_provably_ours_is_replaced(tmp_path, monkeypatch):
    (tmp_path / "theirs.txt").write_text("theirs")
    with pytest.raises(
        io.DestinationError, match="theirs.txt: exists and vit cannot tell it wrote it; pass --overwrite"
    ):
        io.write_text(tmp_path / "theirs.txt", "ours")
    with io.overwriting():
        io.write_text(tmp_path / "theirs.txt", "ours")
    assert (tmp_path / "theirs.txt").read_text() == "ours"
    out = tmp_path / "out"
    io.write_text(out / "a.txt", "1")
    io.write_text(out / "a.txt", "2")  # this process wrote it, unchanged since: replaced
    assert (out / "a.txt").read_text() == "2" and sorted(p.name for p in out.iterdir()) == ["a.txt"]
    with open(out / "a.txt", "a") as fh:  # the user edits it: theirs now
        fh.write("mine")
    with pytest.raises(io.DestinationError, match="a.txt: exists and vit cannot tell it wrote it"):
        io.write_text(out / "a.txt", "3")
    with io.overwriting(), pytest.raises(io.DestinationError, match="out: a folder holding things vit did not"):
        io.atomic_write_dir(out, lambda tmp: None)  # an output folder is not a checkpoint to replace
    monkeypatch.setattr(io, "_WRITTEN", {})  # a later command: only a file's own content proves it ours
    io.write_text(out / "b.txt", "text has no place for a mark")
    io.write_json(out / "c.json", {"x": 1})
    monkeypatch.setattr(io, "_WRITTEN", {})
    with pytest.raises(io.DestinationError, match="b.txt: exists and vit cannot tell it wrote it"):
        io.write_text(out / "b.txt", "again")
    assert io.read_json(out / "c.json") == {"x": 1, io.OWNER_KEY: io.OWNER}
    io.write_json(out / "c.json", {"x": 2})
    (out / "d.json").write_text('{"x": 1}')  # JSON without our key
    with pytest.raises(io.DestinationError, match="d.json"):
        io.write_json(out / "d.json", {"x": 2})


def test_pngs_and_folders_prove_themselves_ours(tmp_path, monkeypatch):
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text(io.OWNER_KEY, io.OWNER)
    Image.new("RGB", (2, 2)).save(tmp_path / "ours.png", pnginfo=info)
    Image.new("RGB", (2, 2)).save(tmp_path / "theirs.png")
    io.write_bytes(tmp_path / "ours.png", (tmp_path / "theirs.png").read_bytes())
    with pytest.raises(io.DestinationError, match="theirs.png"):
        io.write_bytes(tmp_path / "theirs.png", b"x")

    def checkpoint(extra: str = "") -> None:
        def write(tmp: Path) -> None:
            io.write_json(tmp / "config.json", io.folder_mark({"a": 1}, ["config.json", "w.bin"]))
            io.write_bytes(tmp / "w.bin", b"w")
            if extra:
                io.write_bytes(tmp / extra, b"not listed")

        io.atomic_write_dir(tmp_path / "ckpt", write)

    checkpoint()
    monkeypatch.setattr(io, "_WRITTEN", {})
    checkpoint()  # its config.json lists all it holds: replaced
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "w.bin"]
    (tmp_path / "ckpt" / "notes.txt").write_text("mine")
    with pytest.raises(io.DestinationError, match="ckpt: a folder holding things vit did not write .*notes.txt"):
        checkpoint()
    with pytest.raises(AssertionError, match="did not list what it wrote"):
        io.atomic_write_dir(tmp_path / "other", lambda tmp: checkpoint_file(tmp))
    assert not (tmp_path / "other").exists()


def checkpoint_file(tmp: Path) -> None:
    io.write_bytes(tmp / "w.bin", b"w")  # a folder writer that lists nothing


def test_our_safetensors_are_recognised_by_their_header(tmp_path):
    from safetensors.numpy import save_file

    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "ours.safetensors"), {"format": "vit-twins/x"})
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "hub.safetensors"), {"format": "pt"})
    io.save_safetensors(tmp_path / "ours.safetensors", {"w": np.zeros(2, np.float32)}, {"format": "vit-twins/x"})
    with pytest.raises(io.DestinationError, match="hub.safetensors"):
        io.save_safetensors(tmp_path / "hub.safetensors", {"w": np.zeros(2, np.float32)}, {"format": "pt"})


def test_the_next_write_removes_temporaries_of_dead_writers_only(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"{io.TMP_PREFIX}{int(dead.stdout)}-m.safetensors-x.tmp"
    stale.write_bytes(b"half a model")
    (tmp_path / f"{io.TMP_PREFIX}{int(dead.stdout)}-hf-y.tmp").mkdir()
    live = tmp_path / f"{io.TMP_PREFIX}{os.getppid()}-n.safetensors-z.tmp"  # a running process's
    live.write_bytes(b"in progress")
    io.write_text(tmp_path / "new.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "new.txt"])


def test_a_folder_lock_is_refused_at_once_naming_the_holder_and_released_by_kill_9(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from vit_common.system import in_place\n"
            "with in_place.folder_lock(sys.argv[1], 'vit train'):\n    print('held', flush=True); time.sleep(600)",
            str(tmp_path / "run"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(io.DestinationError, match=rf"run: in use by another vit train \(pid {holder.pid}\)"):
        with in_place.folder_lock(tmp_path / "run", "vit train"):
            pass
    holder.kill()
    holder.wait()
    with in_place.folder_lock(tmp_path / "run", "vit train"):
        assert (tmp_path / "run" / io.LOCK).read_text() == f"{os.getpid()}\n"
    assert not (tmp_path / "run" / io.LOCK).exists()  # released: nothing left behind
    with in_place.folder_lock(tmp_path / "new" / "runs" / "run", "vit train"):
        pass
    assert not (tmp_path / "new").exists()  # the folders the lock made, left empty, go too
    with in_place.folder_lock(tmp_path / "run" / "a" / "b", "vit train"):
        (tmp_path / "run" / "a" / "notes.txt").write_text("kept\n")
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == ["a", "notes.txt"]  # one not empty stays


def test_a_lock_or_log_is_never_opened_through_a_link_nor_a_fifo(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (tmp_path / "run").mkdir()
    os.symlink(victim, tmp_path / "run" / io.LOCK)
    with pytest.raises(io.DestinationError, match=r"run/\.vit-lock: a symbolic link"):
        with in_place.folder_lock(tmp_path / "run", "vit train"):
            pass
    os.symlink(victim, tmp_path / "run" / "metrics.jsonl")
    with pytest.raises(io.DestinationError, match=r"run/metrics.jsonl: a symbolic link"):
        in_place.Log(tmp_path / "run" / "metrics.jsonl")
    assert victim.read_text() == "mine\n"
    (tmp_path / "fifo-run").mkdir()
    os.mkfifo(tmp_path / "fifo-run" / io.LOCK)
    with pytest.raises(io.DestinationError, match=r"fifo-run/\.vit-lock: not a regular file"):  # not a hang
        with in_place.folder_lock(tmp_path / "fifo-run", "vit train"):
            pass


def test_a_lock_file_put_in_place_of_ours_is_not_removed(tmp_path):
    with in_place.folder_lock(tmp_path / "run", "vit train"):
        os.unlink(tmp_path / "run" / io.LOCK)
        (tmp_path / "run" / io.LOCK).write_text("another's\n")
    assert (tmp_path / "run" / io.LOCK).read_text() == "another's\n"


def test_an_output_that_is_inside_or_holds_an_input_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "m.safetensors").write_bytes(b"x")
    os.symlink(tmp_path / "run", tmp_path / "alias")
    for out, inp, how in [
        ("run/m.safetensors", "alias/m.safetensors", "is"),
        ("run/m.safetensors/x", "run/m.safetensors", "lies inside"),
        ("alias", "run/m.safetensors", "holds"),
    ]:
        with pytest.raises(ValueError, match=f"{out}: the output {how} --init {tmp_path / inp};"):
            io.check_apart(tmp_path / out, {"--init": tmp_path / inp})
    io.check_apart(tmp_path / "run2", {"--init": tmp_path / "run" / "m.safetensors", "--dataset": None})


def test_a_shared_file_is_a_hard_link_or_else_a_relative_symbolic_link(tmp_path, monkeypatch):
    import errno

    src = tmp_path / "model.safetensors"
    src.write_bytes(b"tensors")
    assert io.share_file(src, tmp_path / "model_timm.safetensors") == "hard link"
    assert os.path.samefile(src, tmp_path / "model_timm.safetensors")

    def no_hard_links(a, b):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_hard_links)
    (tmp_path / "tmp_folder").mkdir()
    final = tmp_path / "model_timm" / "model.safetensors"
    assert io.share_file(src, tmp_path / "tmp_folder" / "model.safetensors", final=final) == "symbolic link"
    assert os.readlink(tmp_path / "tmp_folder" / "model.safetensors") == "../model.safetensors"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(io.TMP_PREFIX)] == []
