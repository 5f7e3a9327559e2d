"""PyTorch .pth/.bin containers (vit_torch.formats): weights-only reading, training checkpoints, writing."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.tensors import LazyTensor
from vit_common.checkpoints.formats.zip_members import verify_zip
from vit_torch.formats import READERS, WRITERS, write_torch_file
from vit_torch.weights import tensor_to_numpy


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_pth_round_trip_bit_exact(tmp_path, dtype, small_cfg, random_state, assert_same_state):
    state = random_state(small_cfg, dtype=dtype)
    save_checkpoint(tmp_path / "m.pth", small_cfg, state, writers=WRITERS)
    ckpt = load_checkpoint(tmp_path / "m.pth", readers=READERS)
    assert ckpt.report.format == "timm"
    assert_same_state(ckpt.state, state)


def test_a_written_pth_names_its_records_as_torch_save_does(tmp_path, small_cfg, random_state):
    """The records lie under ``m/`` for ``m.pth``, as ``torch.save(state, "m.pth")`` writes them (not
    under the temporary's name), so two writes of the same tensors are the same bytes."""
    import zipfile

    state = random_state(small_cfg)
    for name in ("a", "b"):
        save_checkpoint(tmp_path / name / "m.pth", small_cfg, state, writers=WRITERS)
    names = zipfile.ZipFile(tmp_path / "a" / "m.pth").namelist()
    assert names[0] == "m/data.pkl" and all(n.startswith("m/") for n in names)
    assert (tmp_path / "a" / "m.pth").read_bytes() == (tmp_path / "b" / "m.pth").read_bytes()
    assert sorted(os.listdir(tmp_path / "a")) == ["m.pth"]


@pytest.mark.parametrize("skip_data", [True, False])
def test_a_pth_written_one_record_at_a_time_is_torch_saves_bytes(tmp_path, monkeypatch, skip_data):
    """Each record is filled after ``torch.save`` under ``skip_data`` wrote the pickle, its CRC-32 and the
    serialization id set: the bytes are ``torch.save``'s for the same tensors (a computed transpose,
    bfloat16, an empty and a 0-d tensor), every CRC-32 checks, and torch maps it back bit for bit; a
    computed tensor is asked for once. A torch without ``skip_data`` is handed the whole state (an empty
    tensor's strides then are numpy's, not torch's: other bytes, the same tensors)."""
    if not skip_data:
        monkeypatch.delattr(torch.serialization, "skip_data")
    g = torch.Generator().manual_seed(0)
    ref = {
        "w": torch.randn(40, 30, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "empty": torch.zeros(0, 3),
        "scale": torch.tensor(2.5, dtype=torch.float64),
        "index": torch.arange(5),
    }
    kernel, loads = tensor_to_numpy(ref["w"]).T.copy(), []
    state = {k: tensor_to_numpy(v) for k, v in ref.items()}
    state["w"] = LazyTensor((40, 30), np.float32, lambda: loads.append(1) or kernel.T)
    write_torch_file(tmp_path / "m.pth", state)
    (tmp_path / "ref").mkdir()
    torch.save(ref, tmp_path / "ref" / "m.pth")
    assert not skip_data or (tmp_path / "m.pth").read_bytes() == (tmp_path / "ref" / "m.pth").read_bytes()
    assert loads == [1] and verify_zip(tmp_path / "m.pth") == []
    back = torch.load(tmp_path / "m.pth", weights_only=True, mmap=True)
    assert all(
        back[k].shape == v.shape and back[k].view(-1).view(torch.uint8).equal(v.view(-1).view(torch.uint8))
        for k, v in ref.items()
    )


def test_training_checkpoint_entries_are_reported(tmp_path, small_cfg, random_state, assert_same_state):
    state = random_state(small_cfg)
    sd = {k: torch.from_numpy(v) for k, v in state.items()}
    torch.save(
        {
            "epoch": 3,
            "arch": "vit",
            "state_dict": sd,
            "optimizer": {"state": {}},
            "args": argparse.Namespace(lr=1e-3),
        },
        tmp_path / "train.pth.tar",
    )
    ckpt = load_checkpoint(tmp_path / "train.pth.tar", readers=READERS)
    assert_same_state(ckpt.state, state)
    assert sorted(k for k, _ in ckpt.report.dropped) == ["arch", "args", "epoch", "optimizer"]


def test_legacy_torch_save_format_and_hf_bin(tmp_path, small_cfg, random_state, assert_same_state):
    state = random_state(small_cfg)
    torch.save(
        {k: torch.from_numpy(v) for k, v in state.items()},
        tmp_path / "old.pth",
        _use_new_zipfile_serialization=False,
    )
    assert_same_state(load_checkpoint(tmp_path / "old.pth", readers=READERS).state, state)
    save_checkpoint(tmp_path / "hf", small_cfg, state, "hf")  # same folder with pytorch_model.bin instead
    from safetensors.numpy import load_file

    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, tmp_path / "hf" / "pytorch_model.bin")
    (tmp_path / "hf" / "model.safetensors").unlink()
    assert_same_state(load_checkpoint(tmp_path / "hf", readers=READERS).state, state)


class _Payload:
    def __reduce__(self):
        return (os.mkdir, (str(Path(tempfile.gettempdir()) / "vit-pwned-marker"),))


def test_never_unpickles_arbitrary_objects(tmp_path):
    marker = Path(tempfile.gettempdir()) / "vit-pwned-marker"
    shutil.rmtree(marker, ignore_errors=True)
    torch.save({"state_dict": {"x": torch.zeros(1)}, "evil": _Payload()}, tmp_path / "evil.pth")
    with pytest.raises(FormatError, match="not a readable PyTorch weights file"):
        load_checkpoint(tmp_path / "evil.pth", readers=READERS)
    assert not marker.exists()


def test_pth_without_weights_is_named(tmp_path):
    torch.save({"epoch": 1, "optimizer": {}}, tmp_path / "x.pth")
    with pytest.raises(FormatError, match="holds no state_dict"):
        load_checkpoint(tmp_path / "x.pth", readers=READERS)


_VALID = Path(tempfile.mkdtemp(prefix="vit-pth-")) / "m.pth"


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cut=st.floats(0, 1, exclude_max=True),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), max_size=3),
)
def test_corrupted_pth_raises_only_documented_errors(cut, flips, small_cfg, random_state):
    if not _VALID.exists():
        save_checkpoint(_VALID, small_cfg, random_state(small_cfg), writers=WRITERS)
    data = bytearray(_VALID.read_bytes())
    for pos, x in flips:
        data[int(pos * len(data))] ^= x
    data = data[: max(1, int(len(data) * (1 - cut)))]
    work = Path(tempfile.mkdtemp())
    try:
        (work / "c.pth").write_bytes(bytes(data))
        try:
            load_checkpoint(work / "c.pth", readers=READERS)
        except ValueError:
            pass
    finally:
        shutil.rmtree(work)


