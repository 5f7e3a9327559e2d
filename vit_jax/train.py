"""Training the JAX twin: jit steps over a device mesh, orbax checkpoints, exact resume.

The train state is one pytree ``{"step", "params", "rest", "opt_state"}``: ``params`` the model's
``nnx.Param`` state, ``rest`` everything else the model holds (dropout / drop-path RNG streams); with
``tcfg.ema`` also ``"ema"``, the exponential moving average of ``params`` (timm's ``ModelEmaV3``, updated
inside the step after the optimizer's update: ``ema_update``), so it is checkpointed with the rest.
Both steps are ``jax.jit`` functions of (state, batch) on split NNX state, compiled once: every batch
has the same shape because the last batch of an epoch is padded and masked (``vit_jax.data``).

Devices: a 1-D ``jax.sharding.Mesh`` named "data" over all devices. Batches are split along it;
parameters and optimizer state are replicated ('dp', data parallel) or each array is split along its
largest axis divisible by the device count ('fsdp', ZeRO-3 style; XLA inserts the gathers).
Multi-process runs start (and stop when a process is lost) through ``vit_jax.distributed``.
A signal (SIGTERM, SIGHUP, Ctrl-C) stops ``fit`` after the step it arrives in, with a checkpoint of
that step (``vit_jax.preemption``); TensorBoard summaries and profiles: ``vit_jax.observe``.

Optimizer (optax): global-norm gradient clipping, then AdamW with linear warmup + cosine decay, the
decay mask and conventions of ``tcfg.recipe`` (``vit_common.recipes``; the default ``twins``: no weight
decay on biases, norms, class/register tokens, position embeddings and the MAP probe); for
fine-tuning, optionally the head only (``freeze``) or layer-wise learning-rate decay (``layer_decay``),
see ``make_optimizer``. ``vit_torch/train.py`` is the same step in PyTorch. Loss: softmax cross-entropy
against label-smoothed (and mixup/cutmix-mixed) targets, averaged over the real (mask 1) examples of
the batch; gradient accumulation scans over micro-batches and divides by the batch's real count, so it
equals one big batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vit_common import recipes
from vit_common.config import ViTConfig
from vit_common.data.batches import batches_per_epoch, examples_before
from vit_common.data.datasets import Dataset
from vit_common.data.fingerprint import fingerprint_changes
from vit_common.data.images import Preprocess
from vit_common.data.train_config import RunOptions, TrainConfig
from vit_common.recipes import TORCH_CLIP_EPS, Recipe, decays, get_recipe, schedule_steps
from vit_common.system import in_place, io
from vit_common.system.validate import regular_file
from vit_jax.data import DataWorkerError, eval_batches, iterate, train_batches, transform_for
from vit_jax.keys import data_to_keys, key_impl_name, keys_to_data
from vit_jax.model import VisionTransformer
from vit_jax.observe import ProfileWindow, Summaries, require_wandb
from vit_jax.optimizer_state import with_adam_state
from vit_jax.preemption import Stopped, StopSignals
from vit_jax.weights import _canonical_name, from_numpy, to_numpy


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm became NaN or Inf."""


# ------------------------------------------------------------------------------------ devices


def make_mesh(devices=None) -> Mesh:
    """A 1-D mesh with axis "data" over ``devices`` (default: all devices of all processes)."""
    return Mesh(np.array(jax.devices() if devices is None else devices), ("data",))


def _fsdp_spec(shape: tuple[int, ...], n: int) -> P:
    """Shard the largest axis that ``n`` divides; replicate when none does."""
    axes = [i for i in np.argsort(shape, kind="stable")[::-1] if shape[i] % n == 0 and shape[i] >= n]
    if n == 1 or not axes:
        return P()
    spec = [None] * len(shape)
    spec[int(axes[0])] = "data"
    return P(*spec)


# --------------------------------------------------------------------------------- the model


def build_model(cfg: ViTConfig, seed: int, remat: bool = False) -> VisionTransformer:
    """A freshly initialised VisionTransformer (training mode); ``remat``: each block recomputed in the
    backward pass (``VisionTransformer.set_grad_checkpointing``)."""
    model = VisionTransformer(cfg, rngs=nnx.Rngs(seed))
    model.set_grad_checkpointing(remat)
    return model


def _canonical(path) -> str:
    """The canonical (timm) name of the parameter at a pytree path of an ``nnx.Param`` State."""
    return _canonical_name(tuple(str(k) for k in _top_keys(path)))[0]


def decay_mask(params: nnx.State, recipe: Recipe, no_weight_decay: Collection[str]) -> nnx.State:
    """True where AdamW applies weight decay under ``recipe`` (``vit_common.recipes.decays`` on canonical
    names; ``no_weight_decay`` the model's ``no_weight_decay()``)."""
    return jax.tree_util.tree_map_with_path(lambda p, x: decays(recipe, _canonical(p), x.ndim, no_weight_decay), params)


def _top_keys(path) -> list:
    return [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]


def layer_ids(params: nnx.State, depth: int) -> nnx.State:
    """Each parameter's layer for layer-wise decay, numbered as timm's ``param_groups_layer_decay``
    (``vit_common.recipes.layer_ids``): 0 the stem (patch embedding, tokens, position embedding,
    norm_pre), i + 1 block i, the final norm with the last block, ``depth + 1`` what follows it."""
    names = jax.tree_util.tree_leaves(jax.tree_util.tree_map_with_path(lambda p, _: _canonical(p), params))
    ids = recipes.layer_ids(names, depth)
    return jax.tree_util.tree_map_with_path(lambda p, _: ids[_canonical(p)], params)


def trainable_mask(params: nnx.State, tcfg: TrainConfig) -> nnx.State:
    """True for parameters the optimizer changes: all, or with ``freeze`` the head only (linear probe)."""
    return jax.tree_util.tree_map_with_path(lambda p, _: not tcfg.freeze or _top_keys(p)[0] == "head", params)


def _clip(recipe: Recipe, max_norm: float) -> optax.GradientTransformation:
    """Global-norm clipping as the recipe's library does it: optax's ``clip_by_global_norm`` (g x max /
    norm), or torch's ``clip_grad_norm_`` (g x min(1, max / (norm + 1e-6)), ``torch/nn/utils/clip_grad.py``),
    the latter as an ``optax.stateless`` scaling."""
    if recipe.clip == "optax":
        return optax.clip_by_global_norm(max_norm)

    def scale(updates, params):
        coef = jnp.minimum(max_norm / (optax.tree_utils.tree_norm(updates) + TORCH_CLIP_EPS), 1.0)
        return jax.tree.map(lambda g: g * coef.astype(g.dtype), updates)

    return optax.stateless(scale)


def _schedule(peak: float, warmup: int, decay_steps: int, end_ratio: float) -> optax.Schedule:
    """optax's warmup-cosine from 0 to ``peak`` and down to ``peak * end_ratio``. optax computes it in
    float32 even with jax_enable_x64 on (from the int32 count); then the count enters as float64, so a
    float64 run's learning rate is float64, as torch's Python-float one (``vit_common.recipes.lr_factor``)."""
    base = optax.warmup_cosine_decay_schedule(
        0.0, peak, warmup_steps=warmup, decay_steps=decay_steps, end_value=peak * end_ratio
    )
    if not jax.config.jax_enable_x64:
        return base
    return lambda count: base(jnp.asarray(count, jnp.float64))


def lr_schedule(tcfg: TrainConfig, total_steps: int) -> optax.Schedule:
    """The learning rate of each of ``total_steps`` optimizer steps: linear warmup from 0 to ``lr`` over
    ``warmup_steps`` (at most all steps but one), then cosine decay to ``lr * min_lr_ratio`` at the last
    (``vit_common.recipes.schedule_steps``, ``_schedule``)."""
    warmup, decay_steps = schedule_steps(tcfg.warmup_steps, total_steps)
    return _schedule(tcfg.lr, warmup, decay_steps, tcfg.min_lr_ratio)


