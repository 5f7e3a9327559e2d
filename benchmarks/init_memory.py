"""Peak anonymous memory of building `vit train --init`'s first train state, on a mesh of CPU devices.

A timm safetensors file of random float32 weights is written by streaming
(``benchmarks.convert_memory.random_lazy_state``); a child process with ``--devices`` CPU devices
(``--xla_force_host_platform_device_count``) says its anonymous memory after its imports, then does what
`vit train --init FILE` does before its first step: reads the checkpoint for a dataset
(``vit_jax.launch.finetune_start``), builds the ``Trainer`` on ``--mesh`` and its first state
(``Trainer.init_state``, with ``--ema``). Its RssAnon is sampled every 5 ms
(``benchmarks.convert_memory.rss_anon``: mapped file pages are not counted). On CPU the devices' memory is
the host's, so the state itself (parameters, AdamW's two moments, the EMA: every device's shards) is
part of the peak; the record gives it, and what the peak rose beyond it: the host's copies besides the
state.

Run (from the repository root; ``--code`` runs another checkout's code in the child, e.g. an older
commit's worktree, to compare):

    python -m benchmarks.init_memory --variant B/16 --mesh replica=1,fsdp=8
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import report
from benchmarks.convert_memory import config, random_lazy_state, sampled_run
from vit_common.checkpoints.convert import save_checkpoint

# The child: import and start JAX, say its anonymous memory, build the first state, say its bytes.
_CHILD = """
import sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from vit_common.data.datasets import ArraySource, Dataset
from vit_common.training.train_config import RunOptions, TrainConfig
from vit_jax.launch import RunSpec, finetune_start
from vit_jax.mesh import make_mesh
from vit_jax.trainer import Trainer

def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))

path, size, mesh, ema = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()
images = ArraySource(np.zeros((8, size, size, 3), np.uint8), np.arange(8))
data = Dataset("bench", images, images, tuple(f"c{i}" for i in range(1000)), (size, size), 3)
tcfg = TrainConfig(init=path, batch_size=8, epochs=1, mesh=mesh, ema=float(ema) if ema else None)
print(anon(), flush=True)
start = finetune_start(RunSpec(train=tcfg, options=RunOptions(), out=Path(".")), data, lambda line: None)
t = Trainer(start.cfg, tcfg, start.data, mesh=make_mesh(mesh), weights=start.weights)
state = jax.block_until_ready(t.init_state())
print(sum(s.data.nbytes for x in jax.tree.leaves(state) for s in x.addressable_shards), flush=True)
"""


def measure(argv: list[str], env: dict, cwd: Path) -> dict:
    """Run the child ``argv`` in ``cwd`` (not the repository: ``-c`` puts the folder first on the path),
    sampling its RssAnon: wall seconds, peak bytes, its anonymous bytes after
    its imports and the bytes of the state it built."""
    wall, peak, out, _ = sampled_run(argv, env=env, cwd=cwd)
    baseline, state = map(int, out.split()[-2:])
    return {"wall_s": wall, "peak_anon_bytes": peak, "baseline_anon_bytes": baseline, "state_bytes": state}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", default="B/16", help="a ViT variant (default B/16), 224 px, 1000 classes")
    p.add_argument("--devices", type=int, default=8, help="CPU devices of the child (default 8)")
    p.add_argument("--mesh", default="replica=1,fsdp=-1", help="the run's --mesh (default replica=1,fsdp=-1)")
    p.add_argument("--ema", default="0.9999", help="the run's --ema decay, '' for none (default 0.9999)")
    p.add_argument("--code", default=str(Path(__file__).resolve().parents[1]), help="checkout the child runs")
    p.add_argument("--out", help="append a JSON-line record here")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vit_init_memory_"))
    cfg = config(args.variant, "float32")
    src = work / "src.safetensors"
    try:
        save_checkpoint(src, cfg, random_lazy_state(cfg, "float32"), "timm")
        size = src.stat().st_size
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
        env = {**os.environ, "PYTHONPATH": args.code, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"}
        argv = [sys.executable, "-c", _CHILD, str(src), str(cfg.image_size[0]), args.mesh, args.ema]
        m = measure(argv, env, work)
        rise = m["peak_anon_bytes"] - m["baseline_anon_bytes"]
        rec = {
            "variant": args.variant,
            "file_bytes": size,
            "devices": args.devices,
            "mesh": args.mesh,
            "ema": args.ema or None,
            "commit": subprocess.run(
                ["git", "-C", args.code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip(),
            **m,
            "rise_anon_bytes": rise,
            "rise_vs_file": rise / size,
            "beyond_state_bytes": rise - m["state_bytes"],
            "beyond_state_vs_file": (rise - m["state_bytes"]) / size,
        }
        mib = 2**20
        print(
            f"{args.variant} float32, {size / 1e6:.0f} MB file, {args.devices} CPU devices, --mesh {args.mesh}, "
            f"--ema {args.ema or 'none'} ({rec['commit']}): peak anonymous {m['peak_anon_bytes'] / mib:,.0f} MiB, "
            f"a rise of {rise / mib:,.0f} MiB ({rise / size:.2f}x the file) after the imports, of which the state "
            f"{m['state_bytes'] / mib:,.0f} MiB and {(rise - m['state_bytes']) / mib:,.0f} MiB "
            f"({(rise - m['state_bytes']) / size:.2f}x the file) beyond it; {m['wall_s']:.1f} s"
        )
        if args.out:
            report.append_jsonl([rec], args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
