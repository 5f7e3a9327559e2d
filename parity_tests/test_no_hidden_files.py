"""No command leaves a file the user did not ask for: the folders convert, evaluate, predict, parity
--json and attention write to hold, afterwards, what was there before and the outputs asked for, no
bookkeeping beside them (issue 21). A second run replaces what its content proves ours (JSON, PNG, an
HF folder); an .npz or .npy, which have no place for a mark, only with --overwrite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vit_cli.main import main
from vit_common.checkpoints import save_checkpoint
from vit_common.system import io


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_commands_leave_only_the_outputs_asked_for(tmp_path, monkeypatch, capsys, random_state, tiny_cfg):
    monkeypatch.chdir(tmp_path)  # a command's working folder is a user's folder too
    cfg = tiny_cfg.replace(in_chans=1, num_classes=10)
    save_checkpoint(tmp_path / "m.safetensors", cfg, random_state(cfg, scale=0.1))
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (8, 8), dtype=np.uint8)).save(tmp_path / "x.png")
    cases = [
        (["convert", "m.safetensors", "m.npz"], {"m.npz"}),
        (["convert", "m.safetensors", "hf", "--to", "hf"], {"hf", "hf/config.json", "hf/model.safetensors"}),
        (["predict", "m.safetensors", "x.png"], set()),
        (["evaluate", "m.safetensors", "--dataset", "digits", "--confusion", "c.png"], {"c.png"}),
        (["parity", "m.safetensors", "--json", "p.json"], {"p.json"}),
        (["attention", "x.png", "--checkpoint", "m.safetensors", "--out", "att"], None),
    ]
    for argv, asked in cases:
        for run in range(2):
            before = _listing(tmp_path)
            monkeypatch.setattr(io, "_WRITTEN", {})  # each run a command of its own, as from a shell
            code = main(argv)
            new = _listing(tmp_path) - before
            unmarked = {"m.npz": "m.npz", "att": "att/x_raw.npy"}.get(argv[-1])
            if run and unmarked:  # an .npz or .npy has no place to say it is ours: replaced only when told
                assert code == 2 and f"{unmarked}: exists and vit cannot tell it wrote it" in capsys.readouterr().err
                assert main([*argv, "--overwrite"]) == 0 and _listing(tmp_path) == before
                continue
            assert code == 0, (argv, capsys.readouterr().err)
            if asked is None:  # attention: its --out folder, holding one figure, summary and arrays per image
                asked = {"att"} | {n for n in new if n.startswith("att/x_")}
                assert {"att/x_attention.png", "att/x_attention.json"} <= new
            assert new == (asked if not run else set()), argv
    assert not [n for n in _listing(tmp_path) if Path(n).name.startswith(".")]
