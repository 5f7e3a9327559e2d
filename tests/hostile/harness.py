"""What the hostile-input tests share: the small model and files the inputs are built from, ``Case`` (one
hostile input: a builder and what its error line names), ``check_case`` (run ``vit`` on a case, in this
process or in a child under a time limit and a peak-memory bound, and check the exit code, the one error
line naming the input, no traceback and no file changed or left behind), ``params`` (the cases as
parametrize values, some marked slow), ``snapshot`` (a folder's entries and their sha256, before and after)
and ``fill_disk``. Each builder makes its inputs in the folder it is given and returns the command's
arguments."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from vit_cli.main import main
from vit_common.checkpoints.formats.canonical import FORMAT_TAG
from vit_common.config import ViTConfig
from vit_common.state import random_state

ROOT = Path(__file__).resolve().parents[2]
# The root conftest's SMALL (the small_cfg fixture) written out: the builders are plain functions named in the
# parametrize lists, which fixtures do not reach; the inputs (32-px PNGs, 10-class heads) are sized to it.
SMALL = ViTConfig(image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)
PEAK_MB = 1500  # a refused input costs what starting the command costs, not what the input declares
TIME_LIMIT = 240  # seconds a child may take before it counts as a hang


def ours(path: Path, cfg_json: str, state: dict | None = None) -> Path:
    """Our safetensors layout with any stored config text (the test writes it, lying or not)."""
    save_file(
        state if state is not None else random_state(SMALL, scale=0.2),
        str(path),
        {"format": FORMAT_TAG, "vit_config": cfg_json},
    )
    return path


def small_model(tmp: Path) -> Path:
    """The small model (``SMALL``, seeded weights) in our layout at ``tmp/m.safetensors``."""
    return ours(tmp / "m.safetensors", SMALL.to_json())


def write_png(path: Path, size: tuple[int, int] = (32, 32)) -> Path:
    """A uniform grey RGB PNG of (W, H) = ``size``."""
    from PIL import Image

    Image.fromarray(np.full((*size[::-1], 3), 128, np.uint8)).save(path)
    return path


def bomb_png(path: Path, side: int = 20000) -> Path:
    """A PNG header declaring side x side pixels (what Pillow checks at open), with one empty row."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    ihdr = side.to_bytes(4, "big") * 2 + bytes([8, 0, 0, 0, 0])
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")
    )
    return path


def bare_timm(tmp: Path) -> Path:
    """A timm-style .safetensors: tensors only, so GELU, eps, pooling... are assumed when read."""
    save_file(random_state(SMALL, scale=0.2), str(tmp / "bare.safetensors"))
    return tmp / "bare.safetensors"


TINY_TRAIN = "--image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4 --epochs 1"
TRAIN = ["train", *TINY_TRAIN.split(), "--no-progress", "--no-parity", "--compile-cache", "off"]


def cached(base: Path) -> list[str]:
    """The flags of the session's compilation cache (``base``: the session's temporary folder), for the
    runs that train: the same tiny step is compiled once a session, not once a run."""
    return ["--compile-cache", str(base / "xla-cache")]


def npz_dataset(path: Path, y, y_test=None) -> Path:
    """An npz dataset of seeded 8x8 uint8 images labelled ``y`` (and a test split labelled ``y_test``)."""
    rng = np.random.default_rng(0)
    arrays = {"x": rng.integers(0, 256, (len(y), 8, 8), np.uint8), "y": np.asarray(y)}
    if y_test is not None:
        arrays |= {"x_test": rng.integers(0, 256, (len(y_test), 8, 8), np.uint8), "y_test": np.asarray(y_test)}
    np.savez(path, **arrays)
    return path


def flag(*argv: str) -> Callable[[Path], list[str]]:
    """A builder of ``argv`` as given, ``MODEL`` replaced by the small model's path; its id is the argv."""

    def build(tmp: Path) -> list[str]:
        return [a.replace("MODEL", str(small_model(tmp))) for a in argv]

    build.__name__ = " ".join(argv)
    return build


HOLDERS: list[subprocess.Popen] = []  # processes a case started, ended when the case ends


