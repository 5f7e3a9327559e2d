"""Training the PyTorch twin: the JAX twin's training step in PyTorch, from the same ``TrainConfig``.

The JAX twin is the one that runs training; this trainer takes the same steps beside it, batch by batch,
to prove the two equal, from the one input pipeline
(``vit_common.data.datasets``: the batches are numpy dicts, image float32 [B, H, W, C], label int32 [B],
target float32 [B, K] already mixed by mixup / cutmix, mask float32 [B]).

The step (each choice the JAX step's, see ``vit_jax.trainer`` and ``vit_jax.optim``):

- the optimizer is ``torch.optim.AdamW`` over parameter groups (``make_optimizer``): the recipe's decay
  mask (``vit_common.training.recipes.decays`` with the model's ``no_weight_decay()``), layer-wise decay as each
  group's ``lr_scale`` (layers as timm's ``param_groups_layer_decay``), and for big_vision (decay not
  scaled by the base lr) a group weight decay of wd / (lr x lr_scale), so that torch's
  ``p *= 1 - lr_group(t) x wd_group`` is big_vision's ``p -= (lr(t) / lr) x wd x p``. big_vision's
  bfloat16 first moment: a step post-hook (``Optimizer.register_step_post_hook``) rounds ``exp_avg`` to
  bfloat16 after each step; optax's ``scale_by_adam(mu_dtype=...)`` also updates with the unrounded
  moment and stores the rounded one.
- the schedule: ``torch.optim.lr_scheduler.LambdaLR`` of ``TrainConfig.schedule``'s factor
  (``vit_common.training.recipes.Schedule``: optax's warmup-cosine written in Python floats, or timm's
  ``CosineLRScheduler``); step 0 is the first optimizer step, as in optax.
- global-norm clipping: ``torch.nn.utils.clip_grad_norm_`` (recipes with torch's clip: max / (norm +
  1e-6)), or optax's coefficient max / norm (``optax.clip_by_global_norm``) for the others.
- the loss: ``F.cross_entropy`` against the batch's soft targets with ``label_smoothing`` (torch smooths
  soft targets as optax's ``smooth_labels``: (1 - e) t + e / K), summed over the real (mask 1) rows;
  accumulation runs the micro-batches (rows i, i + A, ...: the JAX step's split) and divides the summed
  gradients by the batch's real count.
- ``freeze``: every parameter but the head gets ``requires_grad=False`` (no backward through them, no
  optimizer state), as timm's ``param_groups_*`` skip them.
- ``lora``: ``peft``'s adapters on the target layers (``vit_torch.lora``), the base weights frozen as
  with ``freeze``, the adapters and the head trained; parameters go by their canonical names (the JAX
  twin's: ``{layer}.weight``, ``{layer}.lora.lora_a``), so the recipe's decay mask and the layer-wise
  decay treat each tensor as the JAX twin's ``vit_jax.optim`` does.
- bfloat16: the twin computes in ``cfg.dtype`` itself (``vit_torch.model``: the layers cast, statistics
  stay float32), which is what ``torch.autocast`` would do for the matmuls, without autocast's op lists
  that differ between CPU and CUDA; the loss is taken in at least float32 in both twins.

- ``ema``: the moving average of the weights is timm's ``ModelEmaV3`` update (``ModelEma``; timm is not
  a dependency of this twin, so it is written here and tested against timm's class), after the
  optimizer and scheduler steps, as the JAX step's ``vit_jax.optim.ema_update``.

Dropout and drop path draw from torch's generator, seeded by ``tcfg.seed``; the parity harness feeds
both twins the same masks instead (``drop_masks``, ``dropout_masks``).

One file, where the JAX twin splits training by job into five modules: this twin takes steps and runs
no whole training of its own (no checkpoints, resume rules or loop), and at about 300 lines it needs no
split. What mirrors what:

- ``make_optimizer`` (with ``round_first_moment``): ``vit_jax.optim.make_optimizer``;
- ``ModelEma``: ``vit_jax.optim.ema_decay`` and ``ema_update``;
- ``Trainer`` (``train_step``, ``weights``): ``vit_jax.trainer.Trainer`` (its ``train_step``, which runs
  ``loss_and_grads`` and ``train_step_fn``, and ``weights``);
- ``Trainer.adam_state`` / ``load_adam_state``: ``vit_jax.optimizer_state.adam_state`` /
  ``with_adam_state``;
- nothing here for ``vit_jax.checkpointing``, ``vit_jax.resume`` and ``vit_jax.loop``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from vit_common.config import ViTConfig
from vit_common.data.batches import batches_per_epoch
from vit_common.data.datasets import Dataset
from vit_common.training.recipes import decays, get_recipe, layer_scales
from vit_common.training.train_config import TrainConfig
from vit_torch.lora import ADAPTER_LEAVES, adapted_to_numpy, adapter_layout, add_lora, canonical_name
from vit_torch.model import VisionTransformer
from vit_torch.weights import from_numpy, tensor_to_numpy


def round_first_moment(dtype: torch.dtype):
    """A ``register_step_post_hook`` hook that stores each ``exp_avg`` rounded to ``dtype`` (big_vision's
    ``mu_dtype``), kept in the parameter's dtype so torch's next step reads the rounded moment."""

    def hook(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        with torch.no_grad():
            for state in optimizer.state.values():
                state["exp_avg"].copy_(state["exp_avg"].to(dtype))

    return hook


def make_optimizer(
    model: VisionTransformer, tcfg: TrainConfig, total_steps: int, steps_per_epoch: int | None = None
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """(AdamW over ``model``'s trainable parameters, its LambdaLR of ``tcfg.schedule``) for ``total_steps``
    steps (``steps_per_epoch`` an epoch; default ``total_steps // epochs``) under ``tcfg.recipe``. Each
    group holds ``names`` (canonical, ``vit_torch.lora.canonical_name``), ``lr_scale`` and
    ``weight_decay``; with ``freeze`` the parameters outside the head get ``requires_grad=False`` first
    (with ``lora`` ``vit_torch.lora.add_lora`` has frozen the base weights)."""
    recipe = get_recipe(tcfg.recipe)
    if tcfg.freeze:
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("head."))
    named = [(canonical_name(n)[0], p) for n, p in model.named_parameters()]
    scales = layer_scales([n for n, _ in named], model.cfg.depth, tcfg.layer_decay)
    named = [(n, p) for n, p in named if p.requires_grad]
    nwd = model.no_weight_decay()
    groups: dict[tuple[float, bool], dict] = {}
    for name, p in named:
        scale, decayed = scales[name], decays(recipe, name, p.ndim, nwd)
        wd = tcfg.weight_decay if decayed else 0.0
        if decayed and not recipe.decay_scaled_by_lr:
            wd = tcfg.weight_decay / (tcfg.lr * scale)
        group = groups.setdefault(
            (scale, decayed), {"params": [], "names": [], "lr": tcfg.lr * scale, "lr_scale": scale, "weight_decay": wd}
        )
        group["params"].append(p)
        group["names"].append(name)
    opt = torch.optim.AdamW(
        list(groups.values()), lr=tcfg.lr, betas=(tcfg.b1, tcfg.b2), eps=recipe.eps, weight_decay=0.0, foreach=False
    )
    if recipe.mu_dtype is not None:
        opt.register_step_post_hook(round_first_moment(getattr(torch, recipe.mu_dtype)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, tcfg.schedule(total_steps, steps_per_epoch).factor)
    return opt, sched


class ModelEma:
    """An exponential moving average of ``model``'s state_dict with timm's ``ModelEmaV3`` semantics
    (``timm/utils/model_ema.py``, defaults but ``decay``, ``use_warmup``, ``warmup_gamma``,
    ``warmup_power``, ``min_decay`` from ``tcfg``): ``module`` starts as a deep copy of the model in eval
    mode; ``update(model, step)`` after optimizer step ``step`` (1-based, timm's ``num_updates``) lerps
    every floating-point tensor toward the model's by 1 - ``tcfg.ema_decay(step)`` (the first update a
    copy) and copies the others (integer buffers).

    Raises:
        ValueError: ``tcfg.ema`` is None.
    """

    def __init__(self, model: torch.nn.Module, tcfg: TrainConfig):
        tcfg.ema_decay(1)  # ValueError without an EMA
        self.tcfg = tcfg
        self.module = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: torch.nn.Module, step: int) -> None:
        weight = 1.0 - self.tcfg.ema_decay(step)
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values(), strict=True):
            if ema_v.is_floating_point():
                ema_v.lerp_(model_v.to(dtype=ema_v.dtype), weight)
            else:
                ema_v.copy_(model_v)


class Trainer:
    """The torch twin in training: ``train_step(batch)`` is one optimizer step, as ``vit_jax.trainer.Trainer``'s.

    ``weights`` a canonical state to start from (the parity harness gives both twins the same one), else
    a fresh model seeded by ``tcfg.seed``. With ``tcfg.lora`` the model gets ``vit_torch.lora.add_lora``'s
    adapters, their starting values the adapter tensors of ``weights`` (``{layer}.lora.lora_a`` and
    ``lora_b``, e.g. the JAX twin's draws) if it holds any, else peft's. ``device`` where the model and
    batches live. With ``tcfg.ema``, ``ema`` is the ``ModelEma`` updated after every step.

    Raises:
        ValueError: a config that does not fit the dataset (image size, channels, classes), or an EMA of
            low-precision parameters (``TrainConfig.check_ema_dtype``), as the JAX trainer's; with
            ``tcfg.lora``, no ``weights`` (LoRA fine-tunes given weights) or what ``add_lora`` raises.
    """

    def __init__(
        self,
        cfg: ViTConfig,
        tcfg: TrainConfig,
        data: Dataset,
        *,
        weights: dict[str, np.ndarray] | None = None,
        device: str | torch.device = "cpu",
    ):
        if cfg.num_classes != data.num_classes:
            raise ValueError(f"num_classes={cfg.num_classes} but dataset {data.name!r} has {data.num_classes}")
        if cfg.in_chans != data.channels or tuple(cfg.image_size) != tuple(data.image_size):
            raise ValueError(
                f"model expects {cfg.image_size} x {cfg.in_chans} channels, dataset gives "
                f"{data.image_size} x {data.channels}"
            )
        tcfg.check_ema_dtype(cfg.param_dtype)
        if tcfg.lora is not None and weights is None:
            raise ValueError(f"lora={tcfg.lora}: expected weights to fine-tune (LoRA adapts a checkpoint)")
        self.cfg, self.tcfg, self.data, self.device = cfg, tcfg, data, torch.device(device)
        self.steps_per_epoch = batches_per_epoch(len(data.train), tcfg.batch_size)
        self.total_steps = self.steps_per_epoch * tcfg.epochs
        if weights is None:
            torch.manual_seed(tcfg.seed)
            self.model = VisionTransformer(cfg).to(self.device)
        else:
            leaf = lambda k: k.rsplit(".", 1)[-1] in ADAPTER_LEAVES  # noqa: E731
            self.model = from_numpy(cfg, {k: v for k, v in weights.items() if not leaf(k)}, device=self.device)
            if tcfg.lora is not None:
                adapters = {k: v for k, v in weights.items() if leaf(k)}
                torch.manual_seed(tcfg.seed)  # peft's draws where no adapters are given
                add_lora(self.model, tcfg, adapters or None)
        self.model.train()
        self.recipe = get_recipe(tcfg.recipe)
        self.optimizer, self.scheduler = make_optimizer(self.model, tcfg, self.total_steps, self.steps_per_epoch)
        self.ema = ModelEma(self.model, tcfg) if tcfg.ema is not None else None
        self.step = 0
        torch.manual_seed(tcfg.seed)  # dropout and drop path

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(x)).to(self.device)  # a writable copy: batches may be read-only

    def train_step(self, batch: dict, drop_masks: np.ndarray | None = None, dropout_masks: dict | None = None) -> dict:
        """One optimizer step on a global batch (numpy, B rows). ``drop_masks`` float [B, depth, 2]: the
        drop-path keep masks (1 keep, 0 drop) of every block's two branches, ``dropout_masks`` {module
        path: float [B, ...]} every live dropout's (the parity mode, see ``VisionTransformer.forward``),
        else the model draws its own.

        Returns metrics as the JAX step's: loss (mean over real examples), correct, count, grad_norm (of
        the gradient before clipping), lr (this step's). A NaFlex batch (``vit_common.data.naflex_batches``:
        "image" the patches [B, N, P*P*C], "patch_mask", "position_weights") passes its mask and weights.
        """
        tcfg, a, model = self.tcfg, self.tcfg.accum_steps, self.model
        naflex = {k: self._tensor(batch[k]) for k in ("patch_mask", "position_weights") if k in batch}
        images = self._tensor(batch["image"])
        images = images if naflex else images.permute(0, 3, 1, 2)  # [B, H, W, C] -> [B, C, H, W]
        label, target, mask = (self._tensor(batch[k]) for k in ("label", "target", "mask"))
        masks = None if drop_masks is None else self._tensor(drop_masks)
        drops = None if dropout_masks is None else {k: self._tensor(v) for k, v in dropout_masks.items()}
        lr = tcfg.lr * self.scheduler.lr_lambdas[0](self.step)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = correct = 0.0
        for i in range(a):
            rows = slice(i, None, a)
            logits = model(
                images[rows],
                drop_masks=None if masks is None else masks[rows],
                dropout_masks=None if drops is None else {k: v[rows] for k, v in drops.items()},
                **{k: v[rows] for k, v in naflex.items()},
            )
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            ce = F.cross_entropy(
                logits, target[rows].to(logits.dtype), reduction="none", label_smoothing=tcfg.label_smoothing
            )
            m = mask[rows].to(logits.dtype)
            loss = (ce * m).sum()
            loss.backward()
            loss_sum += float(loss.detach())
            correct += float(((logits.argmax(-1) == label[rows]) * m).sum())
        count = max(float(mask.sum()), 1.0)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        with torch.no_grad():
            for p in params:
                p.grad.div_(count)
        grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
        if tcfg.grad_clip:
            if self.recipe.clip == "torch":
                torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip)
            elif grad_norm >= tcfg.grad_clip:  # optax's clip_by_global_norm: g x max / norm, no epsilon
                with torch.no_grad():
                    for p in params:
                        p.grad.mul_(tcfg.grad_clip / grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        if self.ema is not None:
            self.ema.update(model, self.step)
        return {
            "loss": loss_sum / count,
            "correct": correct,
            "count": float(mask.sum()),
            "grad_norm": grad_norm,
            "lr": lr,
        }

    def weights(self, *, ema: bool = False) -> dict[str, np.ndarray]:
        """The canonical state of the model (numpy, timm names); ``ema``: of its moving average. With
        ``lora`` the adapters unmerged, by the JAX twin's names (``vit_torch.lora.adapted_to_numpy``)."""
        return adapted_to_numpy(self.ema.module if ema else self.model)

    def adam_state(self) -> dict:
        """{"count": steps taken, "mu": {name: exp_avg}, "nu": {name: exp_avg_sq}} (numpy, canonical
        names and layouts; the trainable parameters that have taken a step)."""
        mu, nu = {}, {}
        for group in self.optimizer.param_groups:
            for name, p in zip(group["names"], group["params"], strict=True):
                state = self.optimizer.state.get(p)
                if state:
                    m, v = (adapter_layout(name, tensor_to_numpy(state[k])) for k in ("exp_avg", "exp_avg_sq"))
                    mu[name], nu[name] = np.ascontiguousarray(m), np.ascontiguousarray(v)
        return {"count": self.step, "mu": mu, "nu": nu}

    def load_adam_state(self, moments: dict) -> None:
        """Continue from another run's Adam state (``adam_state``'s form, e.g. the JAX twin's through
        ``vit_jax.optimizer_state.adam_state``): every trainable parameter's ``exp_avg`` / ``exp_avg_sq``
        (cast to its dtype) and the step count, the schedule moved to that step.

        Raises:
            ValueError: names missing from or extra to ``moments``, or a shape that differs.
        """
        named = {n: p for g in self.optimizer.param_groups for n, p in zip(g["names"], g["params"], strict=True)}
        for what in ("mu", "nu"):
            missing, extra = sorted(set(named) - set(moments[what])), sorted(set(moments[what]) - set(named))
            if missing or extra:
                raise ValueError(f"optimizer state {what}: missing {missing}, not parameters of this model {extra}")
        count = int(moments["count"])
        for name, p in named.items():
            mu, nu = (np.array(adapter_layout(name, moments[w][name]), np.float64) for w in ("mu", "nu"))  # a copy
            if mu.shape != tuple(p.shape) or nu.shape != tuple(p.shape):
                raise ValueError(f"optimizer state of {name!r}: shape {mu.shape}, expected {tuple(p.shape)}")
            self.optimizer.state[p] = {
                "step": torch.tensor(float(count)),
                "exp_avg": torch.from_numpy(mu).to(device=p.device, dtype=p.dtype),
                "exp_avg_sq": torch.from_numpy(nu).to(device=p.device, dtype=p.dtype),
            }
        self.step = count
        self.scheduler.last_epoch = count
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
            group["lr"] = base * self.scheduler.lr_lambdas[0](count)
