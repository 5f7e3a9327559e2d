"""Commands refuse an output file vit did not write before their work, not after it (exit 2, file kept)."""

from __future__ import annotations

import pytest

import vit_cli.parity
import vit_cli.run_model
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

    monkeypatch.setattr(vit_cli.run_model, "load_with_info", work)
    monkeypatch.setattr(vit_cli.parity, "run_parity", work)
    assert main([a.format(out=out) for a in argv]) == 2
    assert str(out) in capsys.readouterr().err
    assert out.read_bytes() == b"the user's own picture"
