"""Orbax checkpoints of the JAX twin: the NNX model's state plus its ViTConfig, in one folder.

Layout: ``PATH/vit_config.json`` ({"format": ..., "vit_config": ..., "rng_impl": ...}) and ``PATH/state``
(orbax ``StandardCheckpointer``): parameters and, for models with dropout or drop path, their RNG
streams. Typed PRNG keys are stored as their raw ``key_data`` (uint32) and wrapped again on restore, so
restoring into an abstract model never trips over the key dtype, whatever the orbax version.
``READERS`` / ``WRITERS`` plug this into ``vit_common.checkpoints.convert``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from vit_common.checkpoints.convert import ORBAX_CONFIG
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.provenance import common_float_dtype
from vit_common.checkpoints.formats.stored import FORMAT_TAG, stored_config
from vit_common.config import ViTConfig
from vit_common.system.io import atomic_write_dir, write_json
from vit_common.system.validate import check_model_size
from vit_jax.model import VisionTransformer
from vit_jax.weights import check_float64, from_numpy, to_numpy


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _pure_dict(state: nnx.State) -> dict:
    """nnx.State -> nested dict of arrays (``nnx.to_pure_dict`` where flax has it)."""
    return nnx.to_pure_dict(state) if hasattr(nnx, "to_pure_dict") else state.to_pure_dict()


def _storable(tree, key_leaf):
    """Nested dict with string keys (orbax), PRNG-key leaves replaced by ``key_leaf(key)``."""
    if isinstance(tree, Mapping):
        return {str(k): _storable(v, key_leaf) for k, v in tree.items()}
    return key_leaf(tree) if _is_key(tree) else tree


def _unpure(template, restored, impl: str):
    """Restored nested dict -> the template's structure (int list indices), keys wrapped again."""
    if isinstance(template, Mapping):
        return {k: _unpure(v, restored[str(k)], impl) for k, v in template.items()}
    return jax.random.wrap_key_data(restored, impl=impl) if _is_key(template) else restored


def save_orbax(path: str | os.PathLike, model: VisionTransformer) -> None:
    """Save ``model`` (its whole NNX state) and its config to the folder ``path``, atomically."""
    state = nnx.state(model)
    keys = [v for v in jax.tree.leaves(_pure_dict(state)) if _is_key(v)]
    impl = str(jax.random.key_impl(keys[0])) if keys else ""
    meta = {"format": FORMAT_TAG, "vit_config": model.cfg.to_json(), "rng_impl": impl}

    def write(tmp: Path) -> None:
        write_json(tmp / ORBAX_CONFIG, meta, indent=1)
        ckptr = ocp.StandardCheckpointer()
        ckptr.save((tmp / "state").absolute(), _storable(_pure_dict(state), jax.random.key_data))
        ckptr.wait_until_finished()
        ckptr.close()

    atomic_write_dir(path, write)


def load_orbax(path: str | os.PathLike, **overrides) -> VisionTransformer:
    """Restore a ``save_orbax`` folder into a model built abstractly (no random init), in eval mode.

    ``overrides`` replace config fields that do not change the state (dtype, attn_impl...).

    Raises:
        FormatError: not such a folder, or orbax cannot restore it into this config's structure.
        ValueError: the stored config needs more memory than `vit_common.system.validate.memory_limit()`.
    """
    path = Path(path)
    try:
        meta = json.loads((path / ORBAX_CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise FormatError(f"{path}: no readable {ORBAX_CONFIG} ({e})") from e
    if not isinstance(meta, dict):
        raise FormatError(f"{path}/{ORBAX_CONFIG}: expected a JSON object")
    cfg = stored_config(meta, str(path))
    cfg = cfg.replace(**overrides) if overrides else cfg
    check_model_size(cfg, str(path))
    check_float64(cfg)
    abstract = nnx.eval_shape(lambda: VisionTransformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    template = _pure_dict(abstract_state)
    ckptr = ocp.StandardCheckpointer()
    try:
        restored = ckptr.restore(
            (path / "state").absolute(), _storable(template, lambda k: jax.eval_shape(jax.random.key_data, k))
        )
    except (ValueError, KeyError, TypeError, FileNotFoundError, OSError) as e:
        raise FormatError(f"{path}: orbax could not restore the state for the stored config ({e})") from e
    finally:
        ckptr.close()
    nnx.replace_by_pure_dict(abstract_state, _unpure(template, restored, meta.get("rng_impl") or None))
    model = nnx.merge(graphdef, abstract_state)
    model.eval()
    return model


def read_orbax(path: str | os.PathLike) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """(config, canonical state) of a ``save_orbax`` folder, for ``vit_common.checkpoints.convert``."""
    model = load_orbax(path)
    return model.cfg, to_numpy(model)


def write_orbax(path: str | os.PathLike, cfg: ViTConfig, state: Mapping[str, np.ndarray]) -> None:
    """Build the JAX twin from a canonical state and save it with ``save_orbax``, its parameters in the
    state's own dtype (a bfloat16 state stays bfloat16, whatever ``cfg.param_dtype`` says)."""
    dtype = common_float_dtype(state)
    save_orbax(path, from_numpy(cfg.replace(param_dtype=dtype) if dtype else cfg, state))


READERS = {"orbax": read_orbax}
WRITERS = {"orbax": write_orbax}