@dataclass
class Case:
    """One hostile input: ``build(tmp)`` makes it and returns the argv; the error line must contain
    ``names`` (a regex; ``{tmp}`` is the case's folder). ``child``: run in a child process (time limit,
    peak memory). ``code`` 0 or 1: not an error, ``check(tmp, output)`` says what is right."""

    build: Callable[[Path], list[str]]
    names: str
    code: int = 2
    child: bool = False
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[Path, str], None] | None = None
    creates: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.build.__name__


def params(cases: list[Case], slow: set[str]) -> list:
    """``cases`` as parametrize values named by their ids, those whose id is in ``slow`` marked slow (left to
    the full suite: docs/contributors.md)."""
    return [pytest.param(c, id=c.id, marks=pytest.mark.slow if c.id in slow else ()) for c in cases]


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (not following links): a file's sha256, or its kind."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink() or not p.is_file():
                out[rel] = "link" if p.is_symlink() else "dir" if p.is_dir() else "special"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def child_env() -> dict[str, str]:
    """The environment of a child process running ``vit``: this checkout's code first on the path."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


# The child's own peak: Linux's VmHWM (this process image's high-water mark). ru_maxrss is not used where
# VmHWM exists: Linux carries it over from the process that started the child (the pytest worker, a GB
# or more after other tests) across exec.
_CHILD = """
import os, resource, sys
from vit_cli.main import main
try:
    rc = main(sys.argv[2:])
finally:
    if os.path.exists("/proc/self/status"):
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) // 1024
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    with open(sys.argv[1], "w") as fh:
        fh.write(str(peak))
sys.exit(rc)
"""


def _run(case: Case, tmp: Path, argv: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the command, checked for hangs and peak memory in a child."""
    if not case.child:
        for k, v in case.env.items():
            monkeypatch.setenv(k, v)
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse refusing a flag
            rc = e.code
        out, err = capsys.readouterr()
        return rc, out, err
    rss = tmp.parent / f"{tmp.name}.rss"
    env = {**child_env(), **case.env}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(rss), *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=TIME_LIMIT,
            cwd=tmp,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang: {argv} ran past {TIME_LIMIT} s")
    peak = int(rss.read_text())
    rss.unlink()
    assert peak < PEAK_MB, f"peak memory {peak} MB for {argv}"
    return proc.returncode, proc.stdout, proc.stderr


def check_case(case: Case, tmp_path: Path, capsys, monkeypatch) -> None:
    """Build ``case`` in a folder of its own, run it there (the working folder: what a command makes
    under a relative path, a default ``runs/`` included, is in it), and check what every hostile input
    must hold: no traceback, the expected exit code, for an error one ``vit CMD: error:`` line matching
    ``case.names``, the folder unchanged (but for ``case.creates``), then ``case.check``; processes the
    builder started (``HOLDERS``) are ended."""
    tmp = tmp_path / "case"
    tmp.mkdir()
    monkeypatch.chdir(tmp)
    argv = case.build(tmp)
    capsys.readouterr()
    before = snapshot(tmp)
    rc, out, err = _run(case, tmp, argv, capsys, monkeypatch)
    assert "Traceback" not in out + err, err
    assert rc == case.code, (rc, out, err)
    if case.code == 2:
        errors = [ln for ln in err.splitlines() if re.match(r"vit [\w-]+: error: ", ln)]
        assert len(errors) == 1, err
        assert re.search(case.names.replace("{tmp}", re.escape(str(tmp))), errors[0]), errors[0]
    for holder in HOLDERS:
        holder.kill()
        holder.wait()
    HOLDERS.clear()
    after = snapshot(tmp)
    assert {k: v for k, v in after.items() if k not in case.creates} == before, "files changed or left behind"
    if case.check:
        case.check(tmp, out + err)


def fill_disk(folder: Path, leave: int = 0) -> None:
    """Write a file until the disk holding ``folder`` is full, then give back ``leave`` bytes."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError as e:
        assert e.errno == errno.ENOSPC
        os.ftruncate(fd, os.fstat(fd).st_size - leave)
    finally:
        os.close(fd)
