"""The JAX twin's Adam state by canonical names: what the twin-training parity compares and converts.

optax keeps Adam's moments in a ``ScaleByAdamState(count, mu, nu)`` somewhere inside the chain that
``vit_jax.optim.make_optimizer`` builds (under the clip, inside ``optax.adamw``'s chain, or inside
``multi_transform`` with ``freeze``); ``mu`` and ``nu`` are parameter-shaped trees (frozen parameters
hold ``optax.MaskedNode``). Here they become flat numpy dicts with timm names and PyTorch layouts, the
form ``vit_torch.train.Trainer.adam_state`` gives, so torch's ``exp_avg`` / ``exp_avg_sq`` and optax's
``mu`` / ``nu`` compare (and convert) name by name.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
import optax

from vit_jax.weights import _canonical_name, _from_canonical, _to_canonical


def _adam_states(opt_state) -> list[optax.ScaleByAdamState]:
    leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
    return [x for x in leaves if isinstance(x, optax.ScaleByAdamState)]


def _keys(path) -> tuple[str, ...]:
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def _named(tree) -> dict[str, np.ndarray]:
    """A parameter-shaped tree (masked nodes skipped) -> {canonical name: numpy array, canonical layout}."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name, kind = _canonical_name(_keys(path))
        out[name] = _to_canonical(np.asarray(jax.device_get(leaf)), kind)
    return out


def adam_state(opt_state) -> dict:
    """{"count": steps taken, "mu": {name: first moment}, "nu": {name: second moment}} of the one Adam
    state in ``opt_state`` (numpy, canonical names and layouts; frozen parameters absent).

    Raises:
        ValueError: ``opt_state`` holds no Adam state, or more than one.
    """
    states = _adam_states(opt_state)
    if len(states) != 1:
        raise ValueError(f"optimizer state holds {len(states)} Adam states: expected exactly one")
    (s,) = states
    return {"count": int(jax.device_get(s.count)), "mu": _named(s.mu), "nu": _named(s.nu)}


def check_moments(moments: dict, weights: Mapping[str, np.ndarray]) -> None:
    """Whether ``moments`` (``adam_state``'s form) fit a model of canonical ``weights``: a moment for every
    tensor, none for a tensor the model lacks, each of its tensor's shape.

    Raises:
        ValueError: one line naming the first tensor that does not fit.
    """
    for what in ("mu", "nu"):
        missing, extra = sorted(set(weights) - set(moments[what])), sorted(set(moments[what]) - set(weights))
        if missing or extra:
            raise ValueError(
                f"optimizer state {what}: no moment for {missing[:4]}{' ...' * (len(missing) > 4)}, moments of "
                f"tensors the model lacks {extra[:4]}{' ...' * (len(extra) > 4)} ({len(moments[what])} moments, "
                f"{len(weights)} tensors)"
            )
        for name, w in weights.items():
            shape = tuple(np.shape(moments[what][name]))
            if shape != tuple(np.shape(w)):
                raise ValueError(
                    f"optimizer state {what} of {name!r}: shape {shape}, the model's {tuple(np.shape(w))} (a "
                    "replaced head or a resampled position embedding has no moments to continue)"
                )


def with_adam_state(opt_state, moments: dict, schedule_count: int | None = None):
    """``opt_state`` with its Adam count, mu and nu replaced by ``moments`` (``adam_state``'s form: numpy,
    canonical names and layouts), each cast to the dtype it replaces; the learning-rate schedule's
    count (``ScaleByScheduleState``) becomes ``schedule_count``, by default the same count, so the next
    step is step ``count``'s (0: a new run's schedule from its start, Adam's bias correction continued).

    Raises:
        ValueError: a name of the state missing from ``moments``, or a shape that differs.
    """

    def fill(tree, table: dict[str, np.ndarray], what: str):
        def one(path, leaf):
            name, kind = _canonical_name(_keys(path))
            if name not in table:
                raise ValueError(f"{what}[{name!r}] is missing from the optimizer state given")
            arr = _from_canonical(np.asarray(table[name]), kind)
            if arr.shape != leaf.shape:
                raise ValueError(f"{what}[{name!r}]: shape {arr.shape}, expected {tuple(leaf.shape)}")
            return jax.numpy.asarray(arr, leaf.dtype)

        return jax.tree_util.tree_map_with_path(one, tree)

    kinds = (optax.ScaleByAdamState, optax.ScaleByScheduleState)

    def swap(x):
        if not isinstance(x, kinds):
            return x
        count = jax.numpy.asarray(moments["count"], x.count.dtype)
        if isinstance(x, optax.ScaleByScheduleState):
            at = moments["count"] if schedule_count is None else schedule_count
            return optax.ScaleByScheduleState(jax.numpy.asarray(at, x.count.dtype))
        return optax.ScaleByAdamState(count, fill(x.mu, moments["mu"], "mu"), fill(x.nu, moments["nu"], "nu"))

    return jax.tree.map(swap, opt_state, is_leaf=lambda x: isinstance(x, kinds))


def train_state(trainer, weights: dict[str, np.ndarray], moments: dict) -> dict:
    """A ``vit_jax.trainer.Trainer`` state at step ``moments["count"]`` holding ``weights`` (canonical) and
    the Adam state ``moments`` (``adam_state``'s form, e.g. ``vit_torch.train.Trainer.adam_state()``):
    the JAX twin continues a torch run. The dropout RNG streams are the trainer's fresh ones.

    Raises:
        StateMismatchError: ``weights`` do not fit the model; ValueError: ``moments`` do not
            (``with_adam_state``).
    """
    from flax import nnx

    from vit_jax.weights import from_numpy

    state = trainer.init_state()
    model = from_numpy(trainer.cfg, weights)
    _, params, _ = nnx.split(model, nnx.Param, ...)
    opt_state = with_adam_state(trainer.tx.init(params), moments)
    shardings = trainer.state_shardings
    return {
        **state,
        "step": jax.device_put(jax.numpy.asarray(moments["count"], jax.numpy.int32), shardings["step"]),
        "params": jax.device_put(params, shardings["params"]),
        "opt_state": jax.device_put(opt_state, shardings["opt_state"]),
    }
