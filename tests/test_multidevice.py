"""Data parallel and FSDP on 8 simulated CPU devices give the same training as one device.

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

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from flax import nnx
    from conftest import TINY, _tiny_dataset  # the repository root's, on PYTHONPATH (no pytest here)
    from vit_common.config import ViTConfig
    from vit_common.tolerance import compare
    from vit_jax.data import iterate, train_batches
    from vit_common.training.train_config import TrainConfig
    from vit_jax.trainer import Trainer, make_mesh

    assert jax.device_count() == 8, jax.devices()
    data = _tiny_dataset(n_train=36, n_test=8)
    # tiny_dataset's one channel; every kernel has an axis that 8 divides
    cfg = ViTConfig(**TINY).replace(in_chans=1, width=32, mlp_dim=64)
    d = cfg.width

    def run(devices, sharding):
        t = Trainer(cfg, TrainConfig(batch_size=16, epochs=3, warmup_steps=2, sharding=sharding), data,
                    mesh=make_mesh(devices))
        state, losses = t.init_state(), []
        it = iterate(train_batches(data.train, 3, batch_size=16, epochs=3, seed=0, transform=t.train_transform))
        for _ in range(5):  # the third step is the partial last batch of epoch 1 (36 = 16 + 16 + 4)
            state, m = t.train_step(state, next(it))
            losses.append(float(m["loss"]))
        sharded = sum(s.spec != jax.sharding.PartitionSpec() for s in jax.tree.leaves(t.state_shardings))
        params = {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(state["params"])}
        # The key bias gets an exactly-zero gradient (softmax ignores a shift shared by all keys), so
        # its Adam updates are normalised rounding noise, which differs with the reduction order.
        params["blocks.0.attn.qkv.bias"] = np.delete(params["blocks.0.attn.qkv.bias"], np.s_[d:2 * d])
        qkv = state["params"]["blocks"][0]["attn"]["qkv"]["kernel"][...]
        return losses, params, sharded, qkv.addressable_shards[0].data.size * 8 // qkv.size

    ref_losses, ref, _, _ = run(jax.devices()[:1], "dp")
    out = {}
    for sharding in ("dp", "fsdp"):
        losses, params, sharded, split = run(jax.devices(), sharding)
        worst = max(compare(k, params[k], ref[k], "tensor", "float32").rel for k in ref)
        loss_rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        out[sharding] = {"loss_rel": loss_rel, "param_rel": worst, "sharded": sharded, "split": split}
    print("RESULT " + json.dumps(out))
""")


def test_data_parallel_and_fsdp_on_8_devices_match_one_device():
    # XLA:CPU optimisation level 0 halves the compile time; both sides of the comparison use it.
    flags = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    env = {**os.environ, "XLA_FLAGS": flags, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    for sharding in ("dp", "fsdp"):
        assert out[sharding]["loss_rel"] <= 1e-5, out
        assert out[sharding]["param_rel"] <= 1e-5, out
    assert out["dp"]["sharded"] == 0 and out["fsdp"]["sharded"] > 10  # state arrays split across devices
    assert out["dp"]["split"] == 8 and out["fsdp"]["split"] == 1  # qkv kernel: whole vs 1/8 per device
