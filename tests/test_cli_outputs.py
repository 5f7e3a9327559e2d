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


def test_assumptions_are_one_warning_line_each(tmp_path, capsys):
    """A timm file stores no config: `vit predict` names each assumed field on a line of its own."""
    import numpy as np
    from PIL import Image
    from safetensors.numpy import save_file

    from vit_common.config import ViTConfig
    from vit_common.state import canonical_shapes

    cfg = ViTConfig(image_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)
    rng = np.random.default_rng(0)
    save_file(
        {k: rng.standard_normal(s).astype(np.float32) for k, s in canonical_shapes(cfg).items()},
        tmp_path / "t.safetensors",
    )
    Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "x.png")
    assert main(["predict", str(tmp_path / "t.safetensors"), str(tmp_path / "x.png"), "--set", "num_heads=2"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith(f"vit: warning: {tmp_path / 't.safetensors'}: ") for line in err), err
    assert any("gelu='exact' is assumed" in line for line in err) and not any("num_heads" in line for line in err)