def make_optimizer(
    tcfg: TrainConfig, total_steps: int, depth: int, *, no_weight_decay: Collection[str]
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimizer, learning-rate schedule) for ``total_steps`` optimizer steps of a ``depth``-block model
    under ``tcfg.recipe`` (``vit_common.recipes``); ``no_weight_decay`` is the model's ``no_weight_decay()``.

    Global-norm clipping (the recipe's), then AdamW with linear warmup and cosine decay: ``optax.adamw``
    with the recipe's decay mask, or for big_vision ``big_vision/optax.py``'s chain ``scale_by_adam
    (mu_dtype=bfloat16), scale(lr), add_decayed_weights(wd, kernels), scale_by_schedule(lr(t) / lr),
    scale(-1)``. ``freeze``: the same on the head only, every other parameter left unchanged
    (``optax.multi_transform`` with ``set_to_zero``); clipping then sees the head's gradient only.
    ``layer_decay`` r: the update of a parameter in layer l (``layer_ids``) scaled by r^(L - l), L the
    top layer, as timm's per-group lr_scale does (weight decay included); for big_vision as its
    ``lr_mults``, before the decay, which it then does not scale.
    """
    recipe = get_recipe(tcfg.recipe)
    warmup, decay_steps = schedule_steps(tcfg.warmup_steps, total_steps)
    schedule = lr_schedule(tcfg, total_steps)
    mask = lambda p: decay_mask(p, recipe, no_weight_decay)  # noqa: E731
    layered = tcfg.layer_decay != 1 and not tcfg.freeze

    def layer_scale() -> optax.GradientTransformation:
        def exponents(p):
            names = jax.tree_util.tree_map_with_path(lambda q, _: _canonical(q), p)
            table = recipes.layer_exponents(jax.tree_util.tree_leaves(names), depth)
            return jax.tree.map(lambda n: table[n], names)

        return optax.multi_transform({k: optax.scale(tcfg.layer_decay**k) for k in range(depth + 2)}, exponents)

    if recipe.decay_scaled_by_lr:
        adamw = optax.adamw(
            schedule,
            b1=tcfg.b1,
            b2=tcfg.b2,
            eps=recipe.eps,
            weight_decay=tcfg.weight_decay,
            mask=mask,
            mu_dtype=recipe.mu_dtype,
        )
        tx = optax.chain(adamw, layer_scale()) if layered else adamw
    else:
        relative = _schedule(1.0, warmup, decay_steps, tcfg.min_lr_ratio)
        tx = optax.chain(
            optax.scale_by_adam(b1=tcfg.b1, b2=tcfg.b2, eps=recipe.eps, mu_dtype=recipe.mu_dtype),
            optax.scale(tcfg.lr),
            *([layer_scale()] if layered else []),
            optax.add_decayed_weights(tcfg.weight_decay, mask),
            optax.scale_by_schedule(relative),
            optax.scale(-1.0),
        )
    tx = optax.chain(_clip(recipe, tcfg.grad_clip), tx) if tcfg.grad_clip else tx
    if tcfg.freeze:
        labels = lambda p: jax.tree.map(lambda m: "train" if m else "frozen", trainable_mask(p, tcfg))  # noqa: E731
        tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
    return tx, schedule


def ema_decay(tcfg: TrainConfig, step: jax.Array) -> jax.Array:
    """``TrainConfig.ema_decay`` of the traced optimizer step ``step`` (1-based, int32 scalar): timm's
    ``ModelEmaV3.get_decay`` (``timm/utils/model_ema.py``), 0 at step 1, computed in float64 when
    jax_enable_x64 is on (as timm's Python float) and float32 otherwise."""
    k = jnp.maximum(step - 1, 0).astype(jnp.result_type(float))
    decay = jnp.asarray(tcfg.ema, k.dtype)
    if tcfg.ema_warmup:
        warm = 1 - (1 + k / tcfg.ema_warmup_gamma) ** -tcfg.ema_warmup_power
        decay = jnp.maximum(jnp.minimum(warm, decay), tcfg.ema_min_decay)
    return jnp.where(k <= 0, jnp.zeros_like(decay), decay)


def ema_update(tcfg: TrainConfig, ema: nnx.State, params: nnx.State, step: jax.Array) -> nnx.State:
    """The moving average after optimizer step ``step`` (1-based) has made ``params``: ema x decay + params
    x (1 - decay) (``optax.incremental_update``; timm's ``lerp_`` of every floating-point state_dict
    tensor, ``ema_decay``), the weight cast to each tensor's dtype so the average keeps it. Every
    parameter is floating point; the model's other state (``rest``, RNG streams) is not averaged, as timm
    copies non-float buffers, and the EMA is evaluated with the current one."""
    w = 1 - ema_decay(tcfg, step)
    return jax.tree.map(lambda e, p: optax.incremental_update(p, e, w.astype(p.dtype)), ema, params)


# --------------------------------------------------------------------------------- the steps


class Trainer:
    """Compiled train and eval steps for one (model config, train config, dataset size, mesh).

    ``state`` pytrees live on ``mesh`` with ``state_shardings``; batches are numpy dicts from
    ``vit_jax.data`` holding this process's rows of each global batch. ``preprocess`` is how images become
    model input (default ``Preprocess()``: [-1, 1], bilinear); ``weights`` a canonical state to start from instead of
    a fresh initialisation (fine-tuning); ``moments`` an Adam state to continue (``vit_jax.optimizer_state``'s
    form: {"count", "mu", "nu"} by canonical names, e.g. a timm training checkpoint's through
    ``vit_torch.formats.read_timm_optimizer``): the first state holds them and their count (Adam's bias
    correction goes on), while the schedule and the data start at this run's step 0; ``workers`` the input
    pipeline's worker processes.

    Raises:
        ValueError: batch size not divisible by device count x accum_steps, or a config that does not
            fit the dataset (image size, channels, classes) or ``weights``, or an EMA of low-precision
            parameters (``TrainConfig.check_ema_dtype``).
    """

    def __init__(
        self,
        cfg: ViTConfig,
        tcfg: TrainConfig,
        data: Dataset,
        mesh: Mesh | None = None,
        *,
        preprocess: Preprocess | None = None,
        weights: dict[str, np.ndarray] | None = None,
        moments: dict | None = None,
        workers: int = 0,
    ):
        if cfg.num_classes != data.num_classes:
            raise ValueError(f"num_classes={cfg.num_classes} but dataset {data.name!r} has {data.num_classes}")
        if cfg.in_chans != data.channels or tuple(cfg.image_size) != tuple(data.image_size):
            raise ValueError(
                f"model expects {cfg.image_size} x {cfg.in_chans} channels, dataset gives "
                f"{data.image_size} x {data.channels}"
            )
        tcfg.check_ema_dtype(cfg.param_dtype)
        self.cfg, self.tcfg, self.data, self.init_weights, self.workers = cfg, tcfg, data, weights, workers
        self.init_moments = moments
        self.preprocess = preprocess or Preprocess()
        self.train_transform = transform_for(data, self.preprocess, tcfg.augment)
        self.eval_transform = transform_for(data, self.preprocess)
        self._test_batches = None
        self.mesh = mesh or make_mesh()
        n = self.mesh.size
        micro = tcfg.batch_size // tcfg.accum_steps
        if micro % n:
            raise ValueError(
                f"batch_size={tcfg.batch_size} / accum_steps={tcfg.accum_steps} = {micro} examples per "
                f"micro-batch is not divisible by the {n} devices"
            )
        self.steps_per_epoch = batches_per_epoch(len(data.train), tcfg.batch_size)
        self.total_steps = self.steps_per_epoch * tcfg.epochs
        model = nnx.eval_shape(lambda: build_model(cfg, tcfg.seed, tcfg.remat))
        self.tx, self.schedule = make_optimizer(
            tcfg, self.total_steps, cfg.depth, no_weight_decay=model.no_weight_decay()
        )
        model.eval()
        self.eval_graphdef = nnx.graphdef(model)
        model.train()
        self.train_graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        self.trainable = trainable_mask(params, tcfg)
        self.abstract_state = {
            "step": jax.ShapeDtypeStruct((), jnp.int32),
            "params": params,
            "rest": rest,
            "opt_state": jax.eval_shape(self.tx.init, params),
        } | ({"ema": params} if tcfg.ema is not None else {})
        rule = (lambda s: _fsdp_spec(s, n)) if tcfg.sharding == "fsdp" else (lambda s: P())
        self.state_shardings = jax.tree.map(lambda x: NamedSharding(self.mesh, rule(x.shape)), self.abstract_state)
        self.batch_sharding = NamedSharding(self.mesh, P("data"))
        replicated = NamedSharding(self.mesh, P())

        self._train_jit = jax.jit(
            train_step_fn(self),
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, replicated),
            donate_argnums=0,
        )
        self._eval_jit = jax.jit(
            eval_step_fn(self),
            in_shardings=(self.state_shardings["params"], self.state_shardings["rest"], self.batch_sharding),
            out_shardings=replicated,
        )

    def init_state(self) -> dict:
        """The first train state placed with ``state_shardings``: the model holding ``weights`` if given,
        else a fresh one seeded by ``tcfg.seed`` (the dropout RNG streams are seeded by it either way);
        the Adam state ``moments`` if given, else a fresh one.

        Built eagerly on the host side of JAX, then placed: every process computes the same values,
        the random-initialiser kernels compile once per process and shape (XLA's threefry kernels are
        slow to compile), and the values do not depend on the device count. With ``tcfg.ema`` the moving
        average starts as a copy of the weights (timm's ``ModelEmaV3`` deep-copies the model).
        """
        if self.init_weights is None:  # the state only: remat (a part of the graphdef) changes none of it
            model = build_model(self.cfg, self.tcfg.seed)
        else:
            model = from_numpy(self.cfg, self.init_weights, seed=self.tcfg.seed)
            model.train()
        _, params, rest = nnx.split(model, nnx.Param, ...)
        opt_state = self.tx.init(params)
        if self.init_moments is not None:
            opt_state = with_adam_state(opt_state, self.init_moments, schedule_count=0)
        state = {"step": jnp.zeros((), jnp.int32), "params": params, "rest": rest, "opt_state": opt_state}
        if self.tcfg.ema is not None:
            state["ema"] = jax.tree.map(jnp.copy, params)
        host = jax.tree.map(np.asarray, keys_to_data(state))
        return data_to_keys(jax.device_put(host, self.state_shardings), state, key_impl_name())

    def train_iterator(self, start: int = 0):
        """This process's training batches from batch ``start`` on (``vit_jax.data.BatchIterator``, with
        the trainer's worker processes)."""
        batches = train_batches(
            self.data.train,
            self.cfg.num_classes,
            batch_size=self.tcfg.batch_size,
            epochs=self.tcfg.epochs,
            seed=self.tcfg.seed,
            transform=self.train_transform,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        return iterate(batches, start=start, workers=self.workers)

    def device_batch(self, batch: dict) -> dict:
        """This process's rows of a global batch (numpy, B / process count rows, as ``vit_jax.data``
        gives them; a dict of arrays or of dicts of arrays, as the parity mode's "dropout_masks") ->
        global jax arrays of B rows sharded along "data".

        Raises:
            ValueError: the batch does not have B / process count rows.
        """
        rows = self.tcfg.batch_size // jax.process_count()
        if any(len(v) != rows for v in jax.tree.leaves(batch)):
            shapes = jax.tree.map(np.shape, batch)
            raise ValueError(f"batch {shapes}: expected {rows} rows (this process's share of {self.tcfg.batch_size})")
        return jax.tree.map(lambda v: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v)), batch)

    def batch_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        """The global batch the steps take, sharded along "data": image float32 [B, H, W, C], label int32
        [B], target float32 [B, K], mask float32 [B] (what ``vit_jax.data`` makes)."""
        b, (h, w), c, k = self.tcfg.batch_size, self.cfg.image_size, self.cfg.in_chans, self.cfg.num_classes
        shapes = {"image": ((b, h, w, c), jnp.float32), "label": ((b,), jnp.int32)}
        shapes |= {"target": ((b, k), jnp.float32), "mask": ((b,), jnp.float32)}
        return {n: jax.ShapeDtypeStruct(s, d, sharding=self.batch_sharding) for n, (s, d) in shapes.items()}

    def compile(self) -> None:
        """Trace and compile the training step now, from the state's and the batch's shapes alone (JAX's
        ahead-of-time ``lower(...).compile()``; ``train_step`` then finds the program compiled), so that
        compiling can overlap the input pipeline's start (``BatchIterator.start_prefetch``)."""
        self._train_jit.lower(sharded_abstract(self), self.batch_spec()).compile()

    def train_step(self, state: dict, batch: dict) -> tuple[dict, dict]:
        """One optimizer step on this process's rows of a global batch. Metrics: loss (mean over real
        examples), correct, count, grad_norm (of the trainable parameters), lr."""
        return self._train_jit(state, self.device_batch(batch))

    def eval_step(self, state: dict, batch: dict, *, ema: bool = False) -> dict:
        """Metrics of one batch: loss_sum, correct, correct5 (the label among the 5 highest logits, or all
        K when K < 5), count, and logits float32 [B, K] with their mask [B]
        (padding included; all B rows of the global batch on every process). ``ema``: of the moving
        average of the weights (``state["ema"]``) instead of the weights."""
        return self._eval_jit(state["ema" if ema else "params"], state["rest"], self.device_batch(batch))

    def evaluate(self, state: dict, source, *, with_logits: bool = False, ema: bool = False) -> dict:
        """Loss and accuracy over every example of ``source`` (each counted exactly once), of the weights
        or with ``ema`` of their moving average.

        With worker processes, the test set's batches come from one endless pass-after-pass iterator whose
        workers live until ``close()``, so that an evaluation every epoch does not start them anew.

        Returns {"loss", "accuracy", "top5_accuracy", "count"} and, with ``with_logits``, "logits"
        float32 [N, K].
        """
        loss = correct = correct5 = count = 0.0
        logits = []
        batches = eval_batches(
            source,
            self.cfg.num_classes,
            batch_size=self.tcfg.batch_size,
            transform=self.eval_transform,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        if self.workers and source is self.data.test:
            if self._test_batches is None:
                self._test_batches = iterate(batches.repeat(), workers=self.workers)
            it = (next(self._test_batches) for _ in range(len(batches)))
        else:
            it = iterate(batches)
        for batch in it:
            m = jax.device_get(self.eval_step(state, batch, ema=ema))
            loss, correct, count = loss + m["loss_sum"], correct + m["correct"], count + m["count"]
            correct5 += m["correct5"]
            if with_logits:
                logits.append(m["logits"][m["mask"] > 0])  # the global batch's rows, every process's
        out = {"loss": float(loss / count), "accuracy": float(correct / count), "count": int(count)}
        out["top5_accuracy"] = float(correct5 / count)
        if with_logits:
            out["logits"] = np.concatenate(logits)
        return out

    def close(self) -> None:
        """Stop the test set's worker processes, if any (``evaluate``)."""
        if self._test_batches is not None:
            self._test_batches.close()
            self._test_batches = None

    def weights(self, state: dict, *, ema: bool = False) -> dict[str, np.ndarray]:
        """The canonical state (timm names, numpy) of the model in ``state``, gathered from all devices;
        ``ema``: of the moving average of its weights (``tcfg.ema``).

        With several processes every process must call this (the gather is collective).
        """
        params = state["ema" if ema else "params"]
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            params = multihost_utils.process_allgather(params, tiled=True)
        return to_numpy(nnx.merge(self.eval_graphdef, params, state["rest"]))


def _forward(graphdef, params, rest, images, drop_masks=None, dropout_masks=None):
    """(logits [B, K] in at least float32 (float64 models keep float64), the model's non-parameter
    state after the call); ``drop_masks`` [B, depth, 2] and ``dropout_masks`` {module path: [B, ...]}
    the parity mode's drop-path and dropout masks, or None.

    ``rest`` is rebuilt by an identity tree map so that its Variables (dropout RNG counters) belong
    to the current trace: NNX refuses to update a Variable created outside ``jax.value_and_grad``.
    """
    model = nnx.merge(graphdef, params, jax.tree.map(lambda v: v, rest))
    logits = model(images, drop_masks=drop_masks, dropout_masks=dropout_masks)
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    return logits, nnx.state(model, nnx.Not(nnx.Param))


def loss_and_grads(t: Trainer, params, rest, batch: dict):
    """Summed-over-examples gradients of one batch, scanned over ``accum_steps`` micro-batches.

    Returns (grads summed over the real examples, rest after the forward passes, loss sum, correct
    count). Micro-batch i holds rows i, i+A, i+2A, ... so each keeps the batch's device split. With
    ``freeze`` the frozen parameters enter through ``stop_gradient``: their gradients are zeros and no
    backward pass runs through the frozen layers. A batch with "drop_masks" float [B, depth, 2] or
    "dropout_masks" {module path: float [B, ...]} hands them to the model (the twins' parity mode,
    ``VisionTransformer.__call__``).
    """
    tcfg, a = t.tcfg, t.tcfg.accum_steps

    def loss_sum(p, rest, mb):
        if tcfg.freeze:
            p = jax.tree.map(lambda train, x: x if train else jax.lax.stop_gradient(x), t.trainable, p)
        logits, rest = _forward(t.train_graphdef, p, rest, mb["image"], mb.get("drop_masks"), mb.get("dropout_masks"))
        targets = mb["target"].astype(logits.dtype)
        targets = optax.smooth_labels(targets, tcfg.label_smoothing) if tcfg.label_smoothing else targets
        ce = optax.softmax_cross_entropy(logits, targets)  # [b]
        correct = ((jnp.argmax(logits, -1) == mb["label"]) * mb["mask"]).sum()
        return (ce * mb["mask"]).sum(), (rest, correct)

    def accumulate(carry, mb):
        grads, rest, loss, correct = carry
        (l, (rest, c)), g = jax.value_and_grad(loss_sum, has_aux=True)(params, rest, mb)
        return (jax.tree.map(jnp.add, grads, g), rest, loss + l, correct + c), None

    micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(x.shape[0] // a, a, *x.shape[1:]), 0, 1), batch)
    zero = jnp.zeros((), jnp.float32)
    loss0 = jnp.zeros((), jnp.promote_types(t.cfg.dtype, jnp.float32))  # the logits' dtype (_forward)
    init = (jax.tree.map(jnp.zeros_like, params), rest, loss0, zero)
    return jax.lax.scan(accumulate, init, micro)[0]


def train_step_fn(t: Trainer):
    def train_step(state: dict, batch: dict) -> tuple[dict, dict]:
        params = state["params"]
        grads, rest, loss, correct = loss_and_grads(t, params, state["rest"], batch)
        count = jnp.maximum(batch["mask"].sum(), 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)
        updates, opt_state = t.tx.update(grads, state["opt_state"], params)
        new = {
            "step": state["step"] + 1,
            "params": optax.apply_updates(params, updates),
            "rest": rest,
            "opt_state": opt_state,
        }
        if "ema" in state:
            new["ema"] = ema_update(t.tcfg, state["ema"], new["params"], new["step"])
        metrics = {
            "loss": loss / count,
            "correct": correct,
            "count": batch["mask"].sum(),
            "grad_norm": optax.tree_utils.tree_norm(grads),
            "lr": t.schedule(state["step"]),
        }
        return new, metrics

    return train_step


def eval_step_fn(t: Trainer):
    def eval_step(params, rest, batch: dict) -> dict:
        logits, _ = _forward(t.eval_graphdef, params, rest, batch["image"])
        ce = optax.softmax_cross_entropy(logits, batch["target"])
        mask = batch["mask"]
        top = jax.lax.top_k(logits, min(5, logits.shape[-1]))[1]  # [B, 5]: the five highest logits' classes
        return {
            "loss_sum": (ce * mask).sum(),
            "correct": ((jnp.argmax(logits, -1) == batch["label"]) * mask).sum(),
            "correct5": ((top == batch["label"][:, None]).any(-1) * mask).sum(),
            "count": mask.sum(),
            "logits": logits,
            "mask": mask,
        }

    return eval_step


# ------------------------------------------------------------------------------ compilation cache

_CACHE_COUNTS: dict[str, int] = {"cache_hits": 0, "cache_misses": 0}
_LISTENING = []


def enable_compile_cache(directory: str | os.PathLike) -> Path:
    """Turn on JAX's persistent compilation cache in ``directory`` (made if missing) for every program,
    however fast it compiled, so that a second run of the same configuration skips XLA compilation.
    Must run before the first compilation. Returns the directory.

    Raises:
        OSError: ``directory`` cannot be made (a file in its place) or is not writable (a read-only
            disk, another user's folder); the message names it and nothing was turned on.
    """
    path = Path(directory).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"{path}: cannot be made ({e.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise OSError(f"{path}: not writable")
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _cache_events() -> dict[str, int]:
    """Persistent-cache hits and misses of this process so far (jax.monitoring events)."""
    if not _LISTENING:

        def count(event: str, **_) -> None:
            name = event.rsplit("/", 1)[-1]
            if name in _CACHE_COUNTS:
                _CACHE_COUNTS[name] += 1

        jax.monitoring.register_event_listener(count)
        _LISTENING.append(count)
    return dict(_CACHE_COUNTS)


# ---------------------------------------------------------------------------------- checkpoints


class Checkpoints:
    """Orbax CheckpointManager over ``directory``: train state + JSON metadata per step.

    Saves are asynchronous and atomic (written to a temporary folder, then renamed); temporary
    folders left by a killed process are removed when the manager opens. Keeps the last ``keep``.
    With several processes every process calls every method; each writes the array shards it owns
    and process 0 the metadata and the rename. A save waits at most ``barrier_timeout`` seconds for
    all processes to finish writing. ``best`` (a key of ``BEST``): also keep the checkpoint whose
    ``metrics`` (given to ``save``) are best by it (orbax ``BestN`` beside ``LatestN``).
    """

    # metric -> whether larger is better
    BEST = {"test_accuracy": True, "test_top5_accuracy": True, "test_loss": False}
    BEST |= {"test_ema_accuracy": True, "test_ema_top5_accuracy": True, "test_ema_loss": False}

    def __init__(
        self, directory: str | os.PathLike, keep: int = 3, barrier_timeout: int = 1200, best: str | None = None
    ):
        from orbax.checkpoint import checkpoint_managers as policies

        keeping = [policies.LatestN(n=keep)]
        if best is not None:
            larger = self.BEST[best]
            keeping.append(
                policies.BestN(
                    get_metric_fn=lambda m: m[best], reverse=not larger, n=1, keep_checkpoints_without_metrics=False
                )
            )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policies.AnyPreservationPolicy(keeping),
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(timeout_secs=barrier_timeout),
        )
        self.best, self._scores = best, {}
        self.manager = ocp.CheckpointManager(Path(directory).absolute(), options=options, item_names=("state", "meta"))
        self._writing = None  # the step whose save is in flight (orbax writes it from its own threads)
        self._failed = False  # a save failed and was raised (in one line); its threads report on
        self._incomplete = None  # the step of that save, whose temporary folder ``close`` removes
        self._quiet = _OrbaxReportsDropped(str(self.manager.directory))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, meta: dict, metrics: dict | None = None) -> None:
        """Save ``state`` (any pytree; PRNG keys stored as key data) and JSON ``meta`` at ``step``, with
        the evaluation ``metrics`` of that step for ``best``."""
        meta = {**meta, "key_impl": key_impl_name(state) or key_impl_name()}
        self.wait()  # the save before this one (orbax waits for it too): its failure is raised as its own
        self._check_space(step, state)
        if metrics is not None and self.best is not None:
            self._scores[step] = metrics[self.best]
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(keys_to_data(state)), meta=ocp.args.JsonSave(meta)),
            metrics=metrics,
            force=True,
        )
        self._writing = step

    def _check_space(self, step: int, state) -> None:
        """Refuse, before orbax starts writing, a checkpoint that the run folder's file system cannot hold:
        the bytes this process writes (each array shard it holds with replica id 0, as orbax writes them)
        against the space free (``io.check_free_space``), so that a full disk is named before orbax's threads
        start (a disk that fills during the write fails there, and ``wait`` names that).

        Raises:
            OSError: ENOSPC, naming the folder, the step, what is needed and free, and where --resume
                continues.
        """
        need = sum(
            shard.data.nbytes
            for leaf in jax.tree.leaves(state)
            if isinstance(leaf, jax.Array)
            for shard in leaf.addressable_shards
            if shard.replica_id == 0
        )
        try:
            io.check_free_space(self.manager.directory, need)
        except OSError as e:  # (``save`` waited for the checkpoint before this one)
            full = OSError(
                f"{self.manager.directory}: no space for the checkpoint of step {step} ({e.strerror}); "
                f"{_then_resume(os.strerror(errno.ENOSPC), saved_steps(self.manager.directory))}"
            )
            full.errno = e.errno
            raise full from None

    def best_step(self) -> int | None:
        """The step of the kept checkpoint whose ``best`` metric is best, or None (none has metrics):
        of the metrics saved by this process, else those orbax stored with the checkpoint."""
        kept = self.manager.all_steps()
        scored = [(self._scores[k], k) for k in kept if k in self._scores]
        scored += [(m[self.best], k) for k in kept if k not in self._scores and (m := self.manager.metrics(k))]
        if not scored:
            return None
        return (max if self.BEST[self.best] else min)(scored)[1]

    def restore(self, abstract_state, step: int | None = None):
        """(state shaped like ``abstract_state``, with its shardings; meta dict) at ``step`` or the latest.

        Raises:
            FileNotFoundError: no checkpoint in the directory.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.manager.directory}: no checkpoint to resume from")
        target = keys_to_data(abstract_state)
        out = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
        )
        meta = dict(out["meta"])
        return data_to_keys(out["state"], abstract_state, meta["key_impl"]), meta

    def restore_complete(self, abstract_state, steps: list[int]):
        """(step, state, meta) of the latest of ``steps`` that restores; a checkpoint that does not (truncated or
        damaged files, e.g. a disk that filled) is reported on stderr and the one before it is tried.

        Raises:
            ValueError: none restores (naming the folder and the latest one's error).
        """
        import sys

        first = None
        for step in reversed(steps):
            try:
                return (step, *self.restore(abstract_state, step=step))
            except Exception as e:  # orbax and its JSON/tensorstore readers raise many types
                first = first or e
                line = f"{e}".splitlines()[0] if str(e) else type(e).__name__
                print(
                    f"vit train: warning: {self.manager.directory}/{step}: does not restore ({line}); "
                    "trying the checkpoint before it",
                    file=sys.stderr,
                )
        raise ValueError(f"{self.manager.directory}: no checkpoint restores (the latest: {first})") from first

    def wait(self) -> None:
        """Wait for the save in flight, if any.

        Raises:
            OSError: it failed (a disk that filled after ``_check_space``, a quota, an I/O error): one
                line naming the folder, the step, the cause (the OS error tensorstore reports) and where
                --resume continues (``close`` removes the incomplete folder). Raised once: later waits on
                the same failure return.
        """
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # orbax re-raises its threads' errors (tensorstore's ValueError, OSError, ...)
            step, self._writing = self._writing, None
            if self._failed:
                return
            self._failed = True
            if step is None:
                raise
            raise self._write_failed(step, e) from None
        self._writing = None

    def settle(self) -> list[int]:
        """Wait for the save in flight, keeping quiet about its failure (another error is being raised),
        and return the steps of the complete checkpoints."""
        try:
            self.wait()
        except OSError:
            pass
        return saved_steps(self.manager.directory)

    def _write_failed(self, step: int, e: Exception) -> OSError:
        self._incomplete = step
        reason = write_error_reason(e)
        full = OSError(
            f"{self.manager.directory}: the checkpoint of step {step} could not be written ({reason}); "
            f"{_then_resume(reason, saved_steps(self.manager.directory))}"
        )
        full.errno = getattr(e, "errno", None)
        return full

    def close(self) -> None:
        """Close the manager; after a failed save also remove its incomplete folder (one process; with
        several, orbax removes it when --resume opens the folder), now that orbax's threads are done."""
        try:
            self.manager.close()
        finally:
            if self._incomplete is not None and jax.process_count() == 1:
                for tmp in self.manager.directory.glob(f"{self._incomplete}.orbax-checkpoint-tmp*"):
                    shutil.rmtree(tmp, ignore_errors=True)
            if not self._failed:  # after a failure orbax's threads may report on: stay quiet to the end
                self._quiet.remove()


class _OrbaxReportsDropped(logging.Filter):
    """While installed, log records of ERROR and above that mention ``folder`` (orbax's background threads
    report a failed write of its checkpoints through absl, asyncio and concurrent.futures, with tracebacks,
    while ``Checkpoints`` raises the same failure in one line) are dropped, and so are the
    ``RuntimeError('Event loop is closed')`` that tensorstore's done-callbacks report after orbax closed its
    loop (``formats.closed_loop_dropped``); other records and unraisable errors pass."""

    LOGGERS = ("absl", "asyncio", "concurrent.futures")

    def __init__(self, folder: str):
        super().__init__()
        from vit_jax.formats import closed_loop_dropped

        self.folder = folder
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)
        self._hook, sys.unraisablehook = sys.unraisablehook, closed_loop_dropped(sys.unraisablehook)
        self._ours = sys.unraisablehook

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        text = record.getMessage() + (repr(record.exc_info[1]) if record.exc_info and record.exc_info[1] else "")
        return self.folder not in text

    def remove(self) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)
        if sys.unraisablehook is self._ours:
            sys.unraisablehook = self._hook


