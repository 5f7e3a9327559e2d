"""The memory plan of a training run: what one device holds while the run's own training step runs,
from XLA's memory analysis of that step compiled ahead of time (``Trainer.compile``: JAX's
``lower(...).compile()`` from shapes alone, so nothing is allocated and the run reuses the program).

``plan(trainer)`` splits the compiled step's bytes per device into

- parameters: the train state's ``params`` (and ``ema``, the RNG state, the step counter), each array's
  shard under ``Trainer.state_shardings``;
- optimizer state: ``opt_state``'s shards;
- batch: the global batch's shard on one device (``Trainer.batch_spec``);
- activations: what the forward pass of one micro-batch (``batch_size / accum_steps`` rows, this
  device's share) keeps for the backward pass: the residuals of ``jax.vjp`` of the model's forward,
  the parameters themselves not counted, with ``remat`` only each block's input (JAX's own rule of what
  a ``jax.checkpoint`` saves). They live in XLA's temporary buffer;
- XLA temporaries: the rest of that buffer (gradients, the optimizer's intermediates, fusion scratch);
- outputs: the step's outputs that are not donated (its metrics).

The arguments (parameters, optimizer state, batch) add up to XLA's ``argument_size_in_bytes`` exactly;
activations + temporaries equal its ``temp_size_in_bytes`` (activations are capped at it: XLA may fuse
a residual away); ``total`` is arguments + outputs - donated + temporaries, the step's footprint on the
device. ``check`` refuses a plan over the device's memory (``device_memory``).

A plan for a device this machine does not have (JAX's deviceless ahead-of-time compilation): build the
Trainer on the mesh ``gpu_target`` or ``tpu_target`` gives, inside ``vit_jax.platforms.building_for``
its platform, then ``plan``. A GPU target needs JAX's CUDA plugin importable (no GPU), a TPU target
libtpu; both need ``JAX_PLATFORMS=cpu`` so that JAX does not look for the device itself.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.extend.core import Var
from jax.sharding import Mesh

from vit_common.system.validate import memory_limit
from vit_common.training.sharding import SHORT_FORMS
from vit_jax.mesh import make_mesh
from vit_jax.platforms import Platform
from vit_jax.trainer import Trainer, _forward, naflex_arguments

GIB = 2**30

# High-bandwidth memory per chip of the TPUs whose deviceless compile reports none (Cloud TPU datasheets:
# v4 32 GiB, v5e 16 GiB, v5p 95 GiB, v6e 32 GiB), by JAX's device_kind.
TPU_MEMORY = {"TPU v4": 32 * GIB, "TPU v5 lite": 16 * GIB, "TPU v5": 95 * GIB, "TPU v6 lite": 32 * GIB}


LOWER = (
    "lower it with --remat, a smaller --batch-size, more --accum-steps, --sharding fsdp (a larger fsdp axis "
    "of --mesh), --lora or --dtype bfloat16"
)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device of one training step (see the module docstring); ``device_memory``: the bytes
    one device has (None: unknown), ``device``: what it is, in words."""

    parameters: int
    optimizer_state: int
    batch: int
    activations: int
    temporaries: int
    outputs: int
    total: int
    device_memory: int | None = None
    device: str = ""

    def fits(self) -> bool:
        """True unless the device's memory is known and ``total`` exceeds it."""
        return self.device_memory is None or self.total <= self.device_memory

    def parts(self) -> str:
        """What the total holds (``size``'s units): 'parameters 1.2 GiB, optimizer state 2.4 GiB, ...'."""
        parts = (
            ("parameters", self.parameters),
            ("optimizer state", self.optimizer_state),
            ("batch", self.batch),
            ("activations", self.activations),
            ("XLA temporaries", self.temporaries),
        )
        return ", ".join(f"{name} {size(n)}" for name, n in parts)

    def line(self) -> str:
        """The plan in one line: the total, the device's memory if known, and ``parts``."""
        of = f" of {size(self.device_memory)} ({self.device})" if self.device_memory is not None else ""
        return f"memory plan per device: {size(self.total)}{of}: {self.parts()}"

    def check(self) -> None:
        """Raise unless the plan fits the device.

        Raises:
            ValueError: naming the plan's total, the device's memory and what lowers the plan.
        """
        if not self.fits():
            raise ValueError(
                f"the training step needs {size(self.total)} per device, beyond the {size(self.device_memory)} of "
                f"{self.device} ({self.parts()}); {LOWER}"
            )


