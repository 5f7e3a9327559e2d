"""Loading a checkpoint into either twin holds the model once (not the file's state beside it), and the
JAX twin can place each parameter on a mesh as it reads it, each device's block alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks.convert_memory import rss_anon
from vit_common.checkpoints.convert import save_checkpoint
from vit_common.config import ViTConfig

ROOT = Path(__file__).resolve().parents[1]

# The child starts its framework, says its anonymous memory, loads the file, says it again.
_CHILD = """
import sys, warnings
warnings.simplefilter("ignore")
import {fw} as twin
{warm}
def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))
print(anon(), flush=True)
model = twin.load_model(sys.argv[1])
print(anon(), flush=True)
"""
_WARM = {
    "vit_jax": "import jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()",
    "vit_torch": "import torch; torch.ones(3) + 1",
}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("fw", ["vit_jax", "vit_torch"])
@pytest.mark.slow  # a child process per twin loading a 77 MB file
def test_loading_holds_the_model_once(fw, tmp_path, random_state):
    """A 77 MB float32 timm file (24 blocks of width 256) loaded in a child process: its peak anonymous
    memory (RssAnon, sampled every 2 ms; mapped file pages are not anonymous) rises by the model's bytes
    plus at most 4 largest tensors and 32 MiB (measured: torch 1.01x the state, JAX 1.29x: the state
    plus 21 MiB that stay after the load, XLA's compiled RNG-state initialiser), where two copies of the
    state would be 2x."""
    cfg = ViTConfig(image_size=224, patch_size=16, width=256, depth=24, num_heads=4, mlp_dim=1024, num_classes=1000)
    state = random_state(cfg)
    largest, total = max(v.nbytes for v in state.values()), sum(v.nbytes for v in state.values())
    save_checkpoint(tmp_path / "src.safetensors", cfg, state, "timm")
    del state
    p = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(fw=fw, warm=_WARM[fw]), str(tmp_path / "src.safetensors")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    peak = 0
    while p.poll() is None:
        peak = max(peak, rss_anon(p.pid) or 0)
        time.sleep(0.002)
    out, err = p.communicate()
    assert p.returncode == 0, err[-3000:]
    before, after = map(int, out.split())
    assert total > 70e6
    assert total <= after - before, "the model holds every tensor"
    assert peak - before <= total + 4 * largest + 32 * 2**20, f"rose {(peak - before) / 2**20:.1f} MiB"


_SHARDED = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from flax import nnx
    import vit_jax
    from vit_jax.weights import to_numpy

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("replica", "fsdp"))
    seen = {}

    def sharding(path, shape):
        seen[path] = shape
        spec = P("fsdp") if shape and shape[0] % 4 == 0 else P()
        return NamedSharding(mesh, spec)

    whole = vit_jax.load_model(sys.argv[1])
    placed = vit_jax.load_model(sys.argv[1], sharding=sharding)
    kernel = placed.blocks[0].attn.qkv.kernel[...]
    a, b = to_numpy(whole), to_numpy(placed)
    print("RESULT " + json.dumps({
        "same": all(a[k].tobytes() == b[k].tobytes() for k in a),
        "paths": len(seen), "tensors": len(a), "qkv_path": "blocks.0.attn.qkv.kernel" in seen,
        "kernel_split": kernel.sharding.spec == P("fsdp"), "block_rows": kernel.addressable_shards[0].data.shape[0],
        "rows": kernel.shape[0],
    }))
""")


