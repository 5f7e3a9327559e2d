"""Commands refuse an output file vit did not write before their work, not after it (exit 2, file kept)."""

from __future__ import annotations

import pytest

from vit_cli.main import main


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "m.safetensors", "--dataset", "digits", "--confusion", "{out}"],
        ["parity", "m.safetensors", "--json", "{out}"],
    ],
    ids=["evaluate", "parity"],
)
def test_a_users_file_is_refused_before_the_work(argv, tmp_path, capsys, monkeypatch):
    out = tmp_path / "mine.png"
    out.write_bytes(b"the user's own picture")

    def work(*args, **kwargs):
        raise AssertionError("the work started before the destination was checked")

    monkeypatch.setattr("vit_compare.run_model.load_with_info", work)
    monkeypatch.setattr("vit_compare.inference.run_parity", work)
    assert main([a.format(out=out) for a in argv]) == 2
    assert str(out) in capsys.readouterr().err
    assert out.read_bytes() == b"the user's own picture"


def test_assumptions_are_one_warning_line_each(tmp_path, capsys, random_state, tiny_cfg):
    """A timm file stores no config: `vit predict` names each assumed field on a line of its own."""
    import numpy as np
    from PIL import Image
    from safetensors.numpy import save_file

    cfg = tiny_cfg
    save_file(random_state(cfg), tmp_path / "t.safetensors")
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "x.png")
    assert main(["predict", str(tmp_path / "t.safetensors"), str(tmp_path / "x.png"), "--set", "num_heads=2"]) == 0
    err = capsys.readouterr().err.splitlines()
    head = f"vit: warning: {tmp_path / 't.safetensors'}: "
    assert err[0].startswith(head + "5 fields assumed: image_size, ln_eps, gelu, pool, posemb_prefix ("), err
    assert err[3] == "  gelu = 'exact' (not stored; timm's default nn.GELU (exact erf))"
    assert all(line.startswith("  ") for line in err[1:6]) and all(line.startswith(head) for line in err[6:])
    assert not any("num_heads" in line for line in err)


@pytest.fixture
def tiny_eval(tmp_path, random_state, tiny_cfg):
    """A 3-class model of 8 px and an npz dataset of 6 test images."""
    import numpy as np

    from vit_common.checkpoints.convert import save_checkpoint

    cfg = tiny_cfg
    save_checkpoint(tmp_path / "m.safetensors", cfg, random_state(cfg), "canonical")
    x = np.random.default_rng(1).integers(0, 256, (6, 8, 8), np.uint8)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(6) % 3, x_test=x, y_test=np.arange(6) % 3)
    return tmp_path / "m.safetensors", f"npz:{tmp_path / 'd.npz'}"


@pytest.fixture
def readonly_folder(tmp_path):
    """A folder nobody may create files in: a read-only tmpfs for root (whom permissions do not stop)."""
    import os
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)]).returncode:
        pytest.skip("a read-only folder for root needs a tmpfs mount")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=True)


def test_an_unwritable_current_folder_is_refused_before_the_evaluation(tiny_eval, readonly_folder, capsys, monkeypatch):
    model, data = tiny_eval
    monkeypatch.chdir(readonly_folder)

    def work(*args, **kwargs):
        raise AssertionError("the evaluation started before the destination was checked")

    monkeypatch.setattr("vit_compare.run_model.load_with_info", work)
    assert main(["evaluate", str(model), "--dataset", data, "--confusion", "confusion.png"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"vit evaluate: error: confusion.png: cannot be written (folder {readonly_folder} is not writable); "
        "choose another path"
    ], err


@pytest.mark.slow
def test_evaluate_writes_nothing_it_was_not_asked_for(tiny_eval, tmp_path, capsys, monkeypatch):
    model, data = tiny_eval
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert main(["evaluate", str(model), "--dataset", data]) == 0
    assert "confusion matrix: not written (--confusion FILE.png" in capsys.readouterr().out
    assert list((tmp_path / "cwd").iterdir()) == []


def test_the_result_is_printed_before_the_picture_is_drawn(tiny_eval, tmp_path, capsys, monkeypatch):
    """A picture that fails to draw (here: a full disk) loses no result: accuracy and counts came first."""
    import json

    import vit_cli.evaluate

    model, data = tiny_eval

    def full_disk(*args, **kwargs):
        raise OSError(f"{tmp_path / 'c.png'}: could not be written (No space left on device); nothing was written")

    monkeypatch.setattr(vit_cli.evaluate, "confusion_png", full_disk)
    rc = main(["evaluate", str(model), "--dataset", data, "--confusion", str(tmp_path / "c.png"), "--json"])
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert rc == 2 and "No space left on device" in err
    assert result["images"] == 6 and sum(map(sum, result["confusion_matrix"])) == 6
    assert result["accuracy"] == sum(result["confusion_matrix"][k][k] for k in range(3)) / 6


@pytest.mark.slow  # a depth-40 model through `vit attention` twice
def test_the_attention_figure_is_bounded_whatever_the_depth_and_heads(tmp_path, capsys, random_state, tiny_cfg):
    """Depth 40 and 16 heads: the figure draws 12 blocks (with --layer all) or 12 heads, evenly spaced and
    named in the output, so it stays 2 rows of 8 panels of 200 x 240 px; every block's overlay is written."""
    import numpy as np
    from PIL import Image

    from vit_common.checkpoints.convert import save_checkpoint

    cfg = tiny_cfg.replace(depth=40, num_heads=16, num_classes=2)
    save_checkpoint(tmp_path / "deep.safetensors", cfg, random_state(cfg, scale=0.1), "canonical")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), np.uint8)).save(tmp_path / "x.png")
    run = ["attention", str(tmp_path / "x.png"), "--checkpoint", str(tmp_path / "deep.safetensors")]
    assert main([*run, "--layer", "all", "--out", str(tmp_path / "all")]) == 0
    printed = capsys.readouterr().out
    assert "figure: blocks 0, 4, 7, 11, 14, 18, 21, 25, 28, 32, 35, 39 of 40 (at most 12, evenly spaced" in printed
    assert Image.open(tmp_path / "all" / "x_attention.png").size == (1600, 480)  # input + 12 blocks + rollout
    assert len(list((tmp_path / "all").glob("x_overlay_block*.png"))) == 40
    assert main([*run, "--out", str(tmp_path / "last")]) == 0
    assert "figure: heads 0, 1, 3, 4, 5, 7, 8, 10, 11, 12, 14, 15 of 16 (at most 12" in capsys.readouterr().out
    assert Image.open(tmp_path / "last" / "x_attention.png").size == (1600, 480)  # input, 12 heads, fused, rollout