def size(n: int) -> str:
    """``n`` bytes in binary units, 3 significant digits: '2.31 GiB', '412 MiB', '3.5 KiB', '12 B'; 1,000
    to 1,023 of a unit in whole units ('1023 KiB', where 3 digits would print '1.02e+03')."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            text = f"{n / scale:.3g}"
            return f"{n / scale:.0f} {unit}" if "e" in text else f"{text} {unit}"
    return f"{n} B"


def nbytes(x) -> int:
    """Bytes of an array or a ShapeDtypeStruct (typed PRNG keys as their key data: threefry 8 a key)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.eval_shape(jax.random.key_data, x)
    return math.prod(x.shape) * jnp.dtype(x.dtype).itemsize


def shard_bytes(tree, shardings) -> int:
    """Bytes one device holds of the arrays of ``tree`` placed with ``shardings`` (a matching tree of
    ``jax.sharding.Sharding``): each array's shard, the largest where shards differ."""
    leaves = jax.tree.leaves(tree)
    specs = jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))
    return sum(
        nbytes(jax.ShapeDtypeStruct(s.shard_shape(x.shape), x.dtype)) for x, s in zip(leaves, specs, strict=True)
    )


def activation_bytes(trainer: Trainer) -> int:
    """Bytes the forward pass of one device's share of a micro-batch keeps for the backward pass: the
    residuals of ``jax.vjp`` of the model's logits with respect to its parameters, traced from shapes
    (``jax.make_jaxpr``), neither the parameters nor constants counted. Frozen parameters (``freeze``,
    ``lora``) enter through ``stop_gradient`` as in the step."""
    t, tcfg = trainer, trainer.tcfg
    micro = tcfg.batch_size // tcfg.accum_steps
    rows = t.batch_sharding.shard_shape((micro,))[0]
    spec = {k: jax.ShapeDtypeStruct((rows, *v.shape[1:]), v.dtype) for k, v in t.batch_spec().items()}
    params, rest = t.abstract_state["params"], t.abstract_state["rest"]
    frozen = tcfg.freeze or tcfg.lora is not None

    def residuals(params, rest, batch):
        def logits(p):
            if frozen:
                p = jax.tree.map(lambda train, x: x if train else jax.lax.stop_gradient(x), t.trainable, p)
            return _forward(t.train_graphdef, p, rest, batch["image"], naflex=naflex_arguments(batch))[0]

        return jax.vjp(logits, params)[1]

    closed = jax.make_jaxpr(residuals)(params, rest, spec)
    inputs = set(closed.jaxpr.invars) | set(closed.jaxpr.constvars)
    saved = {v for v in closed.jaxpr.outvars if isinstance(v, Var) and v not in inputs}
    return sum(nbytes(v.aval) for v in saved)


def device_memory(device) -> int | None:
    """Bytes one ``device`` may hold: its allocator's limit (``memory_stats()["bytes_limit"]``, GPUs and
    TPUs), else ``TPU_MEMORY`` by its kind; a CPU device its share of the host's memory
    (``vit_common.system.validate.memory_limit``: physical memory, or ``VIT_MAX_BYTES``) among this
    process's CPU devices; else None."""
    try:
        stats = device.memory_stats()
    except Exception:  # a deviceless target's device, or another process's, has no allocator to ask
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        return memory_limit() // jax.local_device_count("cpu")
    return TPU_MEMORY.get(device.device_kind)


