"""The JAX twin's training step: ``Trainer`` compiles the train and eval steps for one (model config,
train config, dataset, device mesh) and builds the first train state.

The train state is one pytree ``{"step", "params", "rest", "opt_state"}``: ``params`` the model's
``nnx.Param`` state, ``rest`` everything else the model holds (dropout / drop-path RNG streams); with
``tcfg.ema`` also ``"ema"``, the exponential moving average of ``params`` (timm's ``ModelEmaV3``, updated
inside the step after the optimizer's update: ``vit_jax.optim.ema_update``), so it is checkpointed with
the rest. Both steps are ``jax.jit`` functions of (state, batch) on split NNX state (``train_step_fn``,
``eval_step_fn``), compiled once: every batch has the same shape because the last batch of an epoch is
padded and masked (``vit_jax.data``). ``Trainer.compile`` compiles the train step ahead of time;
``enable_compile_cache`` turns on JAX's persistent compilation cache, whose hits ``_cache_events`` counts.

Devices: a 2-D ``jax.sharding.Mesh`` ("replica", "fsdp") of ``tcfg.mesh_spec()`` over all devices
(``vit_jax.mesh.make_mesh``). Batches are split over both axes; parameters, optimizer state and EMA are
copied over "replica" and split over "fsdp" by ``tcfg.shard_rules`` (``vit_jax.mesh.state_shardings``;
ZeRO-3 style, XLA inserts the gathers and the gradient sums).

Loss (``loss_and_grads``): softmax cross-entropy against label-smoothed (and mixup/cutmix-mixed) targets,
averaged over the real (mask 1) examples of the batch; gradient accumulation scans over micro-batches
and divides by the batch's real count, so it equals one big batch. The optimizer is ``vit_jax.optim``'s;
``vit_jax.checkpointing`` saves and restores the state, ``vit_jax.loop`` runs the steps.
``vit_torch.train.Trainer`` is the same step in PyTorch.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vit_common.config import ViTConfig
from vit_common.data.batches import batches_per_epoch
from vit_common.data.datasets import Dataset
from vit_common.data.images import Preprocess
from vit_common.naflex import check_model
from vit_common.training.train_config import TrainConfig
from vit_jax.data import eval_batches, iterate, train_batches, transform_for
from vit_jax.keys import data_to_keys, key_impl_name, keys_to_data
from vit_jax.lora import add_lora, lora_scale, merge_lora
from vit_jax.mesh import batch_sharding, by_name, make_mesh, state_shardings
from vit_jax.model import VisionTransformer
from vit_jax.optim import ema_update, make_optimizer, trainable_mask
from vit_jax.optimizer_state import with_adam_state
from vit_jax.preemption import agreed_batches
from vit_jax.weights import from_numpy, to_numpy

# --------------------------------------------------------------------------------- the model


def build_model(cfg: ViTConfig, seed: int, remat: bool = False) -> VisionTransformer:
    """A freshly initialised VisionTransformer (training mode); ``remat``: each block recomputed in the
    backward pass (``VisionTransformer.set_grad_checkpointing``)."""
    model = VisionTransformer(cfg, rngs=nnx.Rngs(seed))
    model.set_grad_checkpointing(remat)
    return model


def with_adapters(model: VisionTransformer, tcfg: TrainConfig) -> VisionTransformer:
    """``model`` with ``tcfg.lora``'s adapters (``vit_jax.lora.add_lora``, drawn from ``tcfg.seed``), or
    unchanged without ``tcfg.lora``."""
    if tcfg.lora is not None:
        add_lora(model, tcfg, nnx.Rngs(tcfg.seed))
    return model


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
    pipeline's worker processes. A NaFlex ``preprocess`` (``max_patches``) trains and evaluates on NaFlex
    batches (``vit_common.data.naflex_batches``: each image at its own aspect ratio, padded to
    max_patches patches), their patch mask and position weights passed to the model.

    ``mesh``: default ``tcfg.mesh_spec()``'s over all devices (``vit_jax.mesh.make_mesh``).

    Raises:
        ValueError: batch size not divisible by device count x accum_steps, or a config that does not
            fit the dataset (image size, channels, classes) or ``weights``, or an EMA of low-precision
            parameters (``TrainConfig.check_ema_dtype``), a mesh spec whose sizes do not multiply to the
            device count, sharding rules ``vit_common.training.sharding.partition`` refuses for the model;
            NaFlex with a model ``vit_common.naflex.check_model`` refuses, or with mixup or cutmix.
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
        if self.preprocess.max_patches is not None:
            micro = tcfg.batch_size // tcfg.accum_steps
            check_model(cfg, self.preprocess.max_patches, micro, f"max_patches={self.preprocess.max_patches}")
        self.train_transform = transform_for(data, self.preprocess, tcfg.augment, cfg)
        self.eval_transform = transform_for(data, self.preprocess, cfg=cfg)
        self._test_batches = None
        self._compiled, self.cache_events = None, {"cache_hits": 0, "cache_misses": 0}
        self.mesh = mesh or make_mesh(tcfg.mesh_spec())
        n = self.mesh.size
        micro = tcfg.batch_size // tcfg.accum_steps
        if micro % n:
            raise ValueError(
                f"batch_size={tcfg.batch_size} / accum_steps={tcfg.accum_steps} = {micro} examples per "
                f"micro-batch is not divisible by the {n} devices"
            )
        self.steps_per_epoch = batches_per_epoch(len(data.train), tcfg.batch_size)
        self.total_steps = self.steps_per_epoch * tcfg.epochs
        model = nnx.eval_shape(lambda: with_adapters(build_model(cfg, tcfg.seed, tcfg.remat), tcfg))
        self.tx, self.schedule = make_optimizer(
            tcfg,
            self.total_steps,
            cfg.depth,
            no_weight_decay=model.no_weight_decay(),
            steps_per_epoch=self.steps_per_epoch,
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
        self.state_shardings = state_shardings(self.mesh, tcfg.shard_rules, self.abstract_state, self.tx)
        self.batch_sharding = batch_sharding(self.mesh)
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

        Placed as it is built, so that the host holds no second copy of the parameters: ``weights`` are
        read parameter by parameter onto their shardings, each device's block alone (``from_numpy``'s
        ``sharding``; lazily read weights, ``load_checkpoint(lazy=True)``'s, are then read one tensor at a
        time), and the optimizer state is created on the devices by a jitted ``tx.init`` whose outputs
        carry their shardings. A fresh model is initialised on the host side of JAX, then placed: every
        process computes the same values, the random-initialiser kernels compile once per process and
        shape (XLA's threefry kernels are slow to compile), and the values do not depend on the device
        count. With ``tcfg.ema`` the moving average starts as a copy of the weights (timm's ``ModelEmaV3``
        deep-copies the model).
        """
        shardings = self.state_shardings
        if self.init_weights is None:  # the state only: remat (a part of the graphdef) changes none of it
            model = build_model(self.cfg, self.tcfg.seed)
        else:
            where = by_name(shardings["params"])
            model = from_numpy(self.cfg, self.init_weights, seed=self.tcfg.seed, sharding=lambda p, _: where[p])
            model.train()
        _, params, rest = nnx.split(with_adapters(model, self.tcfg), nnx.Param, ...)
        params = _placed(params, shardings["params"])
        opt_state = jax.jit(self.tx.init, out_shardings=shardings["opt_state"])(params)
        if self.init_moments is not None:
            opt_state = with_adam_state(opt_state, self.init_moments, schedule_count=0)
        state = {"step": jnp.zeros((), jnp.int32), "params": params, "rest": rest, "opt_state": opt_state}
        if self.tcfg.ema is not None:
            state["ema"] = jax.tree.map(jnp.copy, params)
        return data_to_keys(_placed(keys_to_data(state), shardings), state, key_impl_name())

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
        global jax arrays of B rows split over the mesh's devices (``vit_jax.mesh.batch_sharding``).

        Raises:
            ValueError: the batch does not have B / process count rows.
        """
        rows = self.tcfg.batch_size // jax.process_count()
        if any(len(v) != rows for v in jax.tree.leaves(batch)):
            shapes = jax.tree.map(np.shape, batch)
            raise ValueError(f"batch {shapes}: expected {rows} rows (this process's share of {self.tcfg.batch_size})")
        return jax.tree.map(lambda v: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v)), batch)

    def batch_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        """The global batch the steps take, its rows split over the mesh: image float32 [B, H, W, C], label int32
        [B], target float32 [B, K], mask float32 [B] (what ``vit_jax.data`` makes); NaFlex: image float32
        [B, N, P*P*C], patch_mask bool [B, N], spatial_shapes int32 [B, 2], position_weights float32 [B, N,
        Gh*Gw] besides (``vit_common.data.naflex_batches``)."""
        b, (h, w), c, k = self.tcfg.batch_size, self.cfg.image_size, self.cfg.in_chans, self.cfg.num_classes
        shapes = {"image": ((b, h, w, c), jnp.float32), "label": ((b,), jnp.int32)}
        n = self.preprocess.max_patches
        if n is not None:
            (ph, pw), (gh, gw) = self.cfg.patch_size, self.cfg.grid
            shapes |= {"image": ((b, n, ph * pw * c), jnp.float32), "patch_mask": ((b, n), jnp.bool_)}
            shapes |= {"spatial_shapes": ((b, 2), jnp.int32), "position_weights": ((b, n, gh * gw), jnp.float32)}
        shapes |= {"target": ((b, k), jnp.float32), "mask": ((b,), jnp.float32)}
        return {n: jax.ShapeDtypeStruct(s, d, sharding=self.batch_sharding) for n, (s, d) in shapes.items()}

    def compile(self) -> jax.stages.Compiled:
        """Trace and compile the training step now, from the state's and the batch's shapes alone (JAX's
        ahead-of-time ``lower(...).compile()``; ``train_step`` then finds the program compiled), so that
        compiling can overlap the input pipeline's start (``BatchIterator.start_prefetch``). Compiled once:
        a later call returns the same program. ``cache_events`` then holds the persistent compilation
        cache's {"cache_hits", "cache_misses"} of that compilation."""
        if self._compiled is None:
            before = _cache_events()
            self._compiled = self._train_jit.lower(sharded_abstract(self), self.batch_spec()).compile()
            self.cache_events = {k: n - before[k] for k, n in _cache_events().items()}
        return self._compiled

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

        Raises:
            DataReadError: an example of ``source`` cannot be read (one process), or with several processes
                ``vit_jax.preemption.DamageStop`` in every process, before the computation of the batch
                one of them could not read (each process reads its rows; ``agreed_batches``).
            vit_jax.data.DataWorkerError: a worker process of the test set's batches died (one process), or
                with several processes ``vit_jax.preemption.WorkerStop`` in every process, the same way.
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
        for batch in agreed_batches(it) if jax.process_count() > 1 else it:
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

    def weights(self, state: dict, *, ema: bool = False, merged: bool = True) -> dict[str, np.ndarray]:
        """The canonical state (timm names, numpy) of the model in ``state``, gathered from all devices;
        ``ema``: of the moving average of its weights (``tcfg.ema``). With ``lora`` the adapters merged
        into plain weights (``vit_jax.lora.merge_lora``), or with ``merged=False`` the base weights as
        they are and the adapters beside them (``{layer}.lora.lora_a`` (D_in, r), ``lora_b`` (r, D_out)).

        With several processes every process must call this (the gather is collective).
        """
        params = state["ema" if ema else "params"]
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            params = multihost_utils.process_allgather(params, tiled=True)
        weights = to_numpy(nnx.merge(self.eval_graphdef, params, state["rest"]))
        return merge_lora(weights, lora_scale(self.tcfg)) if self.tcfg.lora is not None and merged else weights


