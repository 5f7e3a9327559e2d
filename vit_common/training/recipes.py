"""Optimizer recipes as data: which tensors decay, how the decay is scaled, the moments' dtype, the clip.

Both twins build their optimizer from one ``Recipe`` (``vit_jax.optim.make_optimizer`` with optax,
``vit_torch.train.make_optimizer`` with ``torch.optim.AdamW``), so a recipe means the same numbers in
either framework. The names are the canonical (timm) parameter names; ``ndim`` is the tensor's rank.

The recipes (``RECIPES``), each from the file that defines it:

- ``twins``: this project's trainer since its start (the default of ``vit train``): AdamW with decay
  ``lr(t) * wd`` on tensors of rank >= 2 except ``pos_embed``, ``cls_token``, ``reg_token`` and the MAP
  probe ``attn_pool.latent``; ``dist_token`` decays (unlike timm), optax's clip.
- ``timm``: timm's ``train.py`` through ``timm.optim.create_optimizer_v2``: ``param_groups_weight_decay``
  (``timm/optim/_param_groups.py``: no decay on rank <= 1, ``*.bias`` and the model's
  ``no_weight_decay()``, for a ViT ``pos_embed``, ``cls_token``, ``reg_token``, ``dist_token``:
  ``timm/models/vision_transformer.py``), ``torch.optim.AdamW`` (decay ``lr(t) * wd``), and
  ``torch.nn.utils.clip_grad_norm_``, whose coefficient is ``max / (norm + 1e-6)``
  (``torch/nn/utils/clip_grad.py``). The MAP probe decays.
- ``torch``: ``torch.optim.AdamW(model.parameters())``: every tensor decays (``lr(t) * wd``), torch's clip.
- ``big_vision``: ``big_vision/optax.py`` ``make``: ``chain(clip_by_global_norm, scale_by_adam(mu_dtype=
  bfloat16), scale(lr), [lr_mults], add_decayed_weights(wd, '.*/kernel$'), scale_by_schedule(f),
  scale(-1))``: the decay is ``f(t) * wd``, not multiplied by the base lr, on kernels only (Dense and
  Conv weights, canonical ``*.weight`` of rank >= 2), and the first moment is stored in bfloat16 (the
  ``config.optax = dict(mu_dtype='bfloat16')`` of big_vision's ViT configs; big_vision#41). Layer-wise
  decay acts as ``lr_mults``, which come before the decay: the decay is not scaled by the layer.
- ``optax``: ``optax.adamw`` (``optax/_src/alias.py``) with ``mask=None``: every tensor decays
  (``lr(t) * wd``), optax's clip (``max / norm``, ``optax/transforms/_clipping.py``).

``weight_decay_default`` is each library's own default (torch 1e-2, optax 1e-4, timm's train.py 0.05,
big_vision's ViT configs 1e-4), shown by ``translate`` and the CLI; a run uses ``TrainConfig.weight_decay``
in its recipe's units.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch


@dataclass(frozen=True)
class Recipe:
    """One optimizer recipe (see the module docstring for each).

    decay: which tensors decay: 'twins', 'timm' (rank >= 2, not ``*.bias``, not in the model's
        ``no_weight_decay()``; 'twins' swaps ``dist_token`` for ``attn_pool.latent`` in that set),
        'kernels' (``*.weight`` of rank >= 2) or 'all'.
    decay_scaled_by_lr: True when the step's decay is lr(t) * wd (torch.optim.AdamW, optax.adamw), False
        when it is f(t) * wd with f = lr(t) / lr (big_vision).
    mu_dtype: dtype the first moment is stored in ('bfloat16'), or None: the parameter's dtype.
    clip: 'optax' (g * max / norm when norm >= max) or 'torch' (g * min(1, max / (norm + 1e-6))).
    eps: Adam's epsilon, added to sqrt(v_hat) (the same place in torch and optax; both default 1e-8).
    weight_decay_default: the defining library's default weight decay, in this recipe's units.
    source: the file that defines the recipe.
    """

    name: str
    decay: str
    decay_scaled_by_lr: bool
    mu_dtype: str | None
    clip: str
    weight_decay_default: float
    source: str
    eps: float = 1e-8


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("twins", "twins", True, None, "optax", 0.05, "vit_jax/optim.py (this project's trainer)"),
        Recipe("timm", "timm", True, None, "torch", 0.05, "timm/optim/_param_groups.py, timm/train.py"),
        Recipe("torch", "all", True, None, "torch", 1e-2, "torch/optim/adamw.py"),
        Recipe("big_vision", "kernels", False, "bfloat16", "optax", 1e-4, "big_vision/optax.py"),
        Recipe("optax", "all", True, None, "optax", 1e-4, "optax/_src/alias.py (adamw)"),
    )
}
DEFAULT_RECIPE = "twins"
TORCH_CLIP_EPS = 1e-6  # torch/nn/utils/clip_grad.py: clip_coef = max_norm / (total_norm + 1e-6)


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``.

    Raises:
        ValueError: no such recipe (the known names listed).
    """
    if name not in RECIPES:
        raise ValueError(f"recipe {name!r}: expected one of {', '.join(RECIPES)}")
    return RECIPES[name]