def write_error_reason(e: BaseException) -> str:
    """The cause of a failed write as the OS names it (``os.strerror``): an OSError's, or the
    ``os_error_code`` in tensorstore's message (orbax raises tensorstore's errors as ValueError); else the
    error's first line (at most 300 characters)."""
    if isinstance(e, OSError) and e.errno:
        return e.strerror or os.strerror(e.errno)
    text = str(e)
    if m := re.search(r"os_error_code='?(\d+)", text):
        return os.strerror(int(m.group(1)))
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


@contextlib.contextmanager
def _written(path: Path, step: int, ckpts: Checkpoints):
    """A run file (metrics.jsonl, TensorBoard's event file) that cannot be written at ``step`` (a full disk)
    raised as one line naming it, the cause and where --resume continues, once the checkpoint in flight
    has settled."""
    try:
        yield
    except OSError as e:
        reason = write_error_reason(e)
        failed = OSError(
            f"{path}: could not be written at step {step} ({reason}); {_then_resume(reason, ckpts.settle())}"
        )
        failed.errno = e.errno
        raise failed from None


def _then_resume(reason: str, steps: list[int]) -> str:
    """What the user does after a failed write: free space (a full disk or quota), then --resume."""
    fix = "free some space" if reason in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT)) else "fix that"
    where = f"from the checkpoint of step {steps[-1]}" if steps else "from step 0"
    return f"{fix}, then the same command with --resume continues {where}"


