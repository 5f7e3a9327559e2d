"""What the commands say about assumed config fields (one block and the summary line, not a warning per
field), and a field given once travelling with the file into the formats that can hold it (issue 25,
item 1): files written by timm itself, read back by transformers."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from vit_cli.main import main
from vit_common.tolerance import compare

# what a timm file leaves to be assumed (timm files store no config), in the order the commands print it
ASSUMED = ("image_size", "num_heads", "ln_eps", "gelu", "pool", "posemb_prefix")
SUMMARY = "6 fields assumed: " + ", ".join(ASSUMED)
MENTION = re.compile(r"\b(" + "|".join(ASSUMED) + r") ?=")  # a line naming an assumed field and its value
FIELD_LINE = re.compile(r"^\s+(\w+) = (.+?) \((.+)\)$")  # the block's lines: field = value (why)


@pytest.fixture
def timm_file(tmp_path, timm_vit):
    """A timm model of width 32 with 2 heads (the head count the variant table gives that width, so
    every assumption is right), its state_dict saved by safetensors as timm users do, and one image."""
    tm = timm_vit(num_heads=2)
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, tmp_path / "t.safetensors")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "x.png")
    return tm, tmp_path / "t.safetensors"


def _block(lines: list[str]) -> list[str]:
    """The assumption block: the line naming the fields and the field lines after it."""
    start = next(i for i, line in enumerate(lines) if SUMMARY + " (the file does not state them" in line)
    return lines[start : start + 1 + len(ASSUMED)]


def _check_block(lines: list[str]) -> None:
    block = _block(lines)
    assert "give each with --set FIELD=VALUE (the size: --source-image-size HxW), or --strict" in block[0]
    fields = [FIELD_LINE.match(line) for line in block[1:]]
    assert all(fields) and [m[1] for m in fields] == list(ASSUMED), block
    assert fields[3][2] == "'exact'" and fields[3][3] == "not stored; timm's default nn.GELU (exact erf)"
    assert not any("is assumed" in line for line in lines), "no warning per field"


@pytest.mark.slow
def test_each_command_prints_the_assumptions_as_one_block_and_names_them_in_its_summary(timm_file, capsys):
    """convert to .npz and to an HF folder, info, predict and parity of a timm file: a header line and
    one line per assumed field (field = value (why)), the fields named in the wrote / verdict line, and
    no other line naming an assumed field's value but what the written format cannot hold."""
    _, path = timm_file
    folder = path.parent

    def run(*argv) -> tuple[list[str], list[str]]:
        assert main([*argv]) == 0
        out = capsys.readouterr()
        return out.out.splitlines(), out.err.splitlines()

    def mentions(lines):
        cut = lines.index("load it with:") if "load it with:" in lines else len(lines)  # the library call
        return [line for line in lines[:cut] if MENTION.search(line)]

    out, _ = run("convert", str(path), str(folder / "t.npz"))
    _check_block(out)
    assert _block(out)[0].startswith("assumed  " + SUMMARY)
    assert any(line == f"wrote    {folder / 't.npz'} (big_vision); {SUMMARY}" for line in out)
    lost = [line for line in out if line.startswith("WARNING")]
    assert lost == [
        "WARNING  big_vision files cannot hold gelu='exact' (it reads back as 'tanh'); pass --set gelu=exact when "
        "reading the file",
        "WARNING  big_vision files cannot record that image_size, num_heads, pool, posemb_prefix were assumed (the "
        "source did not state them): readers of this file will take them as derived",
    ]
    assert len(mentions(out)) == len(ASSUMED) + 1  # the block and what .npz cannot hold (gelu)

    out, _ = run("convert", str(path), str(folder / "hf"), "--to", "hf", "--accept-assumed", "all")
    _check_block(out)
    assert f"wrote    {folder / 'hf'} (hf); {SUMMARY}" in out and not any(line.startswith("WARNING") for line in out)
    assert len(mentions(out)) == len(ASSUMED)

    out, _ = run("info", str(path))
    _check_block(out)
    assert len(mentions(out)) == len(ASSUMED) and not any("WARNING" in line for line in out)

    out, err = run("predict", str(path), str(folder / "x.png"))
    assert err[0].startswith(f"vit: warning: {path}: {SUMMARY} (")
    _check_block(err)
    assert len(err) == 1 + len(ASSUMED) + 1 and err[-1].startswith(f"vit: warning: {path}: preprocessing assumed")

    out, _ = run("parity", str(path))
    _check_block(out)
    assert len(mentions(out)) == len(ASSUMED)
    assert out[-1].startswith(f"PASS UNDER ASSUMPTIONS ({SUMMARY}): every tensor within its tolerance")


def test_a_gelu_given_once_reaches_the_hf_config_and_transformers_computes_exact_gelu(timm_file, capsys, images):
    """timm file -> big_vision .npz -> original ViT .npz with --set gelu=exact -> HF folder. A .npz cannot
    hold GELU: writing one says so, and the next read says the format cannot hold it (assumed tanh
    again); given again where it is read for the HF folder, config.json states "gelu", the folder reads
    back with nothing assumed, and transformers' logits equal the exact-GELU timm model's, where the
    tanh reading the chain used to write is beyond the float32 bound."""
    from transformers import ViTForImageClassification

    tm, path = timm_file
    d = path.parent
    assert main(["convert", str(path), str(d / "bv.npz")]) == 0
    capsys.readouterr()
    assert main(["convert", str(d / "bv.npz"), str(d / "orig.npz"), "--to", "original_vit", "--set", "gelu=exact"]) == 0
    out = capsys.readouterr().out
    assert (
        "WARNING  original_vit files cannot hold gelu='exact' (it reads back as 'tanh'); pass --set gelu=exact" in out
    )
    assert main(["info", str(d / "orig.npz"), "--json"]) == 0
    read = json.loads(capsys.readouterr().out)
    assert read["provenance"]["gelu"]["kind"] == "assumed" and "gelu" in read["assumed"]
    assert read["provenance"]["gelu"]["source"].startswith(".npz files cannot hold the GELU")
    # without the values an HF config.json would state the guesses as fact: refused, naming them
    assert main(["convert", str(d / "orig.npz"), str(d / "hf"), "--to", "hf"]) == 2
    assert "gelu='tanh'" in capsys.readouterr().err and not (d / "hf").exists()
    given = ["--set", "gelu=exact", "--set", "ln_eps=1e-6", "--set", "posemb_prefix=true", "--source-image-size", "32"]
    assert main(["convert", str(d / "orig.npz"), str(d / "hf"), "--to", "hf", *given]) == 0
    capsys.readouterr()
    config = json.loads((d / "hf" / "config.json").read_text())
    assert config["hidden_act"] == "gelu" and config["layer_norm_eps"] == 1e-6 and "vit_assumed" not in config
    assert main(["info", str(d / "hf"), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["assumed"] == [] and again["provenance"]["gelu"]["kind"] == "declared"

    x = torch.from_numpy(images(2, (32, 32)))
    with torch.no_grad():
        ref = tm(x).numpy()
        hf = ViTForImageClassification.from_pretrained(d / "hf").eval()(pixel_values=x).logits.numpy()
        tanh = ViTForImageClassification.from_pretrained(d / "hf", hidden_act="gelu_pytorch_tanh").eval()
        tanh = tanh(pixel_values=x).logits.numpy()
    assert compare("logits", hf, ref, "tensor", "float32").ok, compare("logits", hf, ref, "tensor", "float32")
    assert not compare("logits", tanh, ref, "tensor", "float32").ok  # what the chain wrote before
