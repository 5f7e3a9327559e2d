"""Hostile inputs to `vit convert`: zip-based checkpoints (.npz as np.savez and big_vision write them, torch.save's
.pth) with a damaged member: a flipped byte in its data, a CRC-32 field altered, a size its local header or data
descriptor states that the central directory does not. Their members are read memory-mapped, which no library
checks, so each would convert to different weights without a word; each is refused naming the member."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.state import random_state

from .harness import SMALL, Case, check_case, params

MEMBER = "params/Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"  # a (32, 64) float32 member


def export(tmp: Path, name: str) -> Path:
    """The small model written by vit's own writers: ``.npz`` (big_vision) or ``.pth`` (timm, torch.save)."""
    from vit_torch.formats import WRITERS

    fmt = "big_vision" if name.endswith(".npz") else "timm"
    save_checkpoint(tmp / name, SMALL, random_state(SMALL, scale=0.2), fmt, writers=WRITERS)
    return tmp / name


def _member(path: Path, name: str) -> tuple[zipfile.ZipInfo, int]:
    """(the central directory's entry of member ``name``, where its data starts)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    data = path.read_bytes()
    h = info.header_offset
    return info, h + 30 + int.from_bytes(data[h + 26 : h + 28], "little") + int.from_bytes(
        data[h + 28 : h + 30], "little"
    )


def _edit(path: Path, edits: dict[int, int]) -> None:
    """XOR the byte at each offset with its value."""
    data = bytearray(path.read_bytes())
    for at, x in edits.items():
        data[at] ^= x
    path.write_bytes(bytes(data))


def _central(path: Path, info: zipfile.ZipInfo) -> int:
    """Where ``info``'s central directory entry starts."""
    data, name = path.read_bytes(), info.orig_filename.encode()
    at = data.index(b"PK\x01\x02")
    while data[at + 46 : at + 46 + len(name)] != name:
        at = data.index(b"PK\x01\x02", at + 4)
    return at


def damaged(name: str, file: str, member: str, edit: Callable[[Path, zipfile.ZipInfo, int], dict[int, int]]):
    """A builder of ``vit convert FILE out.safetensors`` where ``edit(path, info, data_at)`` gives the bytes of
    ``member`` (or its headers) to flip; its id is ``name``."""

    def build(tmp: Path) -> list[str]:
        path = export(tmp, file)
        member_name = member if file.endswith(".npz") else _torch_record(path, member)
        info, at = _member(path, member_name)
        _edit(path, edit(path, info, at))
        return ["convert", str(path), str(tmp / "out.safetensors")]

    build.__name__ = name
    return build


def _torch_record(path: Path, suffix: str) -> str:
    """The name of the torch.save record ending in ``suffix``; "data/*": the largest tensor storage."""
    with zipfile.ZipFile(path) as zf:
        if suffix == "data/*":
            return max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size).filename
        return next(n for n in zf.namelist() if n.endswith("/" + suffix))


def compressed_npz(tmp: Path) -> list[str]:
    """np.savez_compressed of the exported .npz's arrays, one member's CRC-32 altered in both headers (so they
    agree with each other and not with the bytes): checked as zipfile inflates it."""
    arrays = dict(np.load(export(tmp, "m.npz")))
    (tmp / "m.npz").unlink()
    np.savez_compressed(tmp / "c.npz", **arrays)
    info, _ = _member(tmp / "c.npz", MEMBER + ".npy")
    _edit(tmp / "c.npz", {info.header_offset + 14: 1, _central(tmp / "c.npz", info) + 16: 1})
    return ["convert", str(tmp / "c.npz"), str(tmp / "out.safetensors")]


def other_zip(tmp: Path) -> list[str]:
    """A sound zip of a text file: named as what it is not, not as damaged."""
    with zipfile.ZipFile(tmp / "notes.zip", "w") as zf:
        zf.writestr("notes.txt", "not weights")
    return ["convert", str(tmp / "notes.zip"), str(tmp / "out.safetensors")]


