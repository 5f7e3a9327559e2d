"""The JAX twin's Adam state by canonical names: what the twin-training parity compares and converts.

optax keeps Adam's moments in a ``ScaleByAdamState(count, mu, nu)`` somewhere inside the chain that
``vit_jax.train.make_optimizer`` builds (under the clip, inside ``optax.adamw``'s chain, or inside
``multi_transform`` with ``freeze``); ``mu`` and ``nu`` are parameter-shaped trees (frozen parameters
hold ``optax.MaskedNode``). Here they become flat numpy dicts with timm names and PyTorch layouts, the
form ``vit_torch.train.Trainer.adam_state`` gives, so torch's ``exp_avg`` / ``exp_avg_sq`` and optax's
``mu`` / ``nu`` compare (and convert) name by name.
"""

from __future__ import annotations

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


def with_adam_state(opt_state, moments: dict):
    """``opt_state`` with its Adam count, mu and nu replaced by ``moments`` (``adam_state``'s form: numpy,
    canonical names and layouts), each cast to the dtype it replaces; the learning-rate schedule's
    count (``ScaleByScheduleState``) becomes the same count, so the next step is step ``count``'s.

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
            return optax.ScaleByScheduleState(count)
        return optax.ScaleByAdamState(count, fill(x.mu, moments["mu"], "mu"), fill(x.nu, moments["nu"], "nu"))

    return jax.tree.map(swap, opt_state, is_leaf=lambda x: isinstance(x, kinds))


def train_state(trainer, weights: dict[str, np.ndarray], moments: dict) -> dict:
    """A ``vit_jax.train.Trainer`` state at step ``moments["count"]`` holding ``weights`` (canonical) and
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