def test_a_training_checkpoint_with_ema_weights_reads_them_as_timm_does_and_says_so(
    tmp_path, small_cfg, random_state, assert_same_state, capsys
):
    """state_dict and state_dict_ema: EMA by default (timm's load_checkpoint, use_ema=True), stated on
    every read (vit predict prints it), and --weights-entry picks either."""
    import timm
    from PIL import Image

    from vit_cli.main import main
    from vit_common.checkpoints.formats.source import weights_entry

    raw, ema = random_state(small_cfg, seed=1), random_state(small_cfg, seed=2)
    path = tmp_path / "train.pth.tar"
    torch.save({"epoch": 3, "state_dict": _torch(raw), "state_dict_ema": _torch(ema)}, path)
    assert_same_state(load_checkpoint(path, readers=READERS).state, ema)
    model = timm.create_model(
        "vit_base_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        mlp_ratio=small_cfg.mlp_dim / 32,
        num_classes=10,
        act_layer="gelu",
    )
    timm.models.load_checkpoint(model, str(path))  # timm's own choice
    assert_same_state({k: v.numpy() for k, v in model.state_dict().items()}, ema)
    with weights_entry("state_dict"):
        ckpt = load_checkpoint(path, readers=READERS)
    assert_same_state(ckpt.state, raw)
    assert "'state_dict_ema': weights not used: the model is 'state_dict' (training weights; asked for)" in (
        " ".join(ckpt.report.warnings)
    )
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "x.png")
    argv = ["predict", str(path), str(tmp_path / "x.png"), "--framework", "torch", "--set", "num_heads=2"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert (
        f"vit: warning: {path}: 'state_dict': weights not used: the model is 'state_dict_ema' (EMA weights; "
        "timm's loader's choice, EMA first); --weights-entry state_dict reads these"
    ) in err
    assert main([*argv, "--weights-entry", "model_ema"]) == 2
    assert (
        f"{path}: --weights-entry model_ema: the file holds ['state_dict_ema', 'state_dict']" in capsys.readouterr().err
    )


def _torch(state: dict) -> dict:
    return {k: torch.from_numpy(v) for k, v in state.items()}


def test_an_assumption_warning_points_at_the_callers_line_and_names_keywords(tmp_path, small_cfg, random_state):
    """vit_torch.load_model -> pretrained -> read_checkpoint: the warning names this file's line, not the
    library's, and the Python keywords (not the CLI's --set) that give the fields."""
    import vit_torch
    from vit_common.system.io import save_safetensors

    save_safetensors(tmp_path / "bare.safetensors", random_state(small_cfg))
    with pytest.warns(UserWarning, match=r"give each with the keyword FIELD=VALUE .*strict=True") as record:
        vit_torch.load_model(tmp_path / "bare.safetensors")
    assert [Path(w.filename).name for w in record] == [Path(__file__).name]


def test_a_pth_of_a_width_no_rule_guesses_heads_for_is_written_with_the_given_heads(tmp_path):
    """timm's ViT of width 264 and 3 heads (bf16, in a .safetensors file): converted to a timm .pth with
    num_heads=3 given, the read-back check reads it with 3 heads, says readers must pass them, and the
    file reads back bit-exact with them."""
    import timm
    from safetensors.torch import save_file

    from vit_common.checkpoints.convert import convert

    model = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=16, embed_dim=264, num_heads=3, depth=1, mlp_ratio=1.0, num_classes=3
    ).to(torch.bfloat16)
    want = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(want, tmp_path / "odd_bf16.safetensors")
    report = convert(
        tmp_path / "odd_bf16.safetensors", tmp_path / "odd2.pth", to_fmt="timm", writers=WRITERS, num_heads=3
    )
    assert any("cannot hold num_heads=3" in w and "--set num_heads=3" in w for w in report.warnings), report.warnings
    got = torch.load(tmp_path / "odd2.pth", weights_only=True)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert load_checkpoint(tmp_path / "odd2.pth", readers=READERS, num_heads=3).cfg.num_heads == 3
