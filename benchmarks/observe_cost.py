"""What `vit train`'s per-step observability costs on the demo's training step.

Rounds alternate two loops of ``--steps`` steps of the demo model (mnist5k, batch 128, one CPU device
per core as `vit train` runs it): bare (the step and the fetch of its metrics, as the loop does anyway)
and observed (each step inside ``jax.profiler.StepTraceAnnotation``, and every 10th step a TensorBoard
line of ``vit_jax.observe.Summaries``, the default ``--log-every``). Both loops take the same
pre-made batches, so the input pipeline is left out. Prints the median seconds per step of each kind
and the relative cost.

    python -m benchmarks.observe_cost --steps 60 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)

    from vit_common.config import DEMO_MODEL, ViTConfig
    from vit_common.system.host_devices import split_cpu
    from vit_common.training.train_config import TrainConfig

    split_cpu(0, TrainConfig().batch_size, TrainConfig().accum_steps)  # the demo's devices, before JAX is imported
    import jax

    from vit_common.data.datasets import load_dataset
    from vit_jax.observe import Summaries
    from vit_jax.trainer import Trainer

    data = load_dataset("mnist5k", (28, 28), 1)
    cfg = ViTConfig(**DEMO_MODEL, num_classes=data.num_classes, in_chans=1)
    trainer = Trainer(cfg, TrainConfig(), data)
    state = trainer.init_state()
    it = trainer.train_iterator()
    batches = [next(it) for _ in range(8)]
    it.close()
    state, m = trainer.train_step(state, batches[0])  # compiles
    jax.device_get(m)
    times = {"bare": [], "observed": []}
    with tempfile.TemporaryDirectory() as tmp:
        summaries = Summaries(tmp, cfg, trainer.mesh.size, peak_flops=1e12)
        for _ in range(args.rounds):
            for kind in times:
                t0 = time.perf_counter()
                for i in range(args.steps):
                    if kind == "bare":
                        state, m = trainer.train_step(state, batches[i % len(batches)])
                        m = jax.device_get(m)
                        continue
                    with jax.profiler.StepTraceAnnotation("train", step_num=i + 1):
                        state, m = trainer.train_step(state, batches[i % len(batches)])
                        m = jax.device_get(m)
                    if (i + 1) % 10 == 0:
                        line = {k: float(m[k]) for k in ("loss", "lr", "grad_norm")}
                        line |= {"step": i + 1, "accuracy": float(m["correct"] / m["count"]), "images_per_s": 1.0}
                        summaries.train(line, step_time=0.01)
                times[kind].append((time.perf_counter() - t0) / args.steps)
        summaries.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"seconds per step, median of {args.rounds} rounds of {args.steps}: bare {med['bare'] * 1e3:.2f} ms, "
        f"observed {med['observed'] * 1e3:.2f} ms ({(med['observed'] / med['bare'] - 1) * 100:+.1f}%); each round "
        + ", ".join(f"{b * 1e3:.2f}/{o * 1e3:.2f}" for b, o in zip(times["bare"], times["observed"], strict=True))
    )


if __name__ == "__main__":
    main()