def decays(recipe: Recipe, name: str, ndim: int, no_weight_decay: Collection[str]) -> bool:
    """Whether AdamW decays the canonical tensor ``name`` of rank ``ndim`` under ``recipe``;
    ``no_weight_decay`` is the model's ``no_weight_decay()`` (fnmatch patterns, as timm matches them)."""
    if recipe.decay == "all":
        return True
    if recipe.decay == "kernels":
        return ndim >= 2 and name.endswith(".weight")
    exempt = set(no_weight_decay)
    if recipe.decay == "twins":
        exempt = (exempt - {"dist_token"}) | {"attn_pool.latent"}
    return ndim >= 2 and not name.endswith(".bias") and not any(fnmatch(name, p) for p in exempt)


# timm VisionTransformer.group_matcher (and deit's, for dist_token): the embedding stem is layer 0.
_STEM = ("cls_token", "reg_token", "pos_embed", "dist_token", "patch_embed.", "norm_pre.")


def layer_ids(names: Iterable[str], depth: int) -> dict[str, int]:
    """Each canonical parameter's layer for layer-wise decay, as timm's ``param_groups_layer_decay``
    numbers them from ``group_matcher`` (``timm/models/vision_transformer.py``, ``timm/models/deit.py``,
    ``timm/models/_manipulate.py`` ``group_with_matcher``): 0 the stem (patch embedding, class, register
    and distillation tokens, position embedding, ``norm_pre``), i + 1 block i, the final ``norm`` with
    the last block (``depth``), everything after it (fc_norm, MAP pooling, pre-logits, heads) one layer
    more."""
    names = list(names)
    ids = {}
    for n in names:
        if n.startswith(_STEM):
            ids[n] = 0
        elif n.startswith("blocks."):
            ids[n] = int(n.split(".")[1]) + 1
        elif n.startswith("norm."):
            ids[n] = depth
        else:
            ids[n] = depth + 1
    return ids


def layer_exponents(names: Iterable[str], depth: int) -> dict[str, int]:
    """{canonical name: k}, the parameter's learning rate being scaled by r^k under layer-wise decay r:
    k = L_max - layer, L_max the largest layer present (timm ``param_groups_layer_decay``:
    ``layer_decay ** (layer_max - i)``)."""
    ids = layer_ids(names, depth)
    top = max(ids.values(), default=0)
    return {n: top - i for n, i in ids.items()}


def layer_scales(names: Iterable[str], depth: int, layer_decay: float) -> dict[str, float]:
    """{canonical name: learning-rate scale r^k} (``layer_exponents``); all 1 when r = 1."""
    return {n: layer_decay**k if layer_decay != 1 else 1.0 for n, k in layer_exponents(names, depth).items()}


def timm_param_groups(
    params: Sequence[tuple[str, int]],
    weight_decay: float,
    layer_decay: float | None,
    no_weight_decay: Collection[str] = ("pos_embed", "cls_token", "reg_token", "dist_token"),
) -> list[list[str]]:
    """The parameter groups, as lists of names, that ``timm.optim.create_optimizer_v2`` builds from a
    model whose ``named_parameters()`` are ``params`` ((canonical name, rank), in that order, all
    trainable) with ``weight_decay`` and ``layer_decay`` (None: off; timm's train.py ``args``).
    ``torch.optim.Optimizer.state_dict()`` numbers the parameters 0, 1, ... through these groups in
    order, so this maps a timm training checkpoint's optimizer state back to names.

    ``timm/optim/_optim_factory.py`` / ``_param_groups.py``: with ``layer_decay`` one group per (layer,
    decay or not) in the order first met (``param_groups_layer_decay``: no decay on rank <= 1 and
    ``no_weight_decay``; layers as ``layer_ids``); else with ``weight_decay`` > 0 [no decay (rank <= 1,
    ``*.bias``, ``no_weight_decay``), decay] (``param_groups_weight_decay``; an empty group is left out);
    else one group holding everything. ``no_weight_decay``: a ViT's ``no_weight_decay()``.
    """
    names = [n for n, _ in params]
    exempt = lambda n: any(fnmatch(n, p) for p in no_weight_decay)  # noqa: E731
    if layer_decay is not None:
        depth = 1 + max((int(n.split(".")[1]) for n in names if n.startswith("blocks.")), default=-1)
        ids = layer_ids(names, depth)
        groups: dict[tuple[int, bool], list[str]] = {}
        for n, ndim in params:
            groups.setdefault((ids[n], ndim > 1 and not exempt(n)), []).append(n)
        return list(groups.values())
    if not weight_decay:
        return [names]
    kept = {n for n, ndim in params if ndim <= 1 or n.endswith(".bias") or exempt(n)}
    no_decay, decay = [n for n in names if n in kept], [n for n in names if n not in kept]
    return [g for g in (no_decay, decay) if g]


