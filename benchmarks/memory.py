"""XLA's memory analysis of a ``vit_jax`` benchmark program, compiled from abstract inputs and never run.

    python -m benchmarks.memory --variant B/16 --batch 256 --dtype bfloat16 --mode train

prints one JSON object: the argument, output, alias (donated) and temporary bytes of the compiled
program, and footprint = arguments + outputs - aliased + temporaries, the figure `vit bench` records as
``memory_bytes`` for ``vit_jax``. The program is the benchmark's own (``contenders.jax_program``:
inference, or a training step with AdamW, float32 parameters and ``--dtype`` compute).

By default it compiles for this machine's JAX platform. ``--gpu-target FILE`` compiles for the NVIDIA
GPU that FILE describes, on a machine without one (JAX's deviceless ahead-of-time compilation,
``vit_jax.memory_plan.gpu_target``): FILE is an XLA ``GpuTargetConfigProto`` in text form (XLA keeps one
per GPU model under ``xla/backends/gpu/target_config/specs/``; keep only the fields your jaxlib's XLA
knows). It needs JAX's CUDA plugin importable, without a GPU, e.g. ``pip install --no-deps --target DIR
jax-cuda13-plugin==V jax-cuda13-pjrt==V`` (V = your jax version) and ``PYTHONPATH=DIR``. XLA then runs
with its Triton GEMM fusions off (their tile search needs a device), so the figure can differ a little
from a GPU's own compilation: B/16 bf16 training at batch 256 with XLA's attention gave 25.14 GB for an
H100 target and 25.43 GB on an H200.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

MODES = ("infer", "train")


def analyse(variant: str, batch: int, dtype: str, mode: str, attn_backend: str | None, target_config: str | None):
    """The record printed by ``main`` (see the module docstring)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from benchmarks.contenders import jax_program, memory_footprint, model_config
    from vit_common.config import ViTConfig
    from vit_jax.memory_plan import gpu_target
    from vit_jax.model import VisionTransformer
    from vit_jax.platforms import Platform, building_for

    cfg = model_config(ViTConfig.from_name(variant), mode, dtype).replace(attn_backend=attn_backend)
    if target_config is None:
        platform, sharding = Platform.current(), None
    else:
        platform, mesh = gpu_target(target_config)
        sharding = NamedSharding(mesh, PartitionSpec())
    with building_for(platform):
        model = nnx.eval_shape(lambda: VisionTransformer(cfg, rngs=nnx.Rngs(0)))
    kernel = model.blocks[0].attn.kernel
    fn, state = jax_program(model, mode)

    def spec(shape, dt):
        return jax.ShapeDtypeStruct(shape, jnp.dtype(dt), sharding=sharding)

    state = jax.tree.map(lambda a: spec(a.shape, a.dtype), state)
    x = spec((batch, *cfg.image_size, cfg.in_chans), cfg.dtype)
    args = [*state, x] if mode == "infer" else [*state, x, spec((batch,), "int32")]
    compiled = fn.lower(*args).compile()
    mem = compiled.memory_analysis()
    return {
        "variant": variant,
        "batch": batch,
        "dtype": dtype,
        "mode": mode,
        "platform": platform.name,
        "compute_capability": platform.compute_capability,
        "attention_kernel": kernel,
        "argument_bytes": mem.argument_size_in_bytes,
        "output_bytes": mem.output_size_in_bytes,
        "alias_bytes": mem.alias_size_in_bytes,
        "temp_bytes": mem.temp_size_in_bytes,
        "footprint_bytes": memory_footprint(compiled),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--variant", default="B/16", help="variant name (default B/16)")
    p.add_argument("--batch", type=int, default=256, help="images per step (default 256)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    p.add_argument("--mode", choices=MODES, default="train")
    p.add_argument("--attn-backend", choices=("xla", "cudnn"), default=None, help="force a fused kernel")
    p.add_argument("--gpu-target", default=None, help="GpuTargetConfigProto text file: compile for that GPU")
    args = p.parse_args(argv)
    if args.batch < 1:
        p.error(f"--batch={args.batch}: expected a positive int")
    from vit_jax.memory_plan import compute_capability

    target = None
    if args.gpu_target:
        try:
            with open(args.gpu_target) as f:
                target = f.read()
            compute_capability(target)
        except (OSError, ValueError) as e:
            p.error(f"--gpu-target={args.gpu_target}: {e}")
        # Before JAX starts its backends: no GPU to initialise here, no Triton GEMM tile search.
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_enable_triton_gemm=false".strip()
    record = analyse(args.variant, args.batch, args.dtype, args.mode, args.attn_backend, target)
    print(json.dumps(record, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
