"""Streaming conversion: lazy tensors, the streaming safetensors and .npz writers, sharded HF folders
(``--shard-size``) and the bounded peak anonymous memory of converting between streaming formats."""

from __future__ import annotations

import io
import json
import sys
import zipfile
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save as library_save

from benchmarks.convert_memory import sampled_run
from vit_cli.main import main
from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
from vit_common.checkpoints.formats.hf import HfWriteOptions, shard_bytes, shards
from vit_common.checkpoints.formats.source import HF_INDEX, open_npz, read_safetensors
from vit_common.checkpoints.formats.tensors import LazyTensor, concat_rows, identical, materialize, row_slice, same_bits
from vit_common.config import ViTConfig
from vit_common.state import canonical_shapes, nonfinite, random_state
from vit_common.system.tensor_files import contiguous, write_npz, write_safetensors


def _mixed(rng) -> dict:
    return {
        "b": rng.standard_normal((3, 4)).astype(np.float32),
        "a": rng.standard_normal((5,)).astype(ml_dtypes.bfloat16),
        "c": np.arange(6, dtype=np.int64),
        "t": rng.standard_normal((4, 3)).T,  # a float64 view, not contiguous
        "e": np.zeros((0, 3), np.float16),
        "s": np.array(2.5),
        "u": np.array([True, False]),
    }


def test_lazy_tensor_loads_only_when_asked_and_every_time():
    calls = []
    t = LazyTensor((2, 3), np.float32, lambda: calls.append(1) or np.ones((2, 3), np.float32))
    assert (np.shape(t), np.ndim(t), t.nbytes, t.dtype) == ((2, 3), 2, 24, np.float32) and calls == []
    assert np.asarray(t).sum() == 6 and np.asarray(t, np.float64).dtype == np.float64 and len(calls) == 2
    bad = LazyTensor((3,), np.float32, lambda: np.ones(3, np.float64))
    with pytest.raises(AssertionError, match=r"declared \(3,\) float32 but produced \(3,\) float64"):
        np.asarray(bad)
    assert materialize({"t": t})["t"].flags.writeable


def test_rows_split_and_joined_back_are_the_original_rows():
    """A join's rows are sliced from its parts (the rest unloaded), slices joined back in order are the
    original; ``identical`` knows equal structure without loading; the read-back compares bits."""
    loads = []
    a = LazyTensor((2, 3), np.float32, lambda: loads.append("a") or np.zeros((2, 3), np.float32))
    b = LazyTensor((4, 3), np.float32, lambda: loads.append("b") or np.arange(12, dtype=np.float32).reshape(4, 3))
    fc1 = concat_rows([a, b])
    assert row_slice(fc1, 0, 2) is a and row_slice(fc1, 2, 6) is b and row_slice(fc1, 0, 6) is fc1
    assert np.array_equal(np.asarray(row_slice(fc1, 3, 5)), np.arange(3, 9, dtype=np.float32).reshape(2, 3))
    assert loads == ["b"]
    assert identical(concat_rows([row_slice(fc1, 0, 2), row_slice(fc1, 2, 6)]), concat_rows([a, b]))
    base = np.arange(12.0).reshape(4, 3)
    assert concat_rows([row_slice(base, 0, 1), row_slice(base, 1, 3), row_slice(base, 3, 4)]) is base
    assert identical(row_slice(base, 1, 3), row_slice(base, 1, 3)) and not identical(base, base.copy())
    nan = np.array([np.nan, 1.0], np.float32)
    other_nan = nan.copy()
    other_nan.view(np.uint32)[0] ^= 1  # another NaN payload
    assert same_bits(base.T, np.ascontiguousarray(base.T)) and same_bits(nan, nan.copy())
    assert not same_bits(nan, other_nan)
    assert not same_bits(np.zeros(3), -np.zeros(3)) and same_bits(np.array(2.5), np.array(2.5))
    held = np.zeros((3, 5), np.float32)
    held[2, 1] = np.nan
    assert nonfinite({"t": held.T, "ok": base.T, "f": np.asfortranarray(held)}) == ["t", "f"]


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}, {"z": "1", "format": "pt", "a": "x"}])
def test_streamed_safetensors_are_the_library_bytes(metadata):
    """The same bytes as safetensors.numpy.save, header order and padding included, from lazy tensors;
    with several metadata keys the same header (the library orders them as its hash map iterates, which
    varies from run to run; ours are sorted)."""
    arrays = _mixed(np.random.default_rng(0))
    lazy = {k: LazyTensor(v.shape, v.dtype, lambda v=v: v) for k, v in arrays.items()}
    fh = io.BytesIO()
    n = write_safetensors(fh, lazy, metadata)
    mine, expected = fh.getvalue(), library_save({k: np.array(v, order="C") for k, v in arrays.items()}, metadata)
    assert n == len(mine) == len(expected)
    if len(metadata or {}) < 2:
        assert mine == expected
    h = int.from_bytes(mine[:8], "little")
    assert mine[:8] == expected[:8] and mine[8 + h :] == expected[8 + h :]
    assert json.loads(mine[8 : 8 + h]) == json.loads(expected[8 : 8 + h])
    assert list(json.loads(mine[8 : 8 + h])["__metadata__"] if metadata else []) == sorted(metadata or [])


