"""The JAX twin's optimizer (optax), built from one ``TrainConfig`` and its recipe
(``vit_common.training.recipes``), and the moving average of the weights.

``make_optimizer``: global-norm clipping (the recipe's: optax's coefficient or torch's), then AdamW with
linear warmup + cosine decay (``lr_schedule``), the decay mask and conventions of ``tcfg.recipe`` (the
default ``twins``: no weight decay on biases, norms, class/register tokens, position embeddings and the
MAP probe: ``decay_mask``); for fine-tuning, optionally the head only (``freeze``: ``trainable_mask``) or
layer-wise learning-rate decay (``layer_decay``, layers numbered by ``layer_ids``). With ``tcfg.ema``,
the exponential moving average of the weights (timm's ``ModelEmaV3``): ``ema_decay`` and
``ema_update``, which the jitted step (``vit_jax.trainer``) applies after the optimizer's update.

Masks and layer numbers are pytrees shaped like the model's ``nnx.Param`` state, decided by each
parameter's canonical (timm) name, so one rule serves both twins. The torch twin's counterparts are
``vit_torch.train.make_optimizer`` and ``vit_torch.train.ModelEma``; Adam's moments by canonical names
(to compare with torch's, or to start from them) are ``vit_jax.optimizer_state``.
"""

from __future__ import annotations

from collections.abc import Collection

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vit_common.training import recipes
from vit_common.training.recipes import TORCH_CLIP_EPS, Recipe, decays, get_recipe, schedule_steps
from vit_common.training.train_config import TrainConfig
from vit_jax.weights import _canonical_name


def _canonical(path) -> str:
    """The canonical (timm) name of the parameter at a pytree path of an ``nnx.Param`` State."""
    return _canonical_name(tuple(str(k) for k in _top_keys(path)))[0]


def decay_mask(params: nnx.State, recipe: Recipe, no_weight_decay: Collection[str]) -> nnx.State:
    """True where AdamW applies weight decay under ``recipe`` (``vit_common.training.recipes.decays`` on canonical
    names; ``no_weight_decay`` the model's ``no_weight_decay()``)."""
    return jax.tree_util.tree_map_with_path(lambda p, x: decays(recipe, _canonical(p), x.ndim, no_weight_decay), params)


def _top_keys(path) -> list:
    return [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]


def layer_ids(params: nnx.State, depth: int) -> nnx.State:
    """Each parameter's layer for layer-wise decay, numbered as timm's ``param_groups_layer_decay``
    (``vit_common.training.recipes.layer_ids``): 0 the stem (patch embedding, tokens, position embedding,
    norm_pre), i + 1 block i, the final norm with the last block, ``depth + 1`` what follows it."""
    names = jax.tree_util.tree_leaves(jax.tree_util.tree_map_with_path(lambda p, _: _canonical(p), params))
    ids = recipes.layer_ids(names, depth)
    return jax.tree_util.tree_map_with_path(lambda p, _: ids[_canonical(p)], params)


def trainable_mask(params: nnx.State, tcfg: TrainConfig) -> nnx.State:
    """True for parameters the optimizer changes: all; with ``freeze`` the head only (linear probe); with
    ``lora`` the head and the adapters (``vit_jax.lora``'s ``lora_a`` and ``lora_b``)."""

    def trains(path, _) -> bool:
        keys = _top_keys(path)
        if tcfg.lora is not None:
            return keys[0] == "head" or str(keys[-1]) in ("lora_a", "lora_b")
        return not tcfg.freeze or keys[0] == "head"

    return jax.tree_util.tree_map_with_path(trains, params)


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
    float64 run's learning rate is float64, as torch's Python-float one (``vit_common.training.recipes.lr_factor``)."""
    base = optax.warmup_cosine_decay_schedule(
        0.0, peak, warmup_steps=warmup, decay_steps=decay_steps, end_value=peak * end_ratio
    )
    if not jax.config.jax_enable_x64:
        return base
    return lambda count: base(jnp.asarray(count, jnp.float64))


def lr_schedule(tcfg: TrainConfig, total_steps: int, steps_per_epoch: int | None = None) -> optax.Schedule:
    """The learning rate of each of ``total_steps`` optimizer steps (``steps_per_epoch`` an epoch; default
    ``total_steps // epochs``): ``tcfg.schedule``, by default a linear warmup from 0 to ``lr`` over
    ``warmup_steps`` (at most all steps but one), then cosine decay to ``lr * min_lr_ratio`` at the last
    (``vit_common.training.recipes.schedule_steps``, ``_schedule``); with timm's settings timm's
    ``CosineLRScheduler`` (``vit_common.training.recipes.Schedule.factor``), in float64 when
    jax_enable_x64 is on."""
    return _relative(tcfg.schedule(total_steps, steps_per_epoch), tcfg.lr)


def _relative(s: recipes.Schedule, peak: float) -> optax.Schedule:
    """``s`` scaled to ``peak`` (``s.lr`` the learning rate, 1.0 its factor)."""
    if s.is_optax:
        return _schedule(peak, *schedule_steps(s.warmup_steps, s.total_steps), s.min_lr_ratio)
    return lambda count: peak * s.factor(count, jnp)


def make_optimizer(
    tcfg: TrainConfig,
    total_steps: int,
    depth: int,
    *,
    no_weight_decay: Collection[str],
    steps_per_epoch: int | None = None,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimizer, learning-rate schedule) for ``total_steps`` optimizer steps (``steps_per_epoch`` an
    epoch, ``lr_schedule``) of a ``depth``-block model under ``tcfg.recipe``
    (``vit_common.training.recipes``); ``no_weight_decay`` is the model's ``no_weight_decay()``.

    Global-norm clipping (the recipe's), then AdamW with linear warmup and cosine decay: ``optax.adamw``
    with the recipe's decay mask, or for big_vision ``big_vision/optax.py``'s chain ``scale_by_adam
    (mu_dtype=bfloat16), scale(lr), add_decayed_weights(wd, kernels), scale_by_schedule(lr(t) / lr),
    scale(-1)``. ``freeze``: the same on the head only, every other parameter left unchanged
    (``optax.multi_transform`` with ``set_to_zero``; the frozen parameters have no Adam moments); clipping
    then sees the head's gradient only. ``lora``: the same on the head and the adapters.
    ``layer_decay`` r: the update of a parameter in layer l (``layer_ids``) scaled by r^(L - l), L the
    top layer, as timm's per-group lr_scale does (weight decay included); for big_vision as its
    ``lr_mults``, before the decay, which it then does not scale.
    """
    recipe = get_recipe(tcfg.recipe)
    plan = tcfg.schedule(total_steps, steps_per_epoch)
    schedule = _relative(plan, tcfg.lr)
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
        relative = _relative(plan, 1.0)
        tx = optax.chain(
            optax.scale_by_adam(b1=tcfg.b1, b2=tcfg.b2, eps=recipe.eps, mu_dtype=recipe.mu_dtype),
            optax.scale(tcfg.lr),
            *([layer_scale()] if layered else []),
            optax.add_decayed_weights(tcfg.weight_decay, mask),
            optax.scale_by_schedule(relative),
            optax.scale(-1.0),
        )
    tx = optax.chain(_clip(recipe, tcfg.grad_clip), tx) if tcfg.grad_clip else tx
    if tcfg.freeze or tcfg.lora is not None:
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
