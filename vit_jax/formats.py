"""Orbax checkpoints of the JAX twin: the NNX model's state plus its ViTConfig, in one folder.

Layout: ``PATH/vit_config.json`` ({"format": ..., "vit_config": ..., "rng_impl": ..., "state_crc32": ...}) and
``PATH/state`` (orbax's PyTree layout, as ``StandardCheckpointer`` writes and restores it): parameters and, for
models with dropout or drop path, their RNG streams. Typed PRNG keys are stored as their raw ``key_data``
(uint32) and wrapped again on restore, so restoring into an abstract model never trips over the key
dtype, whatever the orbax version. ``state_crc32`` holds each stored array's CRC-32
(``vit_common.checkpoints.formats.state_crc``), checked on every restore: orbax checks none.
``READERS`` / ``WRITERS`` plug this into ``vit_common.checkpoints.convert``; ``READERS["timm"]`` reads a
timm hub folder's config.json through timm in a child process (``vit_jax.torch_bridge``: vit_jax never
imports torch).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from vit_common.checkpoints.convert import ORBAX_CONFIG
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.provenance import common_float_dtype
from vit_common.checkpoints.formats.state_crc import RECORD_KEY, check_record, record
from vit_common.checkpoints.formats.stored_config import FORMAT_TAG, stored_config
from vit_common.config import ViTConfig
from vit_common.system.io import atomic_write_dir, check_free_space, folder_mark, read_json, write_json
from vit_common.system.validate import check_model_size
from vit_jax.checkpointing import DAMAGED_DATA, closed_loop_dropped, orbax_reports_dropped, read_error_reason
from vit_jax.keys import data_to_keys, key_impl_name, keys_to_data
from vit_jax.model import VisionTransformer
from vit_jax.torch_bridge import read_timm_hub_config
from vit_jax.weights import abstract_model, check_float64, host_model, to_numpy


def _pure_dict(state: nnx.State) -> dict:
    """nnx.State -> nested dict of arrays (``nnx.to_pure_dict`` where flax has it)."""
    return nnx.to_pure_dict(state) if hasattr(nnx, "to_pure_dict") else state.to_pure_dict()


def _string_keys(tree):
    """Nested dict with string keys (what orbax stores; NNX pure dicts index lists by int)."""
    return {str(k): _string_keys(v) for k, v in tree.items()} if isinstance(tree, Mapping) else tree


def _template_keys(template, restored):
    """A restored nested dict (string keys) in ``template``'s structure (its int list indices)."""
    if isinstance(template, Mapping):
        return {k: _template_keys(v, restored[str(k)]) for k, v in template.items()}
    return restored


@contextlib.contextmanager
def quiet_orbax() -> Iterator[None]:
    """Orbax's own error reports off while the block runs: a failed write (a full disk) is raised to the
    caller, which names it in one line, while orbax's threads log the same error with tracebacks through
    absl, asyncio and concurrent.futures, and tensorstore's done-callbacks, still running on its own threads
    after orbax closed its asyncio loop, report ``RuntimeError('Event loop is closed')`` through
    ``sys.unraisablehook`` (tensorstore's C++ calls ``PyErr_WriteUnraisable``). So the loggers are raised
    to CRITICAL, fd 2 points at /dev/null while the block runs, and ``sys.unraisablehook`` drops exactly
    that error (``vit_jax.checkpointing.closed_loop_dropped``); after a failure the loggers and the hook
    stay so for the rest of the process, since those threads report on after the block (other unraisable
    errors still reach the previous hook)."""
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio", "concurrent.futures")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    hook = sys.unraisablehook
    sys.unraisablehook = closed_loop_dropped(hook)
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        gc.collect()
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if not failed:
            sys.unraisablehook = hook
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


# OCDBT data files of at most about 4 MiB (orbax's default: 2 GB): tensorstore holds each data file's
# bytes until it writes the file, so with orbax's default a whole model waited in memory (1.0x the file
# beside the mapped tensors); written 4 MiB at a time, a B/16 float32 conversion rose by 0.2 to 0.4x.
# A tensor larger than that is a file of its own.
DATA_FILE_BYTES = 4 << 20


def save_orbax(path: str | os.PathLike, model: VisionTransformer, extra: Mapping[str, Any] | None = None) -> None:
    """Save ``model`` (its whole NNX state) and its config to the folder ``path``, atomically; ``extra``
    entries go into its config file too (the ``vit_assumed`` list of fields its source did not state)."""
    state = nnx.state(model)
    meta = {"format": FORMAT_TAG, "vit_config": model.cfg.to_json(), "rng_impl": key_impl_name(_pure_dict(state))}
    meta |= dict(extra or {})

    tree = _string_keys(keys_to_data(_pure_dict(state)))

    def write(tmp: Path) -> None:
        check_free_space(tmp, sum(x.nbytes for x in jax.tree.leaves(tree)))  # before orbax starts its threads
        checked = meta | {RECORD_KEY: record(tree, _host_values)}  # checked by load_orbax
        write_json(tmp / ORBAX_CONFIG, folder_mark(checked, [ORBAX_CONFIG, "state"]), indent=1)
        ckptr = _checkpointer()
        try:
            args = ocp.args.PyTreeSave(tree, ocdbt_target_data_file_size=DATA_FILE_BYTES)
            ckptr.save((tmp / "state").absolute(), args=args)
        finally:
            ckptr.close()

    with quiet_orbax():
        atomic_write_dir(path, write)


