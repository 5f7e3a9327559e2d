"""Property tests: readers fed random and corrupted input raise only the documented errors, and a failed
conversion writes nothing. Documented: FileNotFoundError, and ValueError subclasses (FormatError for
unreadable or unknown input, StateMismatchError for tensors that do not fit)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vit_common.checkpoints.convert import convert, load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.npz import NpzWriteOptions
from vit_common.system.io import save_safetensors

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def _workdir():
    """A fresh folder with an empty 'out' subfolder for conversions, removed afterwards."""
    work = Path(tempfile.mkdtemp())
    (work / "out").mkdir()
    try:
        yield work
    finally:
        shutil.rmtree(work)


def _expect_documented(path: Path, out_dir: Path) -> None:
    """Read ``path`` and convert it into ``out_dir``: success, or a documented error and nothing written."""
    try:
        load_checkpoint(path)
    except ValueError:  # FormatError and StateMismatchError are ValueErrors
        pass
    for dst in ("out.npz", "out.safetensors", "out_hf"):
        try:
            convert(path, out_dir / dst, to_fmt="hf" if dst == "out_hf" else None)
        except ValueError:  # (HF refuses fields a damaged-but-readable file leaves assumed: the others may exist)
            left = [p.name for p in out_dir.iterdir() if p.name == dst or p.name.startswith(".vit-tmp-")]
            assert not left, f"a failed conversion left files behind: {left}"


ROOT = Path(tempfile.mkdtemp(prefix="vit-fuzz-"))


@pytest.fixture
def originals(small_cfg, random_state) -> dict[str, Path]:
    """One valid file (or folder) per reader, written once per test process."""
    if not (ROOT / "done").exists():
        state = random_state(small_cfg)
        save_checkpoint(ROOT / "canonical.safetensors", small_cfg, state)
        save_checkpoint(ROOT / "timm.safetensors", small_cfg, state, "timm")
        save_checkpoint(ROOT / "hf", small_cfg, state, "hf")
        save_checkpoint(ROOT / "bv.npz", small_cfg, state, "big_vision", options=NpzWriteOptions(scan=True))
        save_checkpoint(ROOT / "vit.npz", small_cfg, state, "original_vit")
        (ROOT / "done").touch()
    return {p.name: p for p in ROOT.iterdir() if p.name != "done"}


FILES = ["canonical.safetensors", "timm.safetensors", "bv.npz", "vit.npz", "hf/model.safetensors"]


@SETTINGS
@given(data=st.binary(max_size=512))
def test_random_bytes(data):
    with _workdir() as work:
        (work / "in.bin").write_bytes(data)
        _expect_documented(work / "in.bin", work / "out")


@pytest.mark.slow
@SETTINGS
@given(
    which=st.sampled_from(FILES),
    cut=st.floats(0, 1, exclude_max=True),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), max_size=4),
)
def test_truncated_and_corrupted_files(originals, which, cut, flips):
    with _workdir() as work:
        src = originals[which.split("/")[0]]
        target = work / src.name
        shutil.copytree(src, target) if src.is_dir() else shutil.copy(src, target)
        f = target / "model.safetensors" if src.is_dir() else target
        data = bytearray(f.read_bytes())
        for pos, x in flips:
            data[int(pos * len(data))] ^= x
        if flips or cut:
            data = data[: max(1, int(len(data) * (1 - cut)))] if cut else data
        f.write_bytes(bytes(data))
        _expect_documented(target, work / "out")


KEYS = [
    "patch_embed.proj.weight",
    "cls_token",
    "pos_embed",
    "blocks.0.norm1.weight",
    "blocks.0.mlp.fc1.weight",
    "blocks.0.attn.qkv.weight",
    "blocks.0.attn.q_norm.weight",
    "reg_token",
    "head.weight",
    "norm.weight",
    "embeddings.patch_embeddings.projection.weight",
    "vit.embeddings.position_embeddings",
    "encoder.layer.0.layernorm_before.weight",
    "encoder.layer.0.intermediate.dense.weight",
]


@pytest.mark.slow
@SETTINGS
@given(
    spec=st.dictionaries(
        st.sampled_from(KEYS), st.lists(st.integers(0, 6), min_size=0, max_size=4), min_size=1, max_size=8
    )
)
def test_random_tensor_sets(spec):
    with _workdir() as work:
        save_safetensors(work / "in.safetensors", {k: np.ones(s, np.float32) for k, s in spec.items()})
        _expect_documented(work / "in.safetensors", work / "out")


@pytest.mark.slow
@SETTINGS
@given(
    edits=st.dictionaries(
        st.sampled_from(
            [
                "hidden_size",
                "num_attention_heads",
                "image_size",
                "patch_size",
                "layer_norm_eps",
                "hidden_act",
                "id2label",
                "model_type",
                "qkv_bias",
                "num_hidden_layers",
            ]
        ),
        st.one_of(
            st.none(),
            st.integers(-3, 300),
            st.text(max_size=4),
            st.floats(),
            st.lists(st.integers(0, 64), max_size=3),
        ),
        min_size=1,
    )
)
def test_corrupted_hf_config(originals, edits):
    with _workdir() as work:
        shutil.copytree(originals["hf"], work / "hf")
        config = json.loads((work / "hf" / "config.json").read_text())
        config.update(edits)
        (work / "hf" / "config.json").write_text(json.dumps(config))
        _expect_documented(work / "hf", work / "out")


@pytest.mark.slow
@SETTINGS
@given(
    meta=st.one_of(
        st.text(max_size=30),
        st.dictionaries(
            st.sampled_from(["width", "depth", "image_size", "ln_eps", "gelu", "bogus"]),
            st.one_of(st.integers(-2, 99), st.text(max_size=3), st.none()),
            min_size=1,
        ),
    )
)
def test_corrupted_stored_config(small_cfg, random_state, meta):
    with _workdir() as work:
        stored = json.dumps({**small_cfg.to_dict(), **meta}) if isinstance(meta, dict) else meta
        save_safetensors(
            work / "in.safetensors",
            random_state(small_cfg),
            {"format": "vit-twins/canonical/1", "vit_config": stored},
        )
        _expect_documented(work / "in.safetensors", work / "out")
