"""Every 2-D mesh of 8 simulated CPU devices (1x8, 2x4, 8x1: replica x fsdp) trains as one device does,
step for step, and a checkpoint written on one mesh restores exactly on another (2x4 -> 8x1 -> 1x1), its
checksums (vit_jax.state_checksums, recorded on one mesh and checked on the next) the same on each.

XLA_FLAGS must be set before jax is imported, so the comparison runs in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MESHES = ("replica=1,fsdp=8", "replica=2,fsdp=4", "replica=8,fsdp=1")

SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    import jax, numpy as np
    from flax import nnx
    from conftest import TINY, _tiny_dataset  # the repository root's, on PYTHONPATH (no pytest here)
    from vit_common.config import ViTConfig
    from vit_common.tolerance import compare
    from vit_jax.checkpointing import Checkpoints
    from vit_jax.data import iterate, train_batches
    from vit_jax.keys import keys_to_data
    from vit_jax.mesh import make_mesh
    from vit_jax.state_checksums import checksums
    from vit_common.training.train_config import TrainConfig
    from vit_jax.trainer import Trainer, sharded_abstract

    MESHES = json.loads(sys.argv[1])
    assert jax.device_count() == 8, jax.devices()
    data = _tiny_dataset(n_train=36, n_test=8)
    # tiny_dataset's one channel; every kernel has an axis that 8 divides
    cfg = ViTConfig(**TINY).replace(in_chans=1, width=32, mlp_dim=64)
    d = cfg.width

    def trainer(spec, devices=None):
        tcfg = TrainConfig(batch_size=16, epochs=3, warmup_steps=2, mesh=spec)
        return Trainer(cfg, tcfg, data, mesh=make_mesh(spec, devices))

    def flat(state):
        params = {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(state["params"])}
        # The key bias gets an exactly-zero gradient (softmax ignores a shift shared by all keys), so
        # its Adam updates are normalised rounding noise, which differs with the reduction order.
        params["blocks.0.attn.qkv.bias"] = np.delete(params["blocks.0.attn.qkv.bias"], np.s_[d:2 * d])
        return params

    def run(t):
        state, steps = t.init_state(), []
        it = iterate(train_batches(data.train, 3, batch_size=16, epochs=3, seed=0, transform=t.train_transform))
        for _ in range(5):  # the third step is the partial last batch of epoch 1 (36 = 16 + 16 + 4)
            state, m = t.train_step(state, next(it))
            steps.append((float(m["loss"]), flat(state)))
        return state, steps

    _, ref = run(trainer("replica=1,fsdp=1", jax.devices()[:1]))
    out, states = {}, {}
    for spec in MESHES:
        t = trainer(spec)
        states[spec], steps = run(t)
        loss_rel = max(abs(a[0] - b[0]) / abs(b[0]) for a, b in zip(steps, ref))
        param_rel = max(compare(k, a[1][k], b[1][k], "tensor", "float32").rel for a, b in zip(steps, ref) for k in b[1])
        sharded = sum(s.spec != jax.sharding.PartitionSpec() for s in jax.tree.leaves(t.state_shardings))
        qkv = states[spec]["opt_state"][1][0].mu["blocks"][0]["attn"]["qkv"]["kernel"][...]
        split = qkv.addressable_shards[0].data.size * 8 // qkv.size
        out[spec] = {"loss_rel": loss_rel, "param_rel": param_rel, "sharded": sharded, "split": split}

    # 2x4 -> 8x1 -> 1x1: each restore onto the new trainer's shardings, then saved from there
    def host(state):
        return jax.tree.map(np.asarray, jax.device_get(keys_to_data(state)))

    saved, chain = host(states["replica=2,fsdp=4"]), []
    recorded = checksums(states["replica=2,fsdp=4"])  # also what each save records and each restore checks
    state, folder = states["replica=2,fsdp=4"], tempfile.mkdtemp()
    for i, (spec, devices) in enumerate([("replica=8,fsdp=1", None), ("replica=1,fsdp=1", jax.devices()[:1])]):
        ckpt = Checkpoints(f"{folder}/{i}")
        ckpt.save(5, state, {})
        ckpt.wait()
        t = trainer(spec, devices)
        state, _ = ckpt.restore(sharded_abstract(t))
        exact = all(jax.tree.leaves(jax.tree.map(np.array_equal, host(state), saved)))
        placed = jax.tree.leaves(jax.tree.map(lambda x, s: x.sharding == s, state, t.state_shardings))
        devices, same = len(state["step"].devices()), checksums(state) == recorded
        chain.append({"mesh": spec, "exact": exact, "placed": all(placed), "devices": devices, "checksums": same})
    out["restore"] = chain
    print("RESULT " + json.dumps(out))
""")


def test_every_mesh_of_8_devices_matches_one_device_and_restores_on_another():
    # XLA:CPU optimisation level 0 halves the compile time; both sides of the comparison use it.
    flags = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    env = {**os.environ, "XLA_FLAGS": flags, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(MESHES)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    for spec in MESHES:  # every step's loss and parameters within the float32 tensor tolerance
        assert out[spec]["loss_rel"] <= 1e-5, out
        assert out[spec]["param_rel"] <= 1e-5, out
    # the state split over fsdp only (8x1 replicates it); qkv's Adam moment: 1/8, 1/4, all of it per device
    assert out["replica=8,fsdp=1"]["sharded"] == 0 and out["replica=2,fsdp=4"]["sharded"] > 10, out
    assert [out[spec]["split"] for spec in MESHES] == [1, 2, 8], out
    assert out["restore"] == [
        {"mesh": "replica=8,fsdp=1", "exact": True, "placed": True, "devices": 8, "checksums": True},
        {"mesh": "replica=1,fsdp=1", "exact": True, "placed": True, "devices": 1, "checksums": True},
    ]