def _checkpointer() -> ocp.Checkpointer:
    """Orbax's synchronous PyTree checkpointer, writing ``StandardCheckpointer``'s layout (OCDBT, zarr)
    without its zstd compression, with numpy arrays written as they are: orbax's ``NumpyHandler``
    deep-copies each array before writing it by default, a second copy of the model in memory.
    Uncompressed, a B/16 float32 conversion wrote in half the time for a folder 10% larger
    (``StandardCheckpointer`` restores either: the codec is in each array's metadata)."""
    th = ocp.type_handlers
    registry = th.create_type_handler_registry(
        (np.ndarray, th.NumpyHandler(deepcopy_host_arrays=False)),
        (jax.Array, th.get_type_handler(jax.Array)),
    )
    return ocp.Checkpointer(ocp.PyTreeCheckpointHandler(type_handler_registry=registry, use_compression=False))


def load_orbax(path: str | os.PathLike, **overrides) -> VisionTransformer:
    """Restore a ``save_orbax`` folder into a model built abstractly (no random init), in eval mode.

    ``overrides`` replace config fields that do not change the state (dtype, attn_impl...).

    Raises:
        FormatError: not such a folder, or orbax cannot restore it into this config's structure, or an array
            restored differs from the CRC-32 recorded when it was written (a damaged or changed data file).
        ValueError: the stored config needs more memory than `vit_common.system.validate.memory_limit()`.
    """
    path = Path(path)
    try:
        meta = read_json(path / ORBAX_CONFIG)  # bounded in size and depth
    except (OSError, ValueError) as e:
        raise FormatError(f"{path}: no readable {ORBAX_CONFIG} ({e})") from e
    if not isinstance(meta, dict):
        raise FormatError(f"{path}/{ORBAX_CONFIG}: expected a JSON object")
    cfg = stored_config(meta, str(path))
    cfg = cfg.replace(**overrides) if overrides else cfg
    check_model_size(cfg, str(path))
    check_float64(cfg)
    graphdef, abstract_state = nnx.split(abstract_model(cfg))
    template = _pure_dict(abstract_state)
    with orbax_reports_dropped(path.absolute()):  # a damaged folder's failed read: orbax's late reports
        ckptr = ocp.StandardCheckpointer()
        try:
            restored = ckptr.restore((path / "state").absolute(), _string_keys(keys_to_data(template)))
        except (ValueError, KeyError, TypeError, FileNotFoundError, OSError) as e:
            reason = read_error_reason(e)
            if reason.startswith(DAMAGED_DATA):
                raise FormatError(f"{path}: the data files were changed or damaged (tensorstore: {reason})") from e
            raise FormatError(f"{path}: orbax could not restore the state for the stored config ({reason})") from e
        finally:
            ckptr.close()
    if RECORD_KEY in meta:  # folders written before vit recorded checksums have none
        check_record(meta[RECORD_KEY], restored, f"{path}/state", ORBAX_CONFIG, _host_values)
    restored = data_to_keys(_template_keys(template, restored), template, meta.get("rng_impl") or None)
    nnx.replace_by_pure_dict(abstract_state, restored)
    model = nnx.merge(graphdef, abstract_state)
    model.eval()
    return model


def _host_values(x: np.ndarray | jax.Array) -> np.ndarray:
    """``x``'s values on the host (a numpy array as it is). A JAX array off the CPU is copied on its device
    first: jax keeps the values it copies to the host on the array, a second copy of the model there."""
    off_cpu = isinstance(x, jax.Array) and any(d.platform != "cpu" for d in x.devices())
    return np.asarray(x.copy() if off_cpu else x)


def read_orbax(path: str | os.PathLike) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """(config, canonical state) of a ``save_orbax`` folder, for ``vit_common.checkpoints.convert``."""
    model = load_orbax(path)
    return model.cfg, to_numpy(model)


def write_orbax(
    path: str | os.PathLike, cfg: ViTConfig, state: Mapping[str, np.ndarray], extra: Mapping[str, Any] | None = None
) -> None:
    """Save a canonical state as ``save_orbax`` saves the JAX twin holding it (``extra`` as there), its
    parameters in the state's own dtype (a bfloat16 state stays bfloat16, whatever ``cfg.param_dtype`` says).

    The parameters go to orbax as numpy views of the state's tensors in the twin's layout
    (``vit_jax.weights.host_model``): a lazily read state is written from the file's mapped pages, so the
    host holds no copy of the model, only orbax's compressed buffers."""
    dtype = common_float_dtype(state)
    save_orbax(path, host_model(cfg.replace(param_dtype=dtype) if dtype else cfg, state), extra)


READERS = {"orbax": read_orbax, "timm": read_timm_hub_config}
WRITERS = {"orbax": write_orbax}