def naflex_arguments(batch: dict) -> dict:
    """The model's NaFlex arguments of a batch (``patch_mask``, ``position_weights``), or {} for images."""
    return {k: batch[k] for k in ("patch_mask", "position_weights") if k in batch}


def _forward(graphdef, params, rest, images, drop_masks=None, dropout_masks=None, naflex=None):
    """(logits [B, K] in at least float32 (float64 models keep float64), the model's non-parameter
    state after the call); ``drop_masks`` [B, depth, 2] and ``dropout_masks`` {module path: [B, ...]}
    the parity mode's drop-path and dropout masks, or None; ``naflex`` ``naflex_arguments``' dict.

    ``rest`` is rebuilt by an identity tree map so that its Variables (dropout RNG counters) belong
    to the current trace: NNX refuses to update a Variable created outside ``jax.value_and_grad``.
    """
    model = nnx.merge(graphdef, params, jax.tree.map(lambda v: v, rest))
    logits = model(images, drop_masks=drop_masks, dropout_masks=dropout_masks, **(naflex or {}))
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    return logits, nnx.state(model, nnx.Not(nnx.Param))


def loss_and_grads(t: Trainer, params, rest, batch: dict):
    """Summed-over-examples gradients of one batch, scanned over ``accum_steps`` micro-batches.

    Returns (grads summed over the real examples, rest after the forward passes, loss sum, correct
    count). Micro-batch i holds rows i, i+A, i+2A, ... so each keeps the batch's device split. With
    ``freeze`` or ``lora`` the frozen parameters enter through ``stop_gradient``: their gradients are zeros and no
    backward pass runs through the frozen layers. A batch with "drop_masks" float [B, depth, 2] or
    "dropout_masks" {module path: float [B, ...]} hands them to the model (the twins' parity mode,
    ``VisionTransformer.__call__``).
    """
    tcfg, a = t.tcfg, t.tcfg.accum_steps

    def loss_sum(p, rest, mb):
        if tcfg.freeze or tcfg.lora is not None:
            p = jax.tree.map(lambda train, x: x if train else jax.lax.stop_gradient(x), t.trainable, p)
        masks = (mb.get("drop_masks"), mb.get("dropout_masks"))
        logits, rest = _forward(t.train_graphdef, p, rest, mb["image"], *masks, naflex_arguments(mb))
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


