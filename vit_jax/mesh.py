"""The JAX twin's 2-D device mesh and the shardings of its train state, from the text forms of
``vit_common.training.sharding`` (a mesh spec ``replica=R,fsdp=F`` and a table of regex rules over
parameter names).

``make_mesh`` builds the ``jax.sharding.Mesh`` with axes ("replica", "fsdp"); ``state_shardings`` gives
every leaf of a train state its ``NamedSharding``: parameters by the rules, the optimizer state's
parameter-shaped leaves (Adam's moments) and the EMA as their parameter, everything else (the step,
RNG streams, counts) replicated; ``batch_sharding`` splits a batch's rows over both axes. A jitted step
with these shardings makes XLA sum the gradients over the devices holding other rows of the batch
(``replica`` and ``fsdp``) and gather split parameters where they are used (ZeRO-3 style); nothing
here writes a collective.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vit_common.training.sharding import MESH_AXES, SHORT_FORMS, mesh_sizes, parse_rules, partition


def make_mesh(spec: str = SHORT_FORMS["dp"], devices=None) -> Mesh:
    """The mesh of ``spec`` (``replica=R,fsdp=F``, ``vit_common.training.sharding.parse_mesh``) over
    ``devices`` (default: every device of every process, ``jax.devices()``, whose order is process by
    process): the devices laid out row-major as [R, F], so a replica's F devices are consecutive, and
    with several processes each replica lies within one process when F divides its device count
    (``replica`` spans the processes, as big_vision's multi-slice meshes).

    Raises:
        ValueError: ``spec`` does not parse, or its sizes do not multiply to the number of devices.
    """
    devices = np.array(jax.devices() if devices is None else devices)
    sizes = mesh_sizes(spec, devices.size)
    return Mesh(devices.reshape([sizes[a] for a in MESH_AXES]), MESH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """A batch's leading dimension (its rows) split over both mesh axes, replica-major."""
    return NamedSharding(mesh, P(MESH_AXES))


def _name(path) -> str:
    """A parameter's name from its key path in a params tree: the dict keys joined by dots."""
    return ".".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def by_name(params) -> dict:
    """The leaves of a params tree (arrays, shapes or shardings; ``nnx.split``'s ``nnx.Param`` state) by
    parameter name, the names the rules match: ``blocks.0.attn.qkv.kernel``."""
    return {_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def param_shardings(mesh: Mesh, rules: str, params):
    """``params`` (a tree of arrays or ``jax.ShapeDtypeStruct``, e.g. ``nnx.split``'s ``nnx.Param``
    state) with each leaf replaced by its ``NamedSharding`` under ``rules``
    (``vit_common.training.sharding.parse_rules``' text; ``partition`` decides).

    Raises:
        ValueError: ``rules`` does not parse, or ``partition`` refuses it for these parameters.
    """
    shapes = {name: tuple(x.shape) for name, x in by_name(params).items()}
    specs = partition(parse_rules(rules), shapes, dict(mesh.shape))
    return jax.tree_util.tree_map_with_path(lambda p, _: NamedSharding(mesh, P(*specs[_name(p)])), params)


def _masked(x) -> bool:
    """A frozen parameter's empty slot in a masked optimizer state (``freeze``, ``lora``)."""
    return isinstance(x, optax.MaskedNode)


def state_shardings(mesh: Mesh, rules: str, abstract_state: dict, tx: optax.GradientTransformation) -> dict:
    """The ``NamedSharding`` of every leaf of a train state (``vit_jax.trainer``'s ``{"step", "params",
    "rest", "opt_state"}`` and optional ``"ema"``; shapes are enough): ``params`` and ``ema`` by ``rules``
    (``param_shardings``), the parameter-shaped leaves of ``opt_state`` (of the optimizer ``tx``) as their
    parameter (``optax.tree_map_params``), everything else replicated.

    Raises:
        ValueError: as ``param_shardings``.
    """
    replicated = NamedSharding(mesh, P())
    params = param_shardings(mesh, rules, abstract_state["params"])
    out = jax.tree.map(lambda _: replicated, abstract_state)
    out["params"] = params
    out["opt_state"] = optax.tree_map_params(
        tx,
        lambda x, s: x if _masked(x) else s,
        abstract_state["opt_state"],
        params,
        transform_non_params=lambda _: replicated,
        is_leaf=_masked,
    )
    if "ema" in abstract_state:
        out["ema"] = params
    return out