def test_streamed_npz_reads_back_member_by_member(tmp_path):
    arrays = {k: v for k, v in _mixed(np.random.default_rng(1)).items() if k != "a"}
    with open(tmp_path / "x.npz", "wb") as fh:
        write_npz(fh, {k: LazyTensor(v.shape, v.dtype, lambda v=v: v) for k, v in arrays.items()})
    with zipfile.ZipFile(tmp_path / "x.npz") as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
    with np.load(tmp_path / "x.npz") as z:
        assert sorted(z.files) == sorted(arrays)
        assert all(z[k].dtype == v.dtype and np.array_equal(z[k], v) for k, v in arrays.items())


@pytest.mark.parametrize(
    "shape, perm", [((600, 300), (1, 0)), ((300, 7, 9), (2, 1, 0)), ((5, 3, 16, 16), (2, 3, 1, 0))]
)
def test_tiled_copies_and_comparisons_of_transposed_views(shape, perm):
    """A transposed view (tiles across its edges, read through the staging buffer) is copied to C order
    with its values, and compared bit for bit: one flipped bit in the first or the last tile is found."""
    view = np.random.default_rng(4).standard_normal(shape).astype(np.float32).transpose(perm)
    copy = contiguous(view)
    assert copy.flags.c_contiguous and np.array_equal(copy, view) and same_bits(view, copy) and same_bits(copy, view)
    for at in (0, -1):
        bad = copy.copy()
        bad.view(np.uint32).reshape(-1)[at] ^= 1
        assert not same_bits(view, bad) and not same_bits(bad, view)


def test_a_widened_bfloat16_view_is_cast_once_and_compared_a_tile_at_a_time(monkeypatch):
    """Writing a bfloat16 model to .npz widens it to float32 (``Widened``): loaded, one C-order float32
    copy of a transposed view; its rows, only theirs; compared with the written float32 buffer, tile by
    tile from the bfloat16 base (no float32 copy of the whole), a flipped low bit found."""
    from vit_common.checkpoints.formats.tensors import Widened, row_slice

    view = np.random.default_rng(5).standard_normal((300, 700)).astype(ml_dtypes.bfloat16).T
    wide = Widened(view)
    made, empty = [], np.empty
    monkeypatch.setattr(np, "empty", lambda shape, dtype=float, **kw: made.append(empty(shape, dtype)) or made[-1])
    buffer = np.asarray(wide)
    assert buffer.flags.c_contiguous and buffer.dtype == np.float32 and np.array_equal(buffer, view.astype(np.float32))
    assert [a.nbytes for a in made if a.dtype == np.float32] == [buffer.nbytes]  # the rest: tile-sized stages
    made.clear()
    rows = np.asarray(row_slice(wide, 100, 164))
    assert rows.shape == (64, 300) and np.array_equal(rows, buffer[100:164])
    assert [a.nbytes for a in made if a.dtype == np.float32] == [rows.nbytes]
    monkeypatch.setattr(np, "empty", empty)
    assert same_bits(wide, buffer) and same_bits(buffer, wide)
    bad = buffer.copy()
    bad.view(np.uint32)[-1, -1] ^= 1  # a low bit no bfloat16 value has
    assert not same_bits(wide, bad) and not same_bits(bad, wide)