MISMATCH = r"member {m}: CRC-32 mismatch \(stored [0-9a-f]{{8}}, computed [0-9a-f]{{8}}\); the file is damaged"
CASES = [
    Case(
        damaged("npz flipped data byte", "m.npz", MEMBER + ".npy", lambda p, i, at: {at + i.file_size - 7: 0x10}),
        "{tmp}/m.npz: " + MISMATCH.format(m=f"'{MEMBER}'"),
    ),
    Case(
        damaged("npz flipped npy header byte", "m.npz", MEMBER + ".npy", lambda p, i, at: {at + 20: 0x01}),
        r"{tmp}/m.npz: member '" + MEMBER + "'",
    ),
    Case(
        damaged("npz CRC-32 fields altered", "m.npz", MEMBER + ".npy", lambda p, i, at: {i.header_offset + 14: 4}),
        r"{tmp}/m.npz: member '" + MEMBER + r"': CRC-32 fields differ \(its local header [0-9a-f]{8}, the central",
    ),
    Case(
        damaged(
            "npz CRC-32 altered in both headers",
            "m.npz",
            MEMBER + ".npy",
            lambda p, i, at: {i.header_offset + 15: 2, _central(p, i) + 17: 2},
        ),
        "{tmp}/m.npz: " + MISMATCH.format(m=f"'{MEMBER}'"),
    ),
    Case(
        damaged("npz local size", "m.npz", MEMBER + ".npy", lambda p, i, at: {at - 16: 0x40}),
        r"{tmp}/m.npz: member '" + MEMBER + r"': its local header declares 8384 bytes \(8320 stored\), the central "
        r"directory 8320 \(8320 stored\): a damaged zip",
    ),
    Case(compressed_npz, "{tmp}/c.npz: " + MISMATCH.format(m=f"'{MEMBER}'")),
    Case(
        damaged("pth flipped data byte", "m.pth", "data/*", lambda p, i, at: {at + i.file_size // 2: 0x80}),
        "{tmp}/m.pth: " + MISMATCH.format(m=r"'[^']+/data/\d+' \(tensor patch_embed\.proj\.weight\)"),
    ),
    Case(
        damaged("pth flipped pickle byte", "m.pth", "data.pkl", lambda p, i, at: {at + 40: 0x01}),
        "{tmp}/m.pth: " + MISMATCH.format(m=r"'[^']+/data.pkl'"),
    ),
    Case(
        damaged("pth descriptor CRC-32", "m.pth", "data/0", lambda p, i, at: {at + i.compress_size + 5: 1}),
        r"{tmp}/m.pth: member '[^']+/data/0': CRC-32 fields differ \(its data descriptor [0-9a-f]{8}, the central",
    ),
    Case(
        damaged("pth central size", "m.pth", "data/1", lambda p, i, at: {_central(p, i) + 24: 4}),
        r"{tmp}/m.pth: member '[^']+/data/1': its data descriptor declares \d+ bytes .* the central directory",
    ),
    Case(other_zip, r"{tmp}/notes.zip: a zip archive that is neither \.npz nor a PyTorch file$"),
    Case(
        damaged(
            "npz central name", "m.npz", MEMBER + ".npy", lambda p, i, at: {_central(p, i) + 45 + len(MEMBER) + 4: 1}
        ),
        "{tmp}/m.npz: member '" + MEMBER + ".npx': its local header names b'" + MEMBER + ".npy': a damaged zip",
    ),
    Case(
        damaged("pth central name", "m.pth", "data.pkl", lambda p, i, at: {_central(p, i) + 45 + len(i.filename): 1}),
        r"{tmp}/m.pth: member '([^']+)/data\.pkm': its local header names b'\1/data\.pkl': a damaged zip",
    ),
]


@pytest.mark.parametrize("case", params(CASES, slow=set()))
def test_hostile_input(case, tmp_path, capsys, monkeypatch):
    check_case(case, tmp_path, capsys, monkeypatch)


def test_a_pth_written_without_crcs_converts_with_a_warning(tmp_path, capsys):
    """torch.save under ``set_crc32_options(False)`` stores 0 for every CRC-32 (torch.load reads it): nothing can
    be checked, so it converts bit-exact and says so."""
    from vit_cli.main import main
    from vit_torch.formats import READERS

    state = random_state(SMALL, scale=0.2)
    save_checkpoint(tmp_path / "ok.pth", SMALL, state, "timm", writers={"torch": _nocrc_save})
    with zipfile.ZipFile(tmp_path / "ok.pth") as zf:
        assert {i.CRC for i in zf.infolist()} == {0}
    assert main(["convert", str(tmp_path / "ok.pth"), str(tmp_path / "out.safetensors")]) == 0
    assert (
        "ok.pth was written without CRC-32s (torch.serialization.set_crc32_options(False))" in capsys.readouterr().out
    )
    back = load_checkpoint(tmp_path / "out.safetensors").state
    assert all(back[k].tobytes() == v.tobytes() for k, v in state.items())
    assert load_checkpoint(tmp_path / "ok.pth", readers=READERS).report.warnings[-1].startswith("ok.pth was written")


def _nocrc_save(path, tensors) -> None:
    from vit_torch.formats import write_torch_file

    torch.serialization.set_crc32_options(False)
    try:
        write_torch_file(path, tensors)
    finally:
        torch.serialization.set_crc32_options(True)


def test_a_damaged_training_checkpoint_names_every_tensor_of_the_record(tmp_path):
    """A timm training checkpoint (weights, EMA weights sharing a storage, args, a numpy scalar, optimizer state):
    the damaged record is named with every tensor over it, read from data.pkl without running any of it."""
    import argparse

    from vit_common.checkpoints.formats.errors import FormatError
    from vit_common.checkpoints.formats.zip_members import verify_zip

    w = torch.arange(100, dtype=torch.float32)
    state = {"blocks.0.w": w, "blocks.0.b": torch.zeros(100)}
    torch.save(
        {
            "state_dict": state,
            "state_dict_ema": {"blocks.0.w": w},
            "args": argparse.Namespace(lr=0.1),
            "best": np.float64(0.5),
            "optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}},
        },
        tmp_path / "t.pth",
    )
    assert verify_zip(tmp_path / "t.pth") == []
    info, at = _member(tmp_path / "t.pth", _torch_record(tmp_path / "t.pth", "data/0"))
    _edit(tmp_path / "t.pth", {at + 3: 1})
    with pytest.raises(FormatError) as e:
        verify_zip(tmp_path / "t.pth")
    want = "member 't/data/0' (tensor state_dict.blocks.0.w, state_dict_ema.blocks.0.w): CRC-32 mismatch (stored "
    assert want in str(e.value)


@pytest.mark.parametrize("nested", [False, True], ids=["state_dict", "training checkpoint"])
def test_a_damaged_timm_state_dict_names_its_tensor(tmp_path, nested):
    """torch.save(model.state_dict()) of a timm model (an OrderedDict carrying ``_metadata``), alone or in a
    training checkpoint's dict, with a byte of its first record flipped: the refusal names the tensor."""
    from timm.models.vision_transformer import VisionTransformer

    from vit_common.checkpoints.formats.errors import FormatError
    from vit_common.checkpoints.formats.zip_members import verify_zip

    torch.manual_seed(0)
    model = VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    sd = model.state_dict()
    assert list(sd)[0] == "cls_token" and hasattr(sd, "_metadata")
    torch.save({"state_dict": sd, "epoch": 1} if nested else sd, tmp_path / "t.pth")
    info, at = _member(tmp_path / "t.pth", _torch_record(tmp_path / "t.pth", "data/0"))
    _edit(tmp_path / "t.pth", {at + 5: 1})
    with pytest.raises(FormatError) as e:
        verify_zip(tmp_path / "t.pth")
    tensor = "state_dict.cls_token" if nested else "cls_token"
    assert f"member 't/data/0' (tensor {tensor}): CRC-32 mismatch (stored {info.CRC:08x}, computed " in str(e.value)
