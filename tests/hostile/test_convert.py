"""Hostile inputs to `vit convert`: destinations that are not vit's, sources that would exhaust the
machine or hang, config values and files that would give a silent wrong result, pickles, and writes that
fail (a full disk, kill -9)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from vit_cli.main import main
from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.canonical import FORMAT_TAG
from vit_common.state import random_state
from vit_common.system import io

from .harness import SMALL, Case, bare_timm, check_case, child_env, fill_disk, flag, ours, params, small_model, snapshot


def project_folder(tmp: Path) -> list[str]:
    proj = tmp / "project"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "train.py").write_text("print('mine')\n")
    (proj / "config.json").write_text('{"lr": 0.1}\n')
    return ["convert", str(small_model(tmp)), str(proj), "--to", "hf"]


def run_folder(tmp: Path) -> list[str]:
    run = tmp / "run"
    (run / "checkpoints" / "200").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    ours(run / "model.safetensors", SMALL.to_json())
    return ["convert", str(small_model(tmp)), str(run), "--to", "orbax"]  # (a source inside: check_apart's case)


def foreign_npz(tmp: Path) -> list[str]:
    np.savez(tmp / "theirs.npz", x=np.arange(3))
    return ["convert", str(small_model(tmp)), str(tmp / "theirs.npz")]


def foreign_safetensors(tmp: Path) -> list[str]:
    save_file({"w": np.ones(3, np.float32)}, str(tmp / "hub.safetensors"), {"format": "pt"})
    return ["convert", str(small_model(tmp)), str(tmp / "hub.safetensors")]


def fifo_destination(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "out.npz")
    return ["convert", str(small_model(tmp)), str(tmp / "out.npz")]


def device_source(tmp: Path) -> list[str]:
    return ["convert", "/dev/zero", str(tmp / "out.npz")]


def symlink_loop(tmp: Path) -> list[str]:
    os.symlink(tmp / "b.safetensors", tmp / "a.safetensors")
    os.symlink(tmp / "a.safetensors", tmp / "b.safetensors")
    return ["convert", str(tmp / "a.safetensors"), str(tmp / "out.npz")]


def deep_stored_config(tmp: Path) -> list[str]:
    ours(tmp / "deep.safetensors", SMALL.replace(depth=10**9).to_json())
    return ["convert", str(tmp / "deep.safetensors"), str(tmp / "out.npz")]


def deep_override(tmp: Path) -> list[str]:
    return ["convert", str(small_model(tmp)), str(tmp / "out.npz"), "--set", "depth=1000000000"]


def huge_resample(tmp: Path) -> list[str]:
    return ["convert", str(small_model(tmp)), str(tmp / "out.npz"), "--image-size", "800000"]


def huge_head(tmp: Path) -> list[str]:
    return ["convert", str(small_model(tmp)), str(tmp / "out.npz"), "--num-classes", "2000000000"]


def deep_orbax_config(tmp: Path) -> list[str]:
    (tmp / "ob" / "state").mkdir(parents=True)
    meta = {"format": FORMAT_TAG, "vit_config": SMALL.replace(depth=10**9).to_json()}
    (tmp / "ob" / "vit_config.json").write_text(json.dumps(meta))
    return ["convert", str(tmp / "ob"), str(tmp / "out.npz")]


def hf_index_traversal(tmp: Path) -> list[str]:
    save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
    index = {"weight_map": {"cls_token": "../m.safetensors"}}
    (tmp / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    return ["convert", str(tmp / "hf"), str(tmp / "out.npz")]


def _npy_header(shape: tuple, descr: str = "<f4") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def npz_claims_1e12(tmp: Path) -> list[str]:
    with zipfile.ZipFile(tmp / "big.npz", "w") as zf:
        zf.writestr("embedding/kernel.npy", _npy_header((1000, 1000, 1000, 1000)) + b"\0" * 64)
    return ["convert", str(tmp / "big.npz"), str(tmp / "out.safetensors")]


def npz_inflates(shape: tuple[int, ...]) -> Callable[[Path], list[str]]:
    """A 256 MiB member of zeros of ``shape``, compressed to a few hundred KB."""

    def build(tmp: Path) -> list[str]:
        with zipfile.ZipFile(tmp / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as zf:
            with zf.open("embedding/kernel.npy", "w", force_zip64=True) as fh:
                fh.write(_npy_header(shape))
                zeros = bytes(2**24)
                for _ in range(16):
                    fh.write(zeros)
        return ["convert", str(tmp / "bomb.npz"), str(tmp / "out.safetensors")]

    build.__name__ = f"npz inflates {len(shape)}-D"
    return build


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickle_pth(tmp: Path) -> list[str]:
    import torch

    torch.save({"state_dict": Payload(tmp / "PWNED")}, tmp / "evil.pth")
    return ["convert", str(tmp / "evil.pth"), str(tmp / "out.npz")]


def pickle_stream(tmp: Path) -> list[str]:
    (tmp / "evil.bin").write_bytes(pickle.dumps(Payload(tmp / "PWNED"), protocol=2))
    return ["convert", str(tmp / "evil.bin"), str(tmp / "out.npz")]


def set_value(field_value: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        return ["convert", str(small_model(tmp)), str(tmp / "out.npz"), "--set", field_value]

    build.__name__ = f"set {field_value}"
    return build


def set_collides(tmp: Path) -> list[str]:
    return ["convert", str(small_model(tmp)), str(tmp / "out.npz"), "--set", "image_size=64", "--image-size", "48"]


def hf_config_value(key: str, text: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
        cfg = json.loads((tmp / "hf" / "config.json").read_text())
        (tmp / "hf" / "config.json").write_text(json.dumps(cfg).replace(f'"{key}": {json.dumps(cfg[key])}', text))
        return ["convert", str(tmp / "hf"), str(tmp / "out.npz")]

    build.__name__ = f"hf {text}"
    return build


def deep_hf_config(tmp: Path) -> list[str]:
    """An HF folder whose config.json is nested 100,000 deep (a RecursionError traceback before)."""
    save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
    (tmp / "hf" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    return ["convert", str(tmp / "hf"), str(tmp / "out.npz")]


def int_weights(tmp: Path) -> list[str]:
    state = random_state(SMALL, scale=0.2)
    state["head.bias"] = np.arange(10, dtype=np.int64)
    ours(tmp / "int.safetensors", SMALL.to_json(), state)
    return ["convert", str(tmp / "int.safetensors"), str(tmp / "out.npz")]


def assumed_into_hf(tmp: Path) -> list[str]:
    return ["convert", str(bare_timm(tmp)), str(tmp / "hf"), "--to", "hf", "--source-image-size", "32"]


def convert_checkpoint_into_its_source(tmp: Path) -> list[str]:
    save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
    return ["convert", str(tmp / "hf"), str(tmp / "hf" / "copy.npz")]


def bad_limit(tmp: Path) -> list[str]:
    return ["convert", str(small_model(tmp)), str(tmp / "out.npz")]


def bf16_to_every_format(tmp: Path) -> list[str]:
    ours(tmp / "bf.safetensors", SMALL.to_json(), random_state(SMALL, scale=0.2, dtype=ml_dtypes.bfloat16))
    return ["convert", str(tmp / "bf.safetensors"), str(tmp / "bf.npz")]


def _bf16_exact(tmp: Path, out: str) -> None:
    """The .npz holds the bf16 values widened to float32, exactly; every other format holds them as bf16."""
    from vit_torch.formats import READERS, WRITERS  # orbax's bf16 round trip: tests/test_orbax.py

    want = random_state(SMALL, scale=0.2, dtype=ml_dtypes.bfloat16)
    assert "bfloat16 tensors written as float32 (exact" in out
    back = load_checkpoint(tmp / "bf.npz").state
    assert all(np.array_equal(back[k], want[k].astype(np.float32)) for k in want)
    for fmt, name in (("timm", "bf.pth"), ("timm", "t.safetensors"), ("hf", "hf")):
        save_checkpoint(tmp / name, SMALL, load_checkpoint(tmp / "bf.safetensors").state, fmt, writers=WRITERS)
        back = load_checkpoint(tmp / name, readers=READERS).state
        assert all(back[k].dtype == want[k].dtype and back[k].tobytes() == want[k].tobytes() for k in want), fmt


def _no_payload(tmp: Path, out: str) -> None:
    assert not (tmp / "PWNED").exists()


def declared_size(
    name: str, fmt: str, changes: dict, model_type: str = "", arch: str = ""
) -> Callable[[Path], list[str]]:
    """``vit convert`` of a ``fmt`` folder of the small model ('hf': config.json at the top; 'timm': its
    hub folder, ``model_args``) whose config.json states ``changes`` (and ``model_type``, ``arch``): sizes that
    claim far more than the file's tensors, refused before a rule, a module or an array is built."""

    def build(tmp: Path) -> list[str]:
        save_checkpoint(tmp / "src", SMALL, random_state(SMALL, scale=0.2), fmt)
        config = json.loads((tmp / "src" / "config.json").read_text())
        if fmt == "timm":
            config["model_args"] |= changes
        else:
            config |= changes | ({"model_type": model_type, "architectures": [arch]} if model_type else {})
        (tmp / "src" / "config.json").write_text(json.dumps(config))
        return ["convert", str(tmp / "src"), str(tmp / "out.safetensors")]

    build.__name__ = name
    return build