def frozen_kept(t: Trainer, old, new):
    """``new`` with the frozen parameters (``freeze``, ``lora``) of ``old``, bit for bit: an update of
    zero still rounds (x + 0 turns -0.0 into 0.0, an average of equal values may move by an ulp)."""
    return jax.tree.map(lambda train, o, n: n if train else o, t.trainable, old, new)


def train_step_fn(t: Trainer):
    def train_step(state: dict, batch: dict) -> tuple[dict, dict]:
        params = state["params"]
        grads, rest, loss, correct = loss_and_grads(t, params, state["rest"], batch)
        count = jnp.maximum(batch["mask"].sum(), 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)
        updates, opt_state = t.tx.update(grads, state["opt_state"], params)
        new = {
            "step": state["step"] + 1,
            "params": frozen_kept(t, params, optax.apply_updates(params, updates)),
            "rest": rest,
            "opt_state": opt_state,
        }
        if "ema" in state:
            new["ema"] = frozen_kept(t, state["ema"], ema_update(t.tcfg, state["ema"], new["params"], new["step"]))
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
        logits, _ = _forward(t.eval_graphdef, params, rest, batch["image"], naflex=naflex_arguments(batch))
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
    """Turn on JAX's persistent compilation cache in ``directory`` for every program, however fast it
    compiled, so that a second run of the same configuration skips XLA compilation. Must run before the
    first compilation. Returns the directory. A missing directory is made by JAX at the first compilation
    (a run refused before it leaves none).

    Raises:
        OSError: ``directory`` cannot be made (a file in its place) or is not writable (a read-only
            disk, another user's folder); the message names it and nothing was turned on.
    """
    path = Path(directory).expanduser().absolute()
    here = next(p for p in (path, *path.parents) if os.path.lexists(p))  # the folder it is made in
    if not here.is_dir():
        raise OSError(f"{path}: cannot be made ({here} is not a folder)")
    if not os.access(here, os.W_OK | os.X_OK):
        raise OSError(f"{path}: not writable" if here == path else f"{path}: cannot be made ({here} is not writable)")
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


def _placed(tree, shardings):
    """``tree`` with each leaf on its sharding in ``shardings`` (same structure): an array already there
    committed there kept as it is, any other copied there from the host (every process holds the same
    values). An uncommitted array (a fresh model's, on the default device) is placed too: the step's
    outputs are committed, and a state of both kinds would compile the step twice."""

    def put(x, s):
        if isinstance(x, jax.Array) and x.committed and x.sharding.is_equivalent_to(s, x.ndim):
            return x
        return jax.device_put(np.asarray(x), s)

    return jax.tree.map(put, tree, shardings)


def sharded_abstract(trainer: Trainer):
    """``trainer.abstract_state`` with each leaf's target sharding attached (for restores)."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        trainer.abstract_state,
        trainer.state_shardings,
    )