def saved_steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints in ``directory`` (orbax names them by step; a checkpoint still
    being written sits in a temporary folder with another name)."""
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


def sharded_abstract(trainer: Trainer):
    """``trainer.abstract_state`` with each leaf's target sharding attached (for restores)."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        trainer.abstract_state,
        trainer.state_shardings,
    )


def _json_defaults(cls) -> dict:
    """{field: its default as config.json stores it} of a config dataclass (tuples as lists)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = list(f.default) if isinstance(f.default, tuple) else f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def config_mismatch(saved: dict, current: dict) -> list[str]:
    """Fields (section.field) whose values differ between two config.json dicts, except those a resumed
    run may change: ``TrainConfig.settings()`` and ``epochs`` (see ``schedule_change``). A field the
    saved config lacks (the run was started by a version without it) counts as its default then."""
    out = []
    defaults = {"model": _json_defaults(ViTConfig), "train": _json_defaults(TrainConfig)}
    for section in ("model", "train", "preprocess"):
        a, b = saved.get(section, {}), current.get(section, {})
        a = {**{k: v for k, v in defaults.get(section, {}).items() if k in b}, **a}
        free = [*TrainConfig.settings(), "epochs"] if section == "train" else []
        out += [
            f"{section}.{k}: checkpoint has {a.get(k)!r}, now {b.get(k)!r}"
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and k not in free
        ]
    return out


def check_same_data(out: Path, saved: dict, fingerprint: dict, lead: bool) -> None:
    """Refuse to resume on data other than the run's (``vit_common.data.fingerprint.fingerprint_changes``
    against config.json's ``dataset``); files whose modification times alone changed are one warning
    line (process 0), as is a run folder written before fingerprints were stored.

    Raises:
        ValueError: the data changed; one line listing what changed.
    """
    if "dataset" not in saved:
        if lead:
            print(
                f"vit train: warning: {out}/config.json holds no dataset fingerprint; the data is not checked",
                file=sys.stderr,
            )
        return
    errors, warnings = fingerprint_changes(saved["dataset"], fingerprint)
    if errors:
        raise ValueError(
            f"{out}: the dataset changed since the run started ({'; '.join(errors)}); resume on the run's data, "
            "or start a new run with another --out"
        )
    for w in warnings if lead else []:
        print(f"vit train: warning: dataset: {w}; resuming as the same data", file=sys.stderr)


def schedule_change(trainer: Trainer, saved_epochs: int, step: int) -> str | None:
    """What resuming at ``step`` a run saved with ``saved_epochs`` changes when ``trainer`` has another
    epoch count: the learning-rate schedule (warmup + cosine decay) is recomputed for the new total, so
    from ``step`` on the rate follows the new curve (as timm's and transformers' Trainer do on a resume
    with more epochs). None when the epoch count is the same.

    Raises:
        ValueError: the new total ends before ``step``, where the checkpoint already is.
    """
    tcfg, total = trainer.tcfg, trainer.total_steps
    if saved_epochs == tcfg.epochs:
        return None
    if total < step:
        raise ValueError(
            f"--epochs {tcfg.epochs} ({total} steps) ends before the checkpoint's step {step}; expected "
            f"--epochs >= {-(-step // trainer.steps_per_epoch)}"
        )
    old = lr_schedule(tcfg, trainer.steps_per_epoch * saved_epochs)
    was, now = float(old(step)), float(trainer.schedule(step))
    return (
        f"--epochs {tcfg.epochs} (the run was started with {saved_epochs}): the learning-rate schedule is "
        f"recomputed for {total} steps, so from step {step} on it follows the new one (lr {now:.3g} at step "
        f"{step + 1}, where the old schedule had {was:.3g})"
    )


# -------------------------------------------------------------------------------------- the run


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    io.write_json(path, obj)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines written after ``step`` (by a run that was killed later than its checkpoint), and a
    last line a kill cut short (not JSON).

    Raises:
        ValueError: a line before the last is not JSON or has no integer 'step' (naming file:line).
    """
    if not path.exists():
        return
    lines = [(i, ln) for i, ln in enumerate(regular_file(path).read_text().splitlines(), 1) if ln.strip()]
    kept = []
    for n, (i, ln) in enumerate(lines):
        try:
            row = io.parse_json(ln, f"{path}:{i}")
        except ValueError:
            if n == len(lines) - 1:  # the line a kill cut short: dropped
                break
            raise
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path}:{i}: a metrics line without an integer 'step'")
        if row["step"] <= step:
            kept.append(ln)
    io.write_text(path, "".join(ln + "\n" for ln in kept))