def _on_eight_devices(script: str, path: Path) -> dict:
    """Run ``script`` on ``path`` in a child with 8 CPU devices, from the repository root (its conftest
    importable), and return the JSON of its ``RESULT`` line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT ") :])


def test_jax_load_places_each_parameter_on_the_mesh(tmp_path, tiny_cfg, random_state):
    """On 8 CPU devices (a 2 x 4 mesh), ``load_model(sharding=...)`` asks for every parameter by its NNX
    path and returns arrays split as asked, bit-identical to an unsharded load."""
    cfg = tiny_cfg.replace(width=32, mlp_dim=64, num_heads=2)
    save_checkpoint(tmp_path / "m.safetensors", cfg, random_state(cfg), "timm")
    out = _on_eight_devices(_SHARDED, tmp_path / "m.safetensors")
    assert out["same"] and out["qkv_path"] and out["paths"] == out["tensors"]
    assert out["kernel_split"] and out["block_rows"] * 4 == out["rows"] == 32


_INIT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from flax import nnx
    from conftest import _tiny_dataset  # the repository root's, on PYTHONPATH (no pytest here)
    from vit_common.training.train_config import TrainConfig
    from vit_jax.finetune import load_init
    from vit_jax.keys import keys_to_data
    from vit_jax.mesh import make_mesh
    from vit_jax.trainer import Trainer
    from vit_jax.weights import from_numpy

    init = load_init(sys.argv[1], _tiny_dataset(), lazy=True)
    lazy = all(not isinstance(v, np.ndarray) or not v.flags.owndata for v in init.weights.values())
    tcfg = TrainConfig(batch_size=8, epochs=1, ema=0.9, mesh="replica=2,fsdp=4")
    t = Trainer(init.cfg, tcfg, init.data, mesh=make_mesh(tcfg.mesh), weights=init.weights)
    state = t.init_state()

    # the first state as it was built before: the whole model on the host, its Adam state, then placed
    model = from_numpy(init.cfg, {k: np.asarray(v, np.float32) for k, v in init.weights.items()})
    model.train()
    _, params, rest = nnx.split(model, nnx.Param, ...)
    ref = {"step": np.int32(0), "params": params, "rest": rest, "opt_state": t.tx.init(params), "ema": params}
    same = jax.tree.map(lambda a, b: np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b),
                        keys_to_data(state), keys_to_data(ref))
    placed = jax.tree.map(lambda x, s: x.sharding == s, state, t.state_shardings)
    qkv = state["params"]["blocks"][0]["attn"]["qkv"]["kernel"][...]
    ema = state["ema"]["blocks"][0]["attn"]["qkv"]["kernel"][...]
    print("RESULT " + json.dumps({
        "lazy": lazy, "same": all(jax.tree.leaves(same)), "placed": all(jax.tree.leaves(placed)),
        "leaves": len(jax.tree.leaves(same)), "qkv_split": qkv.size // qkv.addressable_shards[0].data.size,
        "ema_own_buffer": ema.addressable_shards[0].data.unsafe_buffer_pointer()
        != qkv.addressable_shards[0].data.unsafe_buffer_pointer(),
    }))
""")


def test_train_init_state_is_read_onto_the_mesh(tmp_path, tiny_cfg, random_state):
    """``vit train --init``'s first state on 8 CPU devices (a 2 x 4 mesh, an EMA): a bfloat16 file read
    lazily, each parameter placed on its sharding as it is read and Adam's state made on the devices, is
    bit for bit the state built whole on the host (float32 weights, ``tx.init``), every leaf on the
    sharding the rules give (qkv's kernel split 4 ways), the EMA in buffers of its own."""
    cfg = tiny_cfg.replace(in_chans=1, width=32, mlp_dim=64)
    state = {k: v.astype("bfloat16") for k, v in random_state(cfg, dtype="float32").items()}
    save_checkpoint(tmp_path / "m.safetensors", cfg.replace(param_dtype="bfloat16"), state, "timm")
    out = _on_eight_devices(_INIT, tmp_path / "m.safetensors")
    assert out == {
        "lazy": True,
        "same": True,
        "placed": True,
        "leaves": out["leaves"],
        "qkv_split": 4,
        "ema_own_buffer": True,
    }
    assert out["leaves"] > 30, out


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
@pytest.mark.slow  # a child process building a Ti/16 train state (23 MB file) on 2 CPU devices
def test_init_memory_benchmark_holds_no_copy_beside_the_state(tmp_path):
    """benchmarks/init_memory.py on Ti/16: the first state of `vit train --init` rises the child's
    anonymous memory by the state (parameters, 2 moments, EMA) plus at most the file and 48 MiB
    (measured: 52 MiB, a fixed cost of JAX's compiles; built whole on the host: 151 MiB, 6.9x the file)."""
    from benchmarks import init_memory

    out = tmp_path / "r.jsonl"
    assert init_memory.main(["--variant", "Ti/16", "--devices", "2", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    params = 4 * 5_717_416  # Ti/16's float32 bytes: the state is 4 of them and the step and counts
    assert 4 * params <= rec["state_bytes"] <= 4 * params + 1024 and rec["file_bytes"] > params
    assert 0 <= rec["beyond_state_bytes"] <= rec["file_bytes"] + 48 * 2**20, rec