def plan(trainer: Trainer, memory: int | None = None, device: str | None = None) -> MemoryPlan:
    """The memory plan of ``trainer``'s training step (compiling it, or taking the program compiled
    already), with ``memory`` bytes per device (default ``device_memory`` of the mesh's first device)
    and ``device`` naming it (default its device_kind): this process's first device of the mesh.

    Raises:
        ValueError: XLA gives no memory analysis for the compiled step, or its compiler refuses the step
            as over the device's memory (a TPU's does: RESOURCE_EXHAUSTED), one line naming the bytes.
    """
    try:
        compiled = trainer.compile()
    except jax.errors.JaxRuntimeError as e:  # a TPU's compiler refuses a program over its memory itself
        if not str(e).startswith("RESOURCE_EXHAUSTED"):
            raise
        raise ValueError(
            f"the training step does not fit {trainer.mesh.devices.flat[0].device_kind}: XLA's compiler says "
            f"{str(e).splitlines()[0]}; {LOWER}"
        ) from None
    mem = compiled.memory_analysis()
    if mem is None:
        raise ValueError("XLA gives no memory analysis of the training step on this platform")
    devices = list(trainer.mesh.devices.flat)
    first = next((d for d in devices if d.process_index == jax.process_index()), devices[0])
    state, shardings = trainer.abstract_state, trainer.state_shardings
    held = {k: shard_bytes(state[k], shardings[k]) for k in state}
    optimizer = held.pop("opt_state")
    batch = shard_bytes(trainer.batch_spec(), {k: trainer.batch_sharding for k in trainer.batch_spec()})
    activations = min(activation_bytes(trainer), mem.temp_size_in_bytes)
    outputs = mem.output_size_in_bytes - mem.alias_size_in_bytes
    return MemoryPlan(
        parameters=sum(held.values()),
        optimizer_state=optimizer,
        batch=batch,
        activations=activations,
        temporaries=mem.temp_size_in_bytes - activations,
        outputs=outputs,
        total=mem.argument_size_in_bytes + outputs + mem.temp_size_in_bytes,
        device_memory=device_memory(first) if memory is None else memory,
        device=device or first.device_kind,
    )


# ---------------------------------------------------------------------- devices this machine lacks


def compute_capability(target_config: str) -> tuple[int, int]:
    """(major, minor) from a GpuTargetConfigProto's ``cuda_compute_capability`` block (minor 0 if absent).

    Raises:
        ValueError: the text has no ``cuda_compute_capability { major: N ... }``.
    """
    m = re.search(r"cuda_compute_capability\s*\{([^}]*)\}", target_config)
    major = re.search(r"major:\s*(\d+)", m.group(1)) if m else None
    if major is None:
        raise ValueError("the GPU target config has no cuda_compute_capability { major: N }")
    minor = re.search(r"minor:\s*(\d+)", m.group(1))
    return int(major.group(1)), int(minor.group(1)) if minor else 0


def gpu_memory(target_config: str) -> int | None:
    """``device_memory_size`` of a GpuTargetConfigProto (bytes), None if it states none."""
    m = re.search(r"device_memory_size:\s*(\d+)", target_config)
    return int(m.group(1)) if m else None


def gpu_target(target_config: str, spec: str = SHORT_FORMS["dp"]) -> tuple[Platform, Mesh]:
    """The platform and a one-device mesh (``vit_jax.mesh.make_mesh`` of ``spec``) of the NVIDIA GPU that
    ``target_config`` (an XLA ``GpuTargetConfigProto`` in text form; XLA keeps one per GPU model under
    ``xla/backends/gpu/target_config/specs/``) describes, for compiling without that GPU.

    Raises:
        ValueError: the text names no compute capability (``compute_capability``).
    """
    from jax.experimental import topologies

    platform = Platform("cuda", compute_capability(target_config))
    topology = topologies.get_topology_desc(platform="cuda", target_config=target_config, topology="1x1x1")
    return platform, make_mesh(spec, topology.devices[:1])


def tpu_target(topology_name: str, spec: str = SHORT_FORMS["dp"]) -> tuple[Platform, Mesh]:
    """The platform and a mesh (``vit_jax.mesh.make_mesh`` of ``spec``) over the chips of the TPU slice
    ``topology_name`` (e.g. 'v5e:1x1', libtpu's names), one host holding them, for compiling without
    that TPU.

    Raises:
        ValueError: ``spec``'s sizes do not multiply to the slice's chips (``make_mesh``).
    """
    from jax.experimental import topologies

    shape = topology_name.split(":")[-1].split("x")
    bounds = tuple(int(n) for n in shape) + (1,) * (3 - len(shape))
    topology = topologies.get_topology_desc(
        platform="tpu", topology_name=topology_name, chips_per_host_bounds=bounds, num_slices=1
    )
    return Platform("tpu"), make_mesh(spec, topology.devices)
