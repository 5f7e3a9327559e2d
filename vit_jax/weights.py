"""The JAX twin <-> the canonical state (flat numpy dict, timm names, PyTorch layouts).

NNX module paths are timm's, so conversion is one rule per leaf kind:
Linear ``kernel`` (in, out) <-> ``weight`` (out, in); Conv ``kernel`` HWIO <-> ``weight`` OIHW;
LayerNorm ``scale`` <-> ``weight``; every other parameter keeps its name and layout.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_common.config import ViTConfig
from vit_common.state import canonical_shapes, check_state
from vit_jax.model import VisionTransformer
from vit_jax.rope import RopePeriods

# The canonical state: the parameters and the stored RoPE periods (state, never trained).
CANONICAL = nnx.Any(nnx.Param, RopePeriods)


def _canonical_name(path: tuple) -> tuple[str, str]:
    """NNX path -> (canonical name, leaf kind)."""
    *mods, leaf = (str(p) for p in path)
    kind = {"kernel": "kernel", "scale": "scale"}.get(leaf, "plain")
    return ".".join(mods + ["weight" if kind != "plain" else leaf]), kind


def _to_canonical(arr: np.ndarray, kind: str) -> np.ndarray:
    if kind == "kernel":
        arr = arr.T if arr.ndim == 2 else arr.transpose(3, 2, 0, 1)  # (in, out) | HWIO -> OIHW
    return np.ascontiguousarray(arr)


def _from_canonical(arr: np.ndarray, kind: str) -> np.ndarray:
    if kind == "kernel":
        arr = arr.T if arr.ndim == 2 else arr.transpose(2, 3, 1, 0)  # (out, in) | OIHW -> HWIO
    return arr


def _param_paths(state: nnx.State) -> list[tuple[tuple, object]]:
    return list(nnx.to_flat_state(state))


def params_to_numpy(cfg: ViTConfig, params: nnx.State) -> dict[str, np.ndarray]:
    """A parameter-shaped State (the parameters, or their gradients) -> canonical names and layouts.

    Arrays keep their dtype (bfloat16 as ml_dtypes.bfloat16), in ``canonical_shapes(cfg)`` order.
    """
    out = {}
    for path, var in _param_paths(params):
        name, kind = _canonical_name(path)
        out[name] = _to_canonical(np.asarray(jax.device_get(var[...])), kind)
    order = canonical_shapes(cfg)
    return {k: out[k] for k in order if k in out} | {k: v for k, v in out.items() if k not in order}


def to_numpy(model: VisionTransformer) -> dict[str, np.ndarray]:
    """The canonical state of ``model``: {timm name: numpy array in PyTorch layout}, contiguous."""
    return params_to_numpy(model.cfg, nnx.state(model, CANONICAL))


def check_float64(cfg: ViTConfig) -> None:
    """Raise ValueError if cfg asks for float64 while jax_enable_x64 is off (JAX would silently use 32)."""
    if "float64" in (cfg.dtype, cfg.param_dtype) and not jax.config.jax_enable_x64:
        raise ValueError(
            f"dtype={cfg.dtype!r}, param_dtype={cfg.param_dtype!r} need float64, but jax_enable_x64 is off; "
            "call jax.config.update('jax_enable_x64', True) first"
        )


def abstract_model(cfg: ViTConfig, seed: int = 0) -> VisionTransformer:
    """``VisionTransformer(cfg)`` built by ``nnx.eval_shape``: every variable a ``jax.ShapeDtypeStruct``
    (shape and dtype), no parameter drawn; the RNG streams of ``nnx.Rngs(seed)``.

    While tracing, the streams count their draws in host numpy: flax's update of a traced counter asks the
    tracer for its ``sharding``, whose ``AttributeError`` message JAX builds by walking the whole trace so
    far, once per initialiser (quadratic in the model's size: 0.6 of the 1.1 s a float32 L/16 took). For
    shapes only: flax bumps such a counter in place, so a computation traced from it (``jax.jit``) would
    draw every key from its last count."""

    def build() -> VisionTransformer:
        rngs = nnx.Rngs(seed)
        for _, stream in rngs.items():
            stream.count = nnx.RngCount(np.zeros(stream.count.shape, np.uint32), tag=stream.tag)
        return VisionTransformer(cfg, rngs=rngs)

    return nnx.eval_shape(build)


@functools.lru_cache(maxsize=4)
def _abstract(cfg: ViTConfig, seed: int) -> tuple:
    """(graphdef, abstract parameters, abstract rest) of ``abstract_model(cfg, seed)`` (tracing every
    initialiser: a second for a large model), kept for the next model of the same config: a fine-tune
    builds its model from weights, and the export check the same model again. ``from_numpy`` replaces
    each abstract variable, never changes one."""
    return nnx.split(abstract_model(cfg, seed), CANONICAL, ...)


def _place(arr: np.ndarray, dtype, where: jax.sharding.Sharding | None) -> jax.Array:
    """``arr`` (possibly a read-only view of a mapped file) as a jax.Array of ``dtype``: copied into memory
    this process owns (JAX on CPU may otherwise alias the file's pages), all of it or, with ``where``, each
    local device's block alone."""
    if where is None:
        return jnp.asarray(np.array(arr, dtype=dtype, order="C"))
    return jax.make_array_from_callback(arr.shape, where, lambda idx: np.array(arr[idx], dtype=dtype, order="C"))


def from_numpy(
    cfg: ViTConfig,
    state: Mapping[str, np.ndarray],
    *,
    seed: int = 0,
    sharding: Callable[[str, tuple[int, ...]], jax.sharding.Sharding] | None = None,
) -> VisionTransformer:
    """Build a VisionTransformer for ``cfg`` holding exactly the tensors of ``state``, in eval mode.

    The model is built abstractly (``nnx.eval_shape``), so no random parameters are drawn; each
    parameter is filled from its canonical tensor and cast to ``cfg.param_dtype``, one tensor at a time:
    with a lazily read ``state`` (``load_checkpoint(lazy=True)``: memory-mapped views and ``LazyTensor``s)
    the host holds the model once plus one tensor, never the file's state beside it. ``seed`` seeds the
    dropout/drop-path RNG streams only.

    ``sharding(path, shape)``, given, places each parameter (``path`` its NNX path joined by dots, such as
    ``blocks.0.attn.qkv.kernel``; ``shape`` in this twin's layout) with the returned sharding, and each
    device's block is read from ``state`` alone (``jax.make_array_from_callback``): a process of a
    multi-process mesh reads only the rows of its own devices.

    Raises:
        StateMismatchError: lists every missing, unexpected and wrong-shape tensor together.
        ValueError: float64 requested while jax_enable_x64 is off.
    """
    pd = jnp.dtype(cfg.param_dtype)

    def place(path: str, arr: np.ndarray) -> jax.Array:
        return _place(arr, pd, sharding(path, arr.shape) if sharding is not None else None)

    return _filled(cfg, state, seed, place)


def host_model(cfg: ViTConfig, state: Mapping[str, np.ndarray], *, seed: int = 0) -> VisionTransformer:
    """A VisionTransformer for ``cfg`` (eval mode) whose parameters are ``state``'s tensors as numpy arrays
    in this twin's layout, not copied: views of them (of a memory-mapped file's pages when ``state`` was
    read lazily; a ``LazyTensor`` is loaded), cast only where the dtype is not ``cfg.param_dtype``. For
    writers that take numpy arrays (``vit_jax.formats.write_orbax``), so that the host holds no copy of
    the file; a model to run is ``from_numpy``'s. ``seed`` as ``from_numpy``'s.

    Raises:
        as ``from_numpy``.
    """
    pd = np.dtype(jnp.dtype(cfg.param_dtype))
    return _filled(cfg, state, seed, lambda _, arr: arr if arr.dtype == pd else arr.astype(pd))


def _filled(
    cfg: ViTConfig, state: Mapping[str, np.ndarray], seed: int, place: Callable[[str, np.ndarray], object]
) -> VisionTransformer:
    """The model of ``cfg`` built abstractly, each parameter ``place(path, view)`` of its canonical tensor
    (a view in this twin's layout; ``path`` the NNX path joined by dots), the other state (RNG streams)
    initialised from ``seed``; in eval mode."""
    check_float64(cfg)
    check_state(canonical_shapes(cfg), state)
    graphdef, params, rest = _abstract(cfg, seed)
    flat = []
    for path, var in _param_paths(params):
        name, kind = _canonical_name(path)
        arr = _from_canonical(np.asarray(state[name]), kind)  # a view: nothing is copied yet
        flat.append((path, var.replace(place(".".join(map(str, path)), arr))))
    params = nnx.from_flat_state(flat)
    # RNG streams: build the model under jit and keep only the non-parameter state, so XLA drops the
    # random parameter initialisation as dead code.
    rest = (
        jax.jit(lambda: nnx.state(VisionTransformer(cfg, rngs=nnx.Rngs(seed)), nnx.Not(CANONICAL)))()
        if len(nnx.to_flat_state(rest))
        else rest
    )
    model = nnx.merge(graphdef, params, rest)
    model.eval()
    return model