def test_npz_tensors_are_computed_once_and_checked_as_written(tmp_path, tiny_cfg, monkeypatch):
    """Writing big_vision computes each transposed or reshaped file tensor once: the read-back check
    compares the buffer the writer then writes (a byte changed in it is named, and nothing is written),
    and the file is the one np.savez writes from the same tensors."""
    from vit_common.checkpoints.formats.rules import Piece

    state, made = random_state(tiny_cfg), Counter()
    from_canonical = Piece.from_canonical

    def counted(self, a, dtype=None):
        made[self.key] += 1
        return from_canonical(self, a, dtype)

    monkeypatch.setattr(Piece, "from_canonical", counted)
    save_checkpoint(tmp_path / "m.npz", tiny_cfg, state, "big_vision")
    assert made and set(made.values()) == {1}
    with np.load(tmp_path / "m.npz") as z:
        np.savez(tmp_path / "ref.npz", **{k: z[k] for k in z.files})
    assert (tmp_path / "m.npz").read_bytes() == (tmp_path / "ref.npz").read_bytes()
    assert all(v.tobytes() == state[k].tobytes() for k, v in load_checkpoint(tmp_path / "m.npz").state.items())

    def damaged(self, a, dtype=None):
        out = from_canonical(self, a, dtype)
        if self.key.endswith("MlpBlock_0/Dense_0/kernel"):
            out = out.copy()
            out.view(np.uint32).reshape(-1)[-1] ^= 1
        return out

    monkeypatch.setattr(Piece, "from_canonical", damaged)
    with pytest.raises(AssertionError, match=r"does not read back bit-exact: \['blocks.0.mlp.fc1.weight'\]"):
        save_checkpoint(tmp_path / "bad.npz", tiny_cfg, state, "big_vision")
    assert not (tmp_path / "bad.npz").exists()


def test_npz_members_are_mapped_or_inflated_lazily(tmp_path):
    """Stored members are read-only views of the file; compressed ones LazyTensors; both bit-exact."""
    rng = np.random.default_rng(2)
    arrays = {"w": rng.standard_normal((5, 7)).astype(np.float32), "f": np.asfortranarray(rng.standard_normal((3, 4)))}
    np.savez(tmp_path / "s.npz", **arrays)
    np.savez_compressed(tmp_path / "c.npz", **arrays)
    stored, packed = open_npz(tmp_path / "s.npz"), open_npz(tmp_path / "c.npz")
    assert all(isinstance(v, np.ndarray) and not v.flags.writeable for v in stored.values())
    assert all(isinstance(v, LazyTensor) for v in packed.values())
    for got in (stored, packed):
        assert all(np.array_equal(np.asarray(got[k]), v) and np.shape(got[k]) == v.shape for k, v in arrays.items())


def test_safetensors_are_read_as_views_of_the_file(tmp_path):
    arrays = _mixed(np.random.default_rng(3))
    (tmp_path / "x.safetensors").write_bytes(library_save({k: np.array(v, order="C") for k, v in arrays.items()}))
    got, _ = read_safetensors(tmp_path / "x.safetensors")
    assert all(got[k].dtype == v.dtype and np.array_equal(got[k], v) for k, v in arrays.items())
    assert not got["b"].flags.writeable and not got["b"].flags.owndata