def schedule_steps(warmup_steps: int, total_steps: int) -> tuple[int, int]:
    """(warmup, decay steps) of the warmup-cosine schedule over ``total_steps`` optimizer steps: the
    warmup is cut to leave at least one step of the cosine (``vit_jax.optim.make_optimizer``)."""
    warmup = min(warmup_steps, max(total_steps - 1, 0))
    return warmup, max(total_steps, warmup + 1)


def lr_factor(step: int, warmup: int, decay_steps: int, min_lr_ratio: float) -> float:
    """lr(step) / lr of ``optax.warmup_cosine_decay_schedule(0, 1, warmup, decay_steps, min_lr_ratio)``
    (``optax/schedules/_schedule.py``), in Python floats: linear from 0 over ``warmup`` steps, then
    ``(1 - a) * (1 + cos(pi * min(t, T) / T)) / 2 + a`` with t = step - warmup, T = decay_steps - warmup,
    a = ``min_lr_ratio``. Step 0 is the first optimizer step."""
    if step < warmup:
        return -1.0 * (1 - step / warmup) + 1.0
    t, span = min(step - warmup, decay_steps - warmup), decay_steps - warmup
    return (1 - min_lr_ratio) * (0.5 * (1 + math.cos(math.pi * t / span))) + min_lr_ratio


# timm's train.py learning-rate schedule defaults (--sched-on-updates off, --warmup-lr 1e-5,
# --warmup-prefix off; train.py at v1.0.28 and at 1.0.29.dev0, and timm 1.0.31's scheduler_kwargs), and
# this project's (optax's warmup_cosine_decay_schedule): what --recipe timm and the others leave unset means.
TIMM_SCHEDULE = {"sched_on_updates": False, "warmup_lr": 1e-5, "warmup_prefix": False}
OPTAX_SCHEDULE = {"sched_on_updates": True, "warmup_lr": 0.0, "warmup_prefix": True}


@dataclass(frozen=True)
class Schedule:
    """The learning rate of each optimizer step of a run: a linear warm-up from ``warmup_lr`` to ``lr``
    over ``warmup_steps``, then a cosine decay to ``lr * min_lr_ratio``.

    ``sched_on_updates`` False: the rate changes once per epoch of ``steps_per_epoch`` steps, held at the
    value of the epoch's first step (timm's train.py by default: ``scheduler.step(epoch)`` at each epoch's
    end). ``warmup_prefix`` True: the cosine starts after the warm-up and spans the rest of the run; False:
    it spans the whole run and the warm-up replaces its start (timm's default). The settings of
    ``OPTAX_SCHEDULE`` are ``optax.warmup_cosine_decay_schedule`` (``lr_factor``: the warm-up cut to leave
    one step of cosine, as this project always had it); any other is timm 1.0.31's ``CosineLRScheduler``
    (``timm/scheduler/cosine_lr.py``) as ``create_scheduler_v2`` builds it with ``num_epochs`` = the
    run's epochs (less the warm-up's with ``warmup_prefix``), ``warmup_epochs`` = ``warmup_steps /
    steps_per_epoch``, ``min_lr`` = ``lr * min_lr_ratio``, ``step_on_epochs`` = not
    ``sched_on_updates``. Under layer-wise decay timm warms every group up from the same ``warmup_lr``
    and down to the same ``min_lr``; here each group's rate is its scale times this one.
    """

    lr: float
    warmup_steps: int
    total_steps: int
    steps_per_epoch: int
    min_lr_ratio: float
    sched_on_updates: bool
    warmup_lr: float
    warmup_prefix: bool

    @property
    def is_optax(self) -> bool:
        """Whether this is optax's warm-up and cosine (``OPTAX_SCHEDULE``'s settings)."""
        return {k: getattr(self, k) for k in OPTAX_SCHEDULE} == OPTAX_SCHEDULE

    def factor(self, step, xp=None):
        """lr(step) / lr, step 0 the first optimizer step: a Python float for an int ``step``; with
        ``xp`` = ``jax.numpy`` and a traced int ``step``, the timm form as a traced float (the optax form
        is ``optax.warmup_cosine_decay_schedule`` there)."""
        if self.is_optax:
            return lr_factor(step, *schedule_steps(self.warmup_steps, self.total_steps), self.min_lr_ratio)
        every = 1 if self.sched_on_updates else self.steps_per_epoch
        t = step // every if xp is None else xp.floor_divide(step, every) * 1.0
        warm = self.warmup_steps / every
        span = max(self.total_steps / every - warm * self.warmup_prefix, 1e-12)  # timm's t_initial
        a, w0 = self.min_lr_ratio, self.warmup_lr / self.lr
        tc = t - warm if self.warmup_prefix else t
        if xp is None:
            if t < warm:
                return w0 + t * ((1 - w0) / warm)
            return a + 0.5 * (1 - a) * (1 + math.cos(math.pi * tc / span)) if tc < span else a
        decay = xp.where(tc < span, a + 0.5 * (1 - a) * (1 + xp.cos(math.pi * tc / span)), a)
        return xp.where(t < warm, w0 + t * ((1 - w0) / max(warm, 1e-12)), decay)