def run_config(trainer: Trainer) -> dict:
    """What config.json holds: the model, train and preprocessing configs, the class names, the devices."""
    return {
        "model": trainer.cfg.to_dict(),
        "train": trainer.tcfg.to_dict(),
        "preprocess": trainer.preprocess.to_dict(),
        "classes": list(trainer.data.classes),
        "dataset": trainer.data.fingerprint,
        "devices": f"{trainer.mesh.size} x {jax.devices()[0].platform}",
        "processes": jax.process_count(),
    }


# What a run writes into its folder by those names (the exports' other names depend on --init's format).
RUN_FILES = ("config.json", "metrics.jsonl", "model.safetensors", "model_timm.safetensors", "parity.json", "curves.png")


def fit(
    trainer: Trainer,
    out: str | os.PathLike,
    options: RunOptions | None = None,
    *,
    started: float | None = None,
    compile_cache: bool = False,
    stop: StopSignals | None = None,
    tensorboard: str | os.PathLike | None = None,
    peak_flops: float | None = None,
    profile_steps: tuple[int, int] | None = None,
    init: Mapping[str, Any] | None = None,
) -> tuple[dict, dict]:
    """Train to the last step, writing into ``out``: config.json, metrics.jsonl, checkpoints/.

    ``options`` (``vit_common.data.train_config.RunOptions``, default ``RunOptions()``): a checkpoint
    (state; the data position is the step, one batch per step) is saved every ``ckpt_every`` steps (0 =
    only at the end), after the first step that ends ``ckpt_every_minutes`` minutes or more after the
    previous save (0 = off; levanter's time-based saves; with several processes process 0's clock decides
    for all), and at the last step, the last ``keep`` kept; ``resume`` continues from the latest one, so
    an interrupted run ends with the same state as an uninterrupted one. Each checkpoint also holds the
    sums behind the next metrics line, so a resumed run writes the same lines as an uninterrupted one.
    ``stop`` (``vit_jax.preemption.StopSignals``): after every step the run asks it whether to stop; if so
    it saves that step, waits for the write and raises ``Stopped``. A data worker that dies is
    ``DataWorkerError``, raised after saving the step reached (one process; with several, the others are
    stopped through ``vit_jax.distributed``). The test set is evaluated (loss, top-1 and top-5 accuracy)
    every ``eval_every`` epochs, or every ``eval_every_steps`` steps when that is set, and at the end;
    ``progress`` shows a tqdm bar on process 0. metrics.jsonl gets one line when the process's first
    step is done (``time_to_first_step_s``: seconds since ``started``, a ``time.perf_counter`` value,
    default the call of ``fit``; ``compile_cache``: 'off' unless ``compile_cache`` says JAX's
    persistent compilation cache is on, then 'warm' if the training step's program came from it, else
    'cold'), one per ``log_every`` steps (loss, accuracy, lr, grad_norm, images_per_s averaged since the
    previous line) and one per evaluation. ``tensorboard``: a folder for TensorBoard event files of the
    same values and the step time, images/s per device and MFU against ``peak_flops`` per device
    (``vit_jax.observe.Summaries``). ``profile_steps`` (A, B): a ``jax.profiler`` trace of steps A..B
    (1-based) into ``out``/profile. Each step runs inside a ``jax.profiler.StepTraceAnnotation``.
    ``init``: what the run fine-tunes (``vit_jax.finetune.init_record``), stored as config.json's ``init``
    so that a resume takes it from there and does not read that checkpoint again. With ``tcfg.ema`` every
    evaluation also evaluates the moving average (``evaluation``: test_ema_* beside test_*, in
    metrics.jsonl, TensorBoard and the summary) and config.json's ``exports`` says which weights the
    exports hold (``weights``: "ema" with ``options.export_ema``, else "raw"; ``Trainer.weights(state,
    ema=...)`` gives them). ``options.wandb``: the TensorBoard scalars and config.json also go to Weights
    & Biases (``vit_jax.observe.Summaries``; its files under ``out``/wandb).
    With several processes every process calls ``fit`` alike, and process 0 alone writes config.json,
    metrics.jsonl, the event files and the trace.

    Returns:
        (final state, summary dict: steps (the last), start (the step it resumed at, 0 for a fresh run),
        test_loss, test_accuracy, test_count (with an EMA also test_ema_loss, test_ema_accuracy,
        test_ema_top5_accuracy), images_per_s, train_seconds, and with ``keep_best`` (a key of
        ``Checkpoints.BEST``: the checkpoint of the best evaluation by it is kept beside the last
        ``keep``; every evaluation step is checkpointed) best_checkpoint {step, metric}).

    Raises:
        ValueError: ``profile_steps`` outside the run's steps; ``export_ema`` or a ``keep_best`` of the EMA
            without ``tcfg.ema``; ``wandb`` asked for and not installed (naming the extra); ``out`` holds a
            checkpoint and ``resume`` is off, or ``resume`` with a config that differs from the saved one
            (every differing field listed; ``epochs`` may differ, which recomputes the schedule:
            ``schedule_change``), or with an epoch count that ends before the checkpoint; a metrics line
            before the last that is not JSON or has no step (a last line a kill cut is dropped).
        FileNotFoundError: ``resume`` without a run in ``out``. A run stopped before its first complete
            checkpoint starts again from step 0, with or without ``resume`` and with any config; a
            latest checkpoint that does not restore is reported and the one before it used.
        NonFiniteError: NaN or Inf in the loss or gradients; the last good checkpoint stays intact.
        Stopped: ``stop`` asked for it (a signal); its ``step`` is the checkpoint saved.
        DataWorkerError: an input-pipeline worker process died.
        DestinationError: a fresh run's ``out`` holds a file of ``RUN_FILES`` that vit did not write
            (checked first; a resumed run's config.json proves its files are the run's).
    """
    options = options or RunOptions()
    started = time.perf_counter() if started is None else started
    out = Path(out)
    lead = jax.process_index() == 0
    if profile_steps and profile_steps[1] > trainer.total_steps:
        a, b = profile_steps
        raise ValueError(f"--profile-steps {a}:{b}: the run has steps 1 to {trainer.total_steps}")
    for asked, flag in (
        (options.export_ema, "--export-ema"),
        ((options.keep_best or "").startswith("test_ema_"), f"--keep-best {options.keep_best}"),
    ):
        if asked and trainer.tcfg.ema is None:
            raise ValueError(f"{flag}: this run keeps no moving average of the weights; pass --ema DECAY too")
    if options.wandb:
        require_wandb()
    config, metrics_path = run_config(trainer) | ({"init": dict(init)} if init else {}), out / "metrics.jsonl"
    if trainer.tcfg.ema is not None:
        config["exports"] = {"weights": "ema" if options.export_ema else "raw"}
    saved = saved_steps(out / "checkpoints")
    resume = options.resume
    if resume:
        if not (out / "config.json").exists():
            raise FileNotFoundError(f"{out}: no run to resume (config.json is missing)")
        saved_config = io.read_json(out / "config.json")  # bounded, named
        saved_config.pop(io.OWNER_KEY, None)  # the mark write_json adds (vit_common.system.io)
        diff = config_mismatch(saved_config, config)
        if diff and saved:  # with no checkpoint there is nothing to continue: the new config starts afresh
            raise ValueError(
                f"{out}: the checkpoint was made with a different config (keep it, or choose another --out):\n  "
                + "\n  ".join(diff)
            )
        if saved:  # (without a checkpoint nothing continues: any data starts afresh)
            check_same_data(out, saved_config, config["dataset"], lead)
        saved_epochs = saved_config.get("train", {}).get("epochs", trainer.tcfg.epochs)
        schedule_change(trainer, saved_epochs, saved[-1] if saved else 0)
    elif saved:
        raise ValueError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
    # a run stopped before its first checkpoint: its config.json (ours by its content) shows the folder is
    # a run's, so the same command replaces that run's files (metrics.jsonl proves nothing by itself)
    restart = not resume and io.owned(out / "config.json")
    if lead and not resume and not restart:
        for name in RUN_FILES:  # refused before any work, not at the end: files vit did not write stay
            io.check_destination(out / name)
    if jax.process_count() > 1:  # every process has read the folder before process 0 writes to it
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("vit_train:folder_checked")
    made = not (out / "checkpoints").exists()  # by this call: removed again if the run fails while it is empty
    # removes temporary folders a killed run left
    ckpts = Checkpoints(out / "checkpoints", options.keep, trainer.tcfg.barrier_timeout, best=options.keep_best)
    start, state, meta = ckpts.restore_complete(sharded_abstract(trainer), saved) if saved and resume else (0, None, {})
    # The first batches are made while the step compiles (the batch position is the step: a resumed run
    # starts at the checkpoint it restored).
    it = trainer.train_iterator(start=start)
    files, failed = contextlib.ExitStack(), False
    if resume or restart:  # its config.json shows the folder is this run's (copied, perhaps): its files are
        files.enter_context(io.overwriting())  # ours to replace, its metrics.jsonl to append to, marked or not
    try:
        it.start_prefetch()
        sums = meta.get("metrics")  # the partial sums behind the next metrics line
        if state is None:  # a fresh run, or a resumed one that was stopped before its first complete checkpoint
            state = trainer.init_state()
        before = _cache_events()
        trainer.compile()  # while the first batches are made
        hits, misses = (_cache_events()[k] - before[k] for k in ("cache_hits", "cache_misses"))
        if lead:
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / "config.json", config)
            _truncate_metrics(metrics_path, it.position)
        summaries = None
        if (tensorboard is not None or options.wandb) and lead:
            with _written(Path(tensorboard or out), it.position, ckpts):
                wandb_dir = out if options.wandb else None
                summaries = Summaries(
                    tensorboard, trainer.cfg, trainer.mesh.size, peak_flops, wandb_dir=wandb_dir, config=config
                )
        return _loop(
            trainer,
            state,
            it,
            ckpts,
            metrics_path,
            options,
            lead=lead,
            started=started,
            compile_cache="off" if not compile_cache else "warm" if hits and not misses else "cold",
            stop=stop,
            sums=sums,
            summaries=summaries,
            profile=ProfileWindow(out / "profile", *profile_steps) if profile_steps and lead else None,
        )
    except BaseException:
        failed = True
        raise
    finally:
        it.close()
        trainer.close()
        try:
            ckpts.wait()
        except BaseException:
            failed = True
            raise
        finally:
            ckpts.close()
            files.close()
            if made and lead and failed:
                with contextlib.suppress(OSError):  # only an empty folder: rmdir refuses any other
                    (out / "checkpoints").rmdir()