def declared_preprocessing(name: str, write: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """``vit convert`` of a checkpoint of the small model (32x32, 10 classes) whose stored preprocessing or
    class names ``write(tmp)`` wrote: what ``vit predict`` would refuse, refused before it is written."""

    def build(tmp: Path) -> list[str]:
        write(tmp)
        src = next(p for p in tmp.iterdir() if p.name in ("hf", "hub", "m.safetensors"))
        return ["convert", str(src), str(tmp / "out.safetensors")]

    build.__name__ = name
    return build


def _hf_processor(**pp) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        save_checkpoint(tmp / "hf", SMALL, random_state(SMALL, scale=0.2), "hf")
        config = {"image_processor_type": "CLIPImageProcessor", "do_center_crop": True, "do_resize": True} | pp
        (tmp / "hf" / "preprocessor_config.json").write_text(json.dumps(config))

    return write


def _hub_labels(tmp: Path) -> None:
    save_checkpoint(tmp / "hub", SMALL, random_state(SMALL, scale=0.2), "timm", classes=list("abcdefghij"))
    config = json.loads((tmp / "hub" / "config.json").read_text())
    (tmp / "hub" / "config.json").write_text(json.dumps(config | {"label_names": ["cat", "dog", "bird", "fish"]}))


def _ours_crop_pct(tmp: Path) -> None:
    meta = {"format": FORMAT_TAG, "vit_config": SMALL.to_json(), "preprocess": json.dumps({"crop_pct": 1e-6})}
    save_file(random_state(SMALL, scale=0.2), str(tmp / "m.safetensors"), meta)


def user_file_in_orbax(where: str) -> Callable[[Path], list[str]]:
    """An orbax folder vit wrote, then a file of the user's put ``where`` inside its state/ sub-folder:
    writing the folder again would delete it."""

    def build(tmp: Path) -> list[str]:
        src = small_model(tmp)
        assert main(["convert", str(src), str(tmp / "ob"), "--to", "orbax"]) == 0
        (tmp / "ob" / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "ob" / where).write_text("the user's\n")
        return ["convert", str(src), str(tmp / "ob"), "--to", "orbax"]

    build.__name__ = f"user file at orbax {where}"
    return build


CASES = [
    # nothing of the user's is replaced, no folder made for a refused output
    Case(
        flag("convert", "MODEL", "a/b/out.safetensors", "--to", "timm", "--set", "depth=3"),
        r"{tmp}/m.safetensors: the config \(depth=3, .*\) declares 32,448 parameters besides the head",
    ),
    Case(project_folder, r"{tmp}/project: a folder holding things vit did not write .*config.json, src"),
    Case(run_folder, r"{tmp}/run: a folder holding things vit did not write .*checkpoints, metrics.jsonl"),
    Case(foreign_npz, r"{tmp}/theirs.npz: exists and vit cannot tell it wrote it; pass --overwrite"),
    Case(foreign_safetensors, r"{tmp}/hub.safetensors: exists and vit cannot tell it wrote it"),
    Case(
        user_file_in_orbax("state/notes.txt"), r"{tmp}/ob: a folder holding things vit did not write .*state/notes.txt"
    ),
    Case(user_file_in_orbax("state/mine/a.txt"), r"{tmp}/ob: .*did not write .*\(state/mine, state/mine/a.txt\)"),
    Case(fifo_destination, r"{tmp}/out.npz: exists and vit cannot tell it wrote it"),
    # small inputs that would exhaust the machine or hang
    Case(device_source, r"/dev/zero: .*a device, expected a regular checkpoint file", child=True),
    Case(symlink_loop, r"{tmp}/a.safetensors: .*Too many levels of symbolic links"),
    Case(deep_stored_config, r"{tmp}/deep.safetensors: the config \(depth=1000000000.* declares", child=True),
    Case(deep_override, r"{tmp}/m.safetensors: the config \(depth=1000000000", child=True),
    Case(huge_resample, r"image_size=800000: a model with .* beyond the limit", child=True),
    Case(huge_head, r"num_classes=2000000000: a model .* beyond the limit", child=True),
    Case(deep_orbax_config, r"{tmp}/ob: a model with depth=1000000000.* beyond the limit", child=True),
    Case(
        declared_size("hf ViT hidden_size 10**6", "hf", {"hidden_size": 10**6}),
        r"{tmp}/src.*(hidden_size|width=1000000)",
        child=True,
    ),
    Case(
        declared_size(
            "vit_msn num_hidden_layers 10**9",
            "hf",
            {"num_hidden_layers": 10**9},
            "vit_msn",
            "ViTMSNForImageClassification",
        ),
        r"{tmp}/src.*depth=1000000000.* but the file holds",
        child=True,
    ),
    Case(
        declared_size("timm hub embed_dim 10**6", "timm", {"embed_dim": 10**6}),
        r"{tmp}/src/config.json: model_args: declares depth=2, width=1000000, mlp_dim=2000000: .* but the file holds",
        child=True,
    ),
    Case(
        declared_size("timm hub depth 10**9", "timm", {"depth": 10**9}),
        r"{tmp}/src/config.json: model_args: declares depth=1000000000, width=32, mlp_dim=64",
        child=True,
    ),
    Case(hf_index_traversal, r"{tmp}/hf/model.safetensors.index.json: weight_map names files outside the folder"),
    Case(npz_claims_1e12, r"{tmp}/big.npz: .*member 'embedding/kernel' \(\(1000, 1000, 1000, 1000\)", child=True),
    Case(
        npz_inflates((2**26, 1, 1, 1)),
        r"{tmp}/bomb.npz: .*embedding/kernel.* beyond the limit of 67\.1 MB \(set VIT_MAX_BYTES",
        child=True,
        env={"VIT_MAX_BYTES": "64MiB"},  # binary, as 64M
    ),
    Case(
        npz_inflates((2**26,)),
        r"{tmp}/bomb.npz: member 'embedding/kernel' has shape \(67108864,\), the format's is 4-D or 2-D; refused",
        child=True,
    ),
    Case(bad_limit, r"VIT_MAX_BYTES='lots': expected a positive size", env={"VIT_MAX_BYTES": "lots"}),
    # silent wrong results
    Case(set_value("ln_eps=Infinity"), r"ln_eps=inf: expected a finite number"),
    Case(set_value("ln_eps=NaN"), r"ln_eps=nan: expected a finite number"),
    Case(set_value("ln_eps=-1"), r"ln_eps=-1: expected a finite number in \(0, 1\]"),
    Case(set_value("dropout=1.5"), r"dropout=1.5: expected a finite number in \[0, 1\)"),
    Case(set_value("num_heads=true"), r"num_heads=True: expected an integer"),
    Case(hf_config_value("layer_norm_eps", '"layer_norm_eps": Infinity'), r"{tmp}/hf: .*ln_eps=inf: expected a finite"),
    Case(hf_config_value("layer_norm_eps", '"layer_norm_eps": "tiny"'), r"{tmp}/hf.*layer_norm_eps|ln_eps='tiny'"),
    Case(deep_hf_config, r"{tmp}/hf/config.json: JSON nested deeper than 64 levels"),
    Case(int_weights, r"{tmp}/int.safetensors: tensors that are not floating point: head.bias \(int64\)"),
    Case(
        assumed_into_hf,
        r"{tmp}/hf: its config.json states every field as fact to transformers, and .*gelu='exact'.* --accept-assumed",
    ),
    Case(
        declared_preprocessing(
            "resize 10**6 cropped to fit", _hf_processor(size={"shortest_edge": 10**6}, crop_size=32)
        ),
        r"{tmp}/hf: the preprocessing \(resize_size=\[1000000\]; declared: .*\) resizes every image to "
        r"1000000x1000000 pixels or more: expected at most Pillow's",
    ),
    Case(
        declared_preprocessing("crop 16 of a 32 model", _hf_processor(size={"shortest_edge": 20}, crop_size=16)),
        r"{tmp}/hf: the preprocessing \(resize_size=\[20\], crop_size=\[16, 16\]; .*\) gives 16x16 images; the model "
        r"takes 32x32",
    ),
    Case(
        declared_preprocessing("4 label names for 10 classes", _hub_labels),
        r"{tmp}/hub: 4 class names \(declared: {tmp}/hub/config.json.*\) for a model with 10 classes",
    ),
    Case(
        declared_preprocessing("crop_pct 1e-6", _ours_crop_pct),
        r"{tmp}/m.safetensors: the preprocessing \(crop_pct=1e-06 at 32x32; declared.*32000000x32000000 pixels",
    ),
    Case(convert_checkpoint_into_its_source, r"{tmp}/hf/copy.npz: the output lies inside the source {tmp}/hf; write"),
    # tracebacks instead of named errors
    Case(set_value("ln_eps=abc"), r"ln_eps='abc': expected a finite number"),
    Case(set_collides, r"'image_size=64': image_size is not set with --set; use --source-image-size"),
    Case(set_value("nonsense=1"), r"'nonsense' is not a ViTConfig field"),
    Case(bf16_to_every_format, "", code=0, check=_bf16_exact, creates=("bf.npz",)),
    # never unpickle
    Case(pickle_pth, r"{tmp}/evil.pth: .*(blocked|weights-only|not allowed|refus)", check=_no_payload),
    Case(pickle_stream, r"{tmp}/evil.bin", check=_no_payload),
]


# The cases the fast loop leaves to the full suite (docs/contributors.md): those that train or run long.
SLOW = {
    "deep_orbax_config",
}


@pytest.mark.parametrize("case", params(CASES, slow=SLOW))
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)