@pytest.mark.parametrize(
    "text, n", [("123", 123), ("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("4GiB", 4 * 2**30), ("1.5kib", 1536)]
)
def test_shard_size_units(text, n):
    assert shard_bytes(text) == n == HfWriteOptions(shard_size=text).shard_bytes


def test_shards_fill_in_order_and_a_big_tensor_goes_alone():
    t = {k: np.zeros(n, np.uint8) for k, n in (("a", 40), ("b", 50), ("c", 120), ("d", 30), ("e", 80))}
    assert shards(t, None) == [("model.safetensors", list("abcde"))]
    assert shards(t, 1000) == [("model.safetensors", list("abcde"))]
    assert shards(t, 100) == [
        ("model-00001-of-00004.safetensors", ["c"]),  # as huggingface_hub: a big tensor's shard comes first
        ("model-00002-of-00004.safetensors", ["a", "b"]),
        ("model-00003-of-00004.safetensors", ["d"]),
        ("model-00004-of-00004.safetensors", ["e"]),
    ]


@pytest.fixture
def small(tmp_path, tiny_cfg) -> Path:
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, tiny_cfg, random_state(tiny_cfg), "timm")
    return path


@pytest.mark.parametrize("value", ["0", "abc", "-1", "0.1", "5XB"])
def test_bad_shard_size_is_one_line_exit_2_nothing_written(value, small, tmp_path, capsys):
    assert main(["convert", str(small), str(tmp_path / "out"), "--to", "hf", "--shard-size", value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--shard-size {value!r}: expected a size of at least 1 byte" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_sharded_hf_folder_reads_back_bit_exact(small, tmp_path, capsys):
    assert main(["convert", str(small), str(tmp_path / "out"), "--to", "hf", "--shard-size", "2KB"]) == 0
    index = json.loads((tmp_path / "out" / HF_INDEX).read_text())
    files = sorted(p.name for p in (tmp_path / "out").glob("model-*.safetensors"))
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == files
    sizes = {}
    for name in files:
        held, _ = read_safetensors(tmp_path / "out" / name)
        sizes[name] = sum(v.nbytes for v in held.values())
        assert sizes[name] <= 2000 or len(held) == 1
    assert index["metadata"]["total_size"] == sum(sizes.values())
    src, back = load_checkpoint(small), load_checkpoint(tmp_path / "out")
    assert back.state.keys() == src.state.keys()
    assert all(v.tobytes() == back.state[k].tobytes() for k, v in src.state.items())


# The child converts and says its anonymous memory after its imports; the parent samples it meanwhile.
_CHILD = """
import sys
from vit_common.checkpoints.convert import convert
def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))
print(anon(), flush=True)
convert(sys.argv[1], sys.argv[2], to_fmt=sys.argv[3])
"""
# One block whose MLP dwarfs the rest (fc1: 16 MiB of float32), so that any copy of it shows; a
# DINOv3 backbone's SwiGLU fc1 (gate and up rows, 2 x 8192 x 256) is split and joined between formats.
_WIDE = dict(patch_size=16, width=256, depth=1, num_heads=4)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize(
    "source, to, dst, copies",
    [
        ("timm", "hf", "out", 0),
        ("timm", "big_vision", "out.npz", 1),  # the transposed kernel
        ("hf_dinov3", "hf_dinov3", "out", 0),
        ("hf_dinov3", "timm", "out.safetensors", 1),  # the gate and up rows joined
    ],
)
def test_converting_between_streaming_formats_holds_one_tensor(source, to, dst, copies, tmp_path, monkeypatch):
    """A 34 MB float32 file whose largest tensor is 16 MiB, converted in a child process: its peak
    anonymous memory (RssAnon, sampled every 2 ms; mapped file pages are not anonymous) rises above what
    it held after its imports by at most 8 MiB plus the ``copies`` of the largest tensor the target
    layout must compute (a transpose, a join; none where it is written straight from the mapped file).
    Measured: 4.5, 20.5, 2.5 and 18.5 MiB; before, 20.4, 35.8, 64.4 and 41.6 MiB (the read-back check
    held a byte mask of each tensor's size beside it, and a SwiGLU's split fc1 was joined and split
    again)."""
    from benchmarks import convert_memory

    if source == "timm":
        cfg = ViTConfig(image_size=32, num_classes=10, mlp_dim=16384, **_WIDE)
    else:
        monkeypatch.setitem(convert_memory.DINOV3_SHAPES, "wide", dict(mlp_dim=8192, **_WIDE))
        cfg = convert_memory.dinov3_config("wide", "float32")
    state = random_state(cfg)
    largest = max(v.nbytes for v in state.values())
    src = tmp_path / ("src.safetensors" if source == "timm" else "src")
    save_checkpoint(src, cfg, state, source)
    del state
    _, peak, out, _ = sampled_run([sys.executable, "-c", _CHILD, str(src), str(tmp_path / dst), to], 0.002)
    rise = peak - int(out.split()[0])
    assert largest == 16 * 2**20
    assert rise <= copies * largest + 8 * 2**20, f"peak anonymous memory rose {rise / 2**20:.1f} MiB"
    assert load_checkpoint(tmp_path / dst).state.keys() == canonical_shapes(cfg).keys()


# The child starts torch before it says its anonymous memory, then converts with its reader and writer.
_TORCH_CHILD = """
import sys
import torch
from vit_torch.formats import READERS, WRITERS
from vit_common.checkpoints.convert import convert
with open("/proc/self/status") as f:
    print(next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:")), flush=True)
convert(sys.argv[1], sys.argv[2], to_fmt="timm", readers=READERS, writers=WRITERS)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_a_torch_pickle_is_read_memory_mapped(tmp_path):
    """A 34 MB timm .pth (torch.save's zip format) converted to .safetensors in a child process: torch
    maps the file (``torch.load(mmap=True)``, weights only) and its tensors pass as views, so the peak
    anonymous memory rises by at most 8 MiB (measured 4.6 MiB), where reading it whole rose by 1.9x
    the file (65 MiB: torch's copy, then numpy's)."""
    from vit_torch.formats import WRITERS

    cfg = ViTConfig(image_size=32, num_classes=10, mlp_dim=16384, **_WIDE)
    state = random_state(cfg)
    save_checkpoint(tmp_path / "src.pth", cfg, state, "timm", writers=WRITERS)
    size = (tmp_path / "src.pth").stat().st_size
    child = [sys.executable, "-c", _TORCH_CHILD, str(tmp_path / "src.pth"), str(tmp_path / "out.safetensors")]
    _, peak, out, _ = sampled_run(child, 0.002)
    rise = peak - int(out.split()[0])
    assert size > 33e6 and rise <= 8 * 2**20, f"peak anonymous memory rose {rise / 2**20:.1f} MiB ({rise / size:.2f}x)"
    back = load_checkpoint(tmp_path / "out.safetensors").state
    assert all(back[k].tobytes() == v.tobytes() for k, v in state.items())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_a_torch_pickle_is_written_one_computed_tensor_at_a_time(tmp_path):
    """A 34 MB big_vision .npz, every kernel of which timm's layout transposes, converted to a timm .pth
    in a child process: ``torch.save`` writes the pickle without the tensors' bytes and each record is
    filled from its tensor as it is computed, so the peak anonymous memory rises by at most 8 MiB plus
    the largest computed tensor (16 MiB; measured 20.5 MiB), where handing ``torch.save`` the whole
    state rose by 36.5 MiB (every transposed kernel at once)."""
    from vit_common.checkpoints.formats.zip_members import verify_zip
    from vit_torch.formats import READERS

    cfg = ViTConfig(image_size=32, num_classes=10, mlp_dim=16384, **_WIDE)
    state = random_state(cfg)
    largest = max(v.nbytes for v in state.values())
    save_checkpoint(tmp_path / "src.npz", cfg, state, "big_vision")
    child = [sys.executable, "-c", _TORCH_CHILD, str(tmp_path / "src.npz"), str(tmp_path / "out.pth")]
    _, peak, out, _ = sampled_run(child, 0.002)
    rise = peak - int(out.split()[0])
    assert largest == 16 * 2**20 and rise <= largest + 8 * 2**20, f"peak anonymous memory rose {rise / 2**20:.1f} MiB"
    assert verify_zip(tmp_path / "out.pth") == []
    back = load_checkpoint(tmp_path / "out.pth", readers=READERS).state
    assert back.keys() == state.keys() and all(back[k].tobytes() == v.tobytes() for k, v in state.items())


# The child starts JAX and orbax before it says its anonymous memory, then converts as `vit convert` does.
_ORBAX_CHILD = """
import sys
import jax, vit_jax.formats
from vit_cli.main import main
jax.jit(lambda x: x + 1)(1.0).block_until_ready()
with open("/proc/self/status") as f:
    print(next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:")), flush=True)
sys.exit(main(["convert", sys.argv[1], sys.argv[2], "--to", "orbax", "--json"]))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
@pytest.mark.slow  # a child process writing a 77 MB orbax folder
def test_converting_to_orbax_holds_less_than_the_file(tmp_path):
    """The same 77 MB file converted to orbax in a child process (JAX started before the baseline): orbax
    is given memory-mapped views of the file's tensors and writes them without deep copies, in OCDBT data
    files of 4 MiB, so the peak rises by at most the goal of 1.2x the file plus 16 MiB (measured 0.62 to
    0.98x; 0.99 to 1.17x with orbax's 2 GB data files, whose bytes it held until it wrote them), where
    the JAX twin's copy of the model plus orbax's copies rose by 2x."""
    cfg = ViTConfig(image_size=224, patch_size=16, width=256, depth=24, num_heads=4, mlp_dim=1024, num_classes=1000)
    save_checkpoint(tmp_path / "src.safetensors", cfg, random_state(cfg), "timm")
    total = (tmp_path / "src.safetensors").stat().st_size
    child = [sys.executable, "-c", _ORBAX_CHILD, str(tmp_path / "src.safetensors"), str(tmp_path / "out")]
    _, peak, out, _ = sampled_run(child, 0.002)
    rise = peak - int(out.split()[0])
    assert rise <= 1.2 * total + 16 * 2**20, f"peak anonymous memory rose {rise / 2**20:.1f} MiB ({rise / total:.2f}x)"
    assert (tmp_path / "out" / "state").is_dir()


@pytest.mark.slow
def test_convert_memory_benchmark_records_every_contender(tmp_path, capsys):
    """benchmarks/convert_memory.py on Ti/16 (one round, cp and hf, hf also with this checkout's code as
    the baseline): a record per contender with its peak anonymous memory, wall and CPU time beside cp's,
    the baseline's commit and the CPU flags."""
    from benchmarks import convert_memory

    out, root = tmp_path / "r.jsonl", Path(__file__).resolve().parents[1]
    argv = ["--variant", "Ti/16", "--to", "hf", "--repeats", "1", "--baseline", str(root), "--out", str(out)]
    assert convert_memory.main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["contender"] for r in records] == ["cp", "hf", "hf@baseline"]
    cp, hf, _ = records
    assert hf["file_bytes"] == cp["file_bytes"] > 4 * 5_717_416 and cp["wall_vs_cp"] == cp["cpu_vs_cp"] == 1
    assert 0 < hf["rise_anon_bytes"] < hf["peak_anon_bytes"] and hf["wall_vs_cp"] > 0 and hf["cpu_median_s"] > 0
    assert len(hf["baseline_commit"]) == 40
    assert hf["machine"]["cpu_flags"] is not None and "| hf |" in capsys.readouterr().out


def test_convert_memory_benchmark_dinov3_source_is_removed(tmp_path, monkeypatch):
    """--dinov3: the 7B/16 spec has timm vit_7b_patch16_dinov3's 6,716,030,976 parameters; a shrunk spec
    is written as a dinov3_vit folder (its conversions run as the test above runs them), copied, and every
    file is removed."""
    from benchmarks import convert_memory

    assert convert_memory.dinov3_config("7B/16", "bfloat16").param_count() == 6_716_030_976
    monkeypatch.setitem(
        convert_memory.DINOV3_SHAPES, "tiny", dict(patch_size=16, width=64, depth=2, num_heads=2, mlp_dim=128)
    )
    out, work = tmp_path / "r.jsonl", tmp_path / "work"
    argv = ["--dinov3", "--variant", "tiny", "--dtype", "bfloat16", "--to", "", "--repeats", "1", "--dir", str(work)]
    assert convert_memory.main([*argv, "--out", str(out)]) == 0
    (cp,) = (json.loads(line) for line in out.read_text().splitlines())
    assert (cp["contender"], cp["source_format"], cp["variant"]) == ("cp", "hf_dinov3", "dinov3 tiny")
    assert cp["largest_tensor_bytes"] == 64 * 3 * 16 * 16 * 2 and cp["params"] == 133_120
    assert list(work.iterdir()) == []


def test_convert_memory_benchmark_meta_pth_source_is_kept_and_reused(tmp_path, monkeypatch, capsys):
    """--source dinov3_original: a shrunk DINOv3 spec written as a Meta .pth by streaming, which reads
    back (torch's reader) bit for bit as the benchmark's tensors; with --keep-source it stays beside its
    note and the next run reuses it. The DINOv3 formats without --dinov3 are refused in one line."""
    from benchmarks import convert_memory
    from vit_torch.formats import READERS

    monkeypatch.setitem(
        convert_memory.DINOV3_SHAPES, "tiny", dict(patch_size=16, width=64, depth=2, num_heads=2, mlp_dim=128)
    )
    for bad in (["--source", "dinov3_original"], ["--to", "dinov3_original"], ["--dinov3", "--source", "timm"]):
        with pytest.raises(SystemExit) as e:
            convert_memory.main([*bad, "--variant", "7B/16"])
        assert e.value.code == 2 and "need --dinov3" in capsys.readouterr().err
    out, work = tmp_path / "r.jsonl", tmp_path / "work"
    argv = ["--dinov3", "--variant", "tiny", "--dtype", "bfloat16", "--source", "dinov3_original", "--to", ""]
    argv += ["--repeats", "1", "--dir", str(work), "--keep-source"]
    assert convert_memory.main([*argv, "--out", str(out)]) == 0
    (cp,) = (json.loads(line) for line in out.read_text().splitlines())
    assert (cp["source_format"], cp["params"]) == ("dinov3_original", 133_120)
    assert sorted(p.name for p in work.iterdir()) == ["src_meta.pth", "src_meta.pth.json"]
    cfg = convert_memory.dinov3_config("tiny", "bfloat16")
    got = materialize(load_checkpoint(work / "src_meta.pth", readers=READERS, source_image_size=224).state)
    want = materialize(convert_memory.random_lazy_state(cfg, "bfloat16"))
    assert got.keys() == want.keys() | {"rope.periods"} and all(
        np.array_equal(got[k].view(np.uint16), want[k].view(np.uint16)) for k in want
    )
    assert convert_memory.main(argv) == 0 and "# reusing the source kept in" in capsys.readouterr().out


def test_a_conversion_streams_a_model_larger_than_the_memory_limit_that_loading_refuses(tmp_path, monkeypatch):
    """The memory check of a conversion counts the activations its config declares, not its parameters,
    which pass through one tensor at a time: a model whose float32 parameters exceed VIT_MAX_BYTES converts
    (bit for bit) while loading it into memory is refused, and a declared image size that would not fit
    is still refused in the conversion."""
    from vit_common.system.validate import model_bytes

    cfg = ViTConfig(image_size=32, patch_size=8, width=64, depth=2, num_heads=2, mlp_dim=128, num_classes=5)
    state = random_state(cfg)
    save_checkpoint(tmp_path / "m.safetensors", cfg, state, "timm")
    limit = (model_bytes(cfg) + model_bytes(cfg, parameters=False)) // 2
    monkeypatch.setenv("VIT_MAX_BYTES", str(limit))
    with pytest.raises(ValueError, match="parameters and activations"):
        load_checkpoint(tmp_path / "m.safetensors")
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "o.safetensors")]) == 0
    monkeypatch.delenv("VIT_MAX_BYTES")
    out = load_checkpoint(tmp_path / "o.safetensors").state
    assert all(same_bits(out[k], v) for k, v in state.items())
    monkeypatch.setenv("VIT_MAX_BYTES", str(limit))
    with pytest.raises(SystemExit) as e:
        main(
            ["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "big.safetensors"), "--set", "image_size=4096"]
        )
    assert e.value.code == 2 and not (tmp_path / "big.safetensors").exists()