@dataclass(frozen=True)
class Translation:
    """``translate``'s answer: ``weight_decay`` in the target recipe's units, and what it cannot keep."""

    source: str
    target: str
    lr: float
    weight_decay_in: float
    weight_decay: float
    lost: tuple[str, ...]

    def __str__(self) -> str:
        head = (
            f"{self.source} weight_decay={self.weight_decay_in:g} at lr={self.lr:g} = "
            f"{self.target} weight_decay={self.weight_decay:.6g}"
        )
        return "\n".join([head] + [f"  not kept: {x}" for x in self.lost])


# One representative canonical tensor of each kind the masks tell apart: (kind, name, rank).
_KINDS = (
    ("kernels (Dense and Conv weights)", "blocks.0.mlp.fc1.weight", 2),
    ("1-D tensors (biases, norm scales, LayerScale)", "blocks.0.norm1.weight", 1),
    ("pos_embed, cls_token, reg_token", "pos_embed", 3),
    ("dist_token", "dist_token", 3),
    ("the MAP probe attn_pool.latent", "attn_pool.latent", 3),
)
_TIMM_NO_DECAY = ("pos_embed", "cls_token", "reg_token", "dist_token")


def translate(weight_decay: float, lr: float, source: str, target: str) -> Translation:
    """The ``target`` recipe's weight decay that gives the ``source`` recipe's decay per step at base
    learning rate ``lr``, and what the translation cannot keep (tensors one recipe decays and the other
    does not, the first moment's dtype, the clip's epsilon, how layer-wise decay scales the decay).

    The decay per step is lr(t) * wd where ``decay_scaled_by_lr`` and (lr(t) / lr) * wd otherwise, so
    big_vision wd=1e-4 at lr=1e-3 is timm's weight_decay=0.1.

    Raises:
        ValueError: an unknown recipe, or lr / weight_decay not a finite number (lr > 0, wd >= 0).
    """
    src, dst = get_recipe(source), get_recipe(target)
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr={lr}: expected a finite number > 0")
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay={weight_decay}: expected a finite number >= 0")
    per_step = weight_decay * (lr if src.decay_scaled_by_lr else 1.0)
    out = per_step / (lr if dst.decay_scaled_by_lr else 1.0)
    lost = []
    for kind, name, ndim in _KINDS:
        a, b = (decays(r, name, ndim, _TIMM_NO_DECAY) for r in (src, dst))
        if a != b:
            lost.append(
                f"{kind}: {source} {'decays' if a else 'does not decay'} them, {target} {'decays' if b else 'does not'}"
            )
    if src.mu_dtype != dst.mu_dtype:
        lost.append(
            f"first moment stored in {src.mu_dtype or 'the parameter dtype'} ({source}) vs "
            f"{dst.mu_dtype or 'the parameter dtype'} ({target})"
        )
    if src.clip != dst.clip:
        lost.append(
            f"gradient clip: {source} divides by norm{' + 1e-6' * (src.clip == 'torch')}, "
            f"{target} by norm{' + 1e-6' * (dst.clip == 'torch')}"
        )
    if src.decay_scaled_by_lr != dst.decay_scaled_by_lr:
        lost.append(
            "with layer_decay != 1 the decay of lower layers: big_vision's lr_mults do not scale it, "
            "timm's per-group lr does"
        )
    return Translation(source, target, lr, weight_decay, out, tuple(lost))