# --------------------------------------------------------------------------------- writes that fail


WRITE_FAULTS = [
    ("canonical", "m2.safetensors"),
    ("timm", "t.pth"),
    ("big_vision", "b.npz"),
    ("hf", "hf"),
    ("orbax", "ob"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "name"), WRITE_FAULTS, ids=[f for f, _ in WRITE_FAULTS])
def test_full_disk_keeps_the_old_destination_and_leaves_nothing(fmt, name, small_disk, tmp_path, capsys):
    src = small_model(tmp_path)
    dst = small_disk / name
    assert main(["convert", str(src), str(dst), "--to", fmt]) == 0
    fill_disk(small_disk)
    before = snapshot(small_disk)
    capsys.readouterr()
    rc = main(["convert", str(src), str(dst), "--to", fmt, "--overwrite"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    line = [ln for ln in err.splitlines() if ln.startswith("vit convert: error: ")]
    assert len(line) == 1 and str(dst) in line[0] and "No space left on device" in line[0], err
    assert snapshot(small_disk) == before


@pytest.mark.slow
@pytest.mark.parametrize("checked", [True, False], ids=["refused-before-orbax", "orbax-fails-mid-write"])
def test_a_disk_that_fills_during_an_orbax_write_is_one_line_and_nothing_else(checked, small_disk, tmp_path):
    """32 KiB free, less than the orbax folder needs: refused before orbax starts (statvfs), naming what it
    needs. With that check off, orbax's own write fails inside tensorstore, whose done-callbacks then raise
    "Event loop is closed" on orbax's closed loop (0 to 29 times a run, as measured), reported through
    ``sys.unraisablehook``, during the write and after. A child process, so that all it prints on fd 2 until
    it ends is seen; its first unraisablehook prints on fd 2 as it was before vit ran: one line either way.
    Either way the destination keeps its old content."""
    src, dst = small_model(tmp_path), small_disk / "ob"
    assert main(["convert", str(src), str(dst), "--to", "orbax"]) == 0
    fill_disk(small_disk, leave=32 << 10)
    before = snapshot(small_disk)
    code = [
        "import os, sys",
        "err = os.fdopen(os.dup(2), 'w')",  # quiet_orbax points fd 2 at /dev/null while orbax writes
        "sys.unraisablehook = lambda u: print(f'unraisable: {u.exc_value!r}', file=err, flush=True)",
        "from vit_common.system import io",
        "" if checked else "io.FOLDER_OVERHEAD = -(1 << 40)",  # needs nothing: orbax meets the full disk
        "from vit_cli.main import main",
        "sys.exit(main(sys.argv[1:]))",
    ]
    argv = ["convert", str(src), str(dst), "--to", "orbax", "--overwrite"]
    env = child_env()
    child = subprocess.run([sys.executable, "-c", "\n".join(code), *argv], capture_output=True, text=True, env=env)
    lines = child.stderr.splitlines()
    assert child.returncode == 2 and len(lines) == 1, child.stderr
    assert lines[0].startswith(f"vit convert: error: {dst}: could not be written (No space left on device")
    assert ("needs " in lines[0]) == checked and lines[0].endswith("the old file is unchanged"), lines[0]
    if not checked:  # tensorstore's threads can re-create the temporary after vit removed it (1 in ~10 runs):
        io.remove_stale_temporaries(small_disk)  # the next write into the folder removes it (the writer is gone)
    assert snapshot(small_disk) == before


def test_kill_9_during_a_write_leaves_a_temporary_the_next_write_removes(tmp_path, capsys):
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from vit_common.system import io\n"
            "def write(tmp):\n"
            "    open(tmp, 'wb').write(b'half a model'); print('writing', flush=True); time.sleep(600)\n"
            "io.atomic_write(sys.argv[1], write)",
            str(tmp_path / "out" / "a.npz"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert child.stdout.readline().strip() == "writing"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    left = [p.name for p in (tmp_path / "out").iterdir()]
    assert len(left) == 1 and left[0].startswith(f"{io.TMP_PREFIX}{child.pid}-a.npz-"), left
    assert main(["convert", str(small_model(tmp_path)), str(tmp_path / "out" / "b.npz")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["b.npz"]


def test_overwrite_replaces_a_file_but_never_a_foreign_folder(tmp_path, capsys):
    project_folder(tmp_path)
    foreign_npz(tmp_path)
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "theirs.npz"), "--overwrite"]) == 0
    assert "params/embedding/kernel" in np.load(tmp_path / "theirs.npz").files
    rc = main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "project"), "--to", "hf", "--overwrite"])
    assert rc == 2 and (tmp_path / "project" / "src" / "train.py").read_text() == "print('mine')\n"