def evaluation(t: Trainer, state: dict) -> dict:
    """The test set's metrics as metrics.jsonl holds them: test_loss, test_accuracy, test_top5_accuracy,
    test_count, and with an EMA (``tcfg.ema``) test_ema_loss, test_ema_accuracy, test_ema_top5_accuracy of
    the moving average of the weights."""
    out = {}
    for prefix, ema in (("test_", False), ("test_ema_", True)) if "ema" in state else (("test_", False),):
        m = t.evaluate(state, t.data.test, ema=ema)
        out |= {f"{prefix}{k}": m[k] for k in ("loss", "accuracy", "top5_accuracy")}
        out.setdefault("test_count", m["count"])
    return out


def _loop(
    t: Trainer,
    state,
    it,
    ckpts,
    metrics_path,
    options: RunOptions,
    *,
    lead: bool,
    started: float,
    compile_cache: str,
    stop,
    sums,
    summaries,
    profile,
) -> tuple[dict, dict]:
    from tqdm import tqdm

    clock = time.perf_counter
    ckpt_every, log_every, eval_every = options.ckpt_every, options.log_every, options.eval_every
    ckpt_seconds, eval_every_steps = 60.0 * options.ckpt_every_minutes, options.eval_every_steps
    tcfg, spe, total, start = t.tcfg, t.steps_per_epoch, t.total_steps, it.position  # one batch per step
    n_train = len(t.data.train)
    pbar = (
        tqdm(
            total=tcfg.epochs * n_train,
            initial=examples_before(start, n_train, tcfg.batch_size),
            unit="img",
            unit_scale=True,
            dynamic_ncols=True,
            desc="train",
        )
        if options.progress and lead
        else None
    )
    log = in_place.open_log(metrics_path) if lead else None

    def write(line: dict) -> None:
        if log:
            with _written(metrics_path, line["step"], ckpts):
                log.write(json.dumps(line) + "\n")
                log.flush()

    acc = {"loss": 0.0, "correct": 0.0, "count": 0.0, "grad_norm": 0.0, "steps": 0, "seconds": 0.0}
    acc |= sums or {}  # the sums since the last metrics line, as the checkpoint resumed from held them
    seen = timed = 0.0
    test = {}
    t_start = last_save = clock()
    many = jax.process_count() > 1

    def save(s: int, metrics: dict | None = None) -> None:
        nonlocal last_save
        if ckpts.latest_step() != s:  # a data worker's death right after a step that was saved
            ckpts.save(s, state, {"step": s, "metrics": dict(acc)}, metrics)
        last_save = clock()

    def time_due() -> bool:
        due = bool(ckpt_seconds) and clock() - last_save >= ckpt_seconds
        if ckpt_seconds and many:  # every process saves at the step process 0's clock says
            from jax.experimental import multihost_utils

            due = bool(multihost_utils.broadcast_one_to_all(np.bool_(due)))
        return due

    if stop is not None:
        stop.training()
    try:
        for step in range(start, total):
            if profile:
                profile.before(step + 1)
            t0 = clock()
            with jax.profiler.StepTraceAnnotation("train", step_num=step + 1):
                try:
                    batch = next(it)
                except DataWorkerError:
                    if not many and step > start:  # the state of the step reached is whole: keep it
                        save(step)
                    raise
                state, m = t.train_step(state, batch)
                m = jax.device_get(m)
            if step == start:
                write({"step": step + 1, "time_to_first_step_s": clock() - started, "compile_cache": compile_cache})
            if not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])):
                ckpts.wait()
                last = ckpts.latest_step()
                kept = (
                    f"the last good checkpoint is step {last} in {ckpts.manager.directory}"
                    if last is not None
                    else "no checkpoint was written yet"
                )
                raise NonFiniteError(
                    f"loss {float(m['loss'])}, gradient norm {float(m['grad_norm'])} at step "
                    f"{step + 1}: not finite, training stopped; {kept}. Try a lower --lr."
                )
            dt = clock() - t0
            if step > start:  # the first step of a process includes compilation
                seen, timed = seen + float(m["count"]), timed + dt
            for k in ("loss", "grad_norm"):
                acc[k] += float(m[k])
            acc["correct"] += float(m["correct"])
            acc["count"] += float(m["count"])
            acc["steps"] += 1
            acc["seconds"] += dt
            s = step + 1
            if pbar:
                pbar.update(int(m["count"]))
                pbar.set_postfix(
                    epoch=f"{s / spe:.2f}",
                    loss=f"{float(m['loss']):.3f}",
                    lr=f"{float(m['lr']):.1e}",
                    **({"test_acc": f"{test['test_accuracy']:.4f}"} if test else {}),
                    refresh=False,
                )
            if profile:
                profile.after(s, state)
            if s % log_every == 0 or s == total:
                line = {
                    "step": s,
                    "epoch": s / spe,
                    "loss": acc["loss"] / acc["steps"],
                    "accuracy": acc["correct"] / max(acc["count"], 1),
                    "lr": float(m["lr"]),
                    "grad_norm": acc["grad_norm"] / acc["steps"],
                    "images_per_s": acc["count"] / max(acc["seconds"], 1e-9),
                    "time": clock() - t_start,
                }
                write(line)
                if summaries:
                    with _written(summaries.logdir or metrics_path.parent, s, ckpts):
                        summaries.train(line, acc["seconds"] / acc["steps"])
                acc = dict.fromkeys(acc, 0.0)
            due = s % eval_every_steps == 0 if eval_every_steps else s % spe == 0 and (s // spe) % eval_every == 0
            evaluated = s == total or due
            if evaluated:
                test = evaluation(t, state)
                line = {"step": s, "epoch": s / spe, **test}
                write(line)
                if summaries:
                    with _written(summaries.logdir or metrics_path.parent, s, ckpts):
                        summaries.test(line)
            stopping = stop is not None and stop.reached(s)  # every process, every step
            best = evaluated and ckpts.best is not None  # every evaluation is a candidate for the best
            if s == total or (ckpt_every and s % ckpt_every == 0) or time_due() or stopping or best:
                if stopping and s < total:
                    stop.saving(s)
                save(s, {k: v for k, v in line.items() if k.startswith("test_")} if evaluated else None)
            if stopping and s < total:
                ckpts.wait()
                raise Stopped(stop.received or "a signal", s)
    finally:
        if pbar:
            pbar.close()
        if log:
            log.close()
        if summaries:
            summaries.close()
        if profile:
            profile.stop()
    if not test:  # resumed after the last step: nothing ran
        test = evaluation(t, state)
    summary = {
        "steps": total,
        "start": start,
        **{k: v for k, v in test.items() if k != "test_top5_accuracy"},
        "images_per_s": seen / timed if timed else None,
        "train_seconds": clock() - t_start,
    }
    if ckpts.best is not None:
        ckpts.wait()
        summary["best_checkpoint"] = {"step": ckpts.best_step(), "metric": ckpts.best}
    return state, summary
