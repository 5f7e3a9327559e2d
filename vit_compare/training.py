"""Training parity: does a JAX training run reproduce the PyTorch one, step by step?

``compare_training`` gives both twins the same initial weights and the same K batches from the one
input pipeline (``vit_jax.trainer.Trainer.train_iterator``: augmentation, mixup / cutmix and padding drawn
in numpy), takes K optimizer steps in each (``vit_jax.trainer`` with optax, ``vit_torch.train`` with
torch.optim), and after every step compares the loss, the gradient norm, the learning rate, every
parameter and both Adam moments by canonical name, and with ``--ema`` the moving averages of the weights
(``vit_jax.optim.ema_update`` against ``vit_torch.train.ModelEma``). Drop path, dropout and attention dropout
run in the parity mode: both twins take the same keep masks, drawn in numpy per step (``drop_path_masks``,
``dropout_masks``). With ``TrainConfig.lora`` both twins fine-tune adapters (flax's ``nnx.LoRA`` in
``vit_jax.lora``, peft's in ``vit_torch.lora``) from the same draws: the JAX twin draws them, the torch
twin takes them; parameters and moments then compare unmerged, adapters by the JAX twin's names.

Each twin may run its own ``TrainConfig`` (another recipe, another weight decay): a run of one recipe
against another shows at which step and in which tensor they part. Bounds: ``vit_common.tolerance``'s
"train" rows for the run's dtype (bfloat16 when a recipe keeps its first moment in bfloat16).
``format_table`` and ``plot`` show the result. The twins are imported inside ``compare_training``, so
importing this module loads no framework.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vit_common.config import ViTConfig
from vit_common.data.batches import batches_per_epoch, check_batch_size
from vit_common.data.datasets import Dataset
from vit_common.tolerance import compare, tolerance
from vit_common.training.recipes import get_recipe
from vit_common.training.train_config import TrainConfig

_DROP = 2  # first word of the drop-path masks' seeds (the pipeline's examples use 0, its batches 1)
_DROPOUT = 3  # first word of the dropout masks' seeds
LORA_SETTINGS = ("lora", "lora_alpha", "lora_dropout", "lora_targets")  # TrainConfig's, the same in both twins


def drop_path_masks(cfg: ViTConfig, seed: int, step: int, batch_size: int) -> np.ndarray:
    """float32 [B, depth, 2] keep masks (1 keep, 0 drop) of both drop-path branches of every block for
    optimizer step ``step``, from a numpy generator seeded by (seed, 2, step); block i drops with the
    rate both twins give it (``linspace(0, drop_path, depth)``, timm's stochastic-depth rule)."""
    rates = np.linspace(0.0, cfg.drop_path, cfg.depth) if cfg.depth > 1 else np.array([cfg.drop_path])
    rng = np.random.default_rng((seed, _DROP, step))
    return (rng.random((batch_size, cfg.depth, 2)) >= rates[None, :, None]).astype(np.float32)


def dropout_sites(cfg: ViTConfig, batch_size: int) -> dict[str, tuple[tuple[int, ...], float]]:
    """{module path: (input shape, rate)} of every live dropout of both twins' training forward, in
    the order of the forward: "pos_drop" [B, L, D], per block i "blocks.{i}.attn.attn_drop" [B, N, L, L]
    (attention probabilities), "blocks.{i}.attn.proj_drop" [B, L, D], "blocks.{i}.mlp.drop1" [B, L, F],
    "blocks.{i}.mlp.drop2" [B, L, D], the MAP head's "attn_pool.mlp.drop1" [B, 1, F] and ".drop2"
    [B, 1, D], "head_drop" [B, D'] ([B, L, D'] with pool='none') and, with a distilled head,
    "head_drop_dist" [B, D]. L = ``cfg.seq_len``, F = ``cfg.mlp_dim``, D' = ``cfg.features_dim``."""
    b, n, d, f, l = batch_size, cfg.num_heads, cfg.width, cfg.mlp_dim, cfg.seq_len
    p, a = cfg.dropout, cfg.attn_dropout
    sites = {"pos_drop": ((b, l, d), p)}
    for i in range(cfg.depth):
        sites |= {
            f"blocks.{i}.attn.attn_drop": ((b, n, l, l), a),
            f"blocks.{i}.attn.proj_drop": ((b, l, d), p),
            f"blocks.{i}.mlp.drop1": ((b, l, f), p),
            f"blocks.{i}.mlp.drop2": ((b, l, d), p),
        }
    if cfg.pool == "map":
        sites |= {"attn_pool.mlp.drop1": ((b, 1, f), p), "attn_pool.mlp.drop2": ((b, 1, d), p)}
    sites["head_drop"] = ((b, l, cfg.features_dim) if cfg.pool == "none" else (b, cfg.features_dim), p)
    if cfg.head_dist:
        sites["head_drop_dist"] = ((b, d), p)
    return {k: v for k, v in sites.items() if v[1] > 0}


def dropout_masks(cfg: ViTConfig, seed: int, step: int, batch_size: int) -> dict[str, np.ndarray]:
    """{module path: float32 keep mask (1 keep, 0 drop)} of every live dropout (``dropout_sites``) for
    optimizer step ``step``, drawn in that order from one numpy generator seeded by (seed, 3, step);
    each element is kept with probability 1 - rate, as ``nn.Dropout`` and ``nnx.Dropout`` keep it."""
    rng = np.random.default_rng((seed, _DROPOUT, step))
    return {
        k: (rng.random(shape) >= rate).astype(np.float32) for k, (shape, rate) in dropout_sites(cfg, batch_size).items()
    }


@dataclass
class StepRow:
    """One optimizer step of both twins: (JAX, torch) metrics, and the largest relative difference
    (max |JAX - torch| / max |torch| of a tensor) over the parameters, each Adam moment and (with an
    EMA, else 0 and "") the moving average of the weights, with the tensor that has it. In a
    bfloat16-compute run ``ref`` is (JAX, torch) against the float64 reference run: ||twin - ref|| /
    ||ref|| over all parameters at once (``_vector_rel``), else None."""

    step: int
    loss: tuple[float, float]
    grad_norm: tuple[float, float]
    lr: tuple[float, float]
    params: float
    params_worst: str
    mu: float
    mu_worst: str
    nu: float
    nu_worst: str
    ema: float = 0.0
    ema_worst: str = ""
    ref: tuple[float, float] | None = None
    update: float = 0.0
    update_worst: str = ""

    @property
    def worst(self) -> float:
        """What the verdict holds to the bound: with a reference run, the twins' distance from it (the
        per-tensor differences of bfloat16 compute are no measure: Adam turns a gradient that is zero but
        for rounding, as a key bias's, into a step of the lr's size); else the twins' per-tensor one."""
        return max(self.ref) if self.ref is not None else max(self.params, self.mu, self.nu, self.ema)

    def ok(self, bound: float, update_bound: float | None) -> bool:
        """Whether the step is within ``bound`` (``worst``) and, where ``update_bound`` is given (float64),
        the parameters' difference relative to how far they moved (``update``) within it: a bound on the
        parameters themselves passes two runs whose learning rate stays near zero."""
        if self.ref is not None or update_bound is None:
            return self.worst <= bound
        return max(self.mu, self.nu, self.ema) <= bound and self.update <= update_bound


@dataclass
class TrainParity:
    """``compare_training``'s result: the rows, the bound (kind, value) of ``dtype`` and the verdict.
    ``dtype`` is the bound's (``run_dtype``), ``compute`` the model's: a big_vision recipe computing in
    float64 keeps its first moment in bfloat16 and is held to bfloat16's bound. With LoRA ``frozen`` is
    ("jax" | "torch", tensor) of every frozen base tensor that is not bit for bit its step-0 value after
    the last step (the verdict holds it empty), else None."""

    dtype: str
    recipes: tuple[str, str]
    bound: tuple[str, float]
    rows: list[StepRow] = field(default_factory=list)
    compute: str | None = None
    setup: dict = field(default_factory=dict)
    update_bound: float | None = None
    frozen: list[tuple[str, str]] | None = None

    @property
    def label(self) -> str:
        """The dtype as a reader should see it: "float64, first moment bfloat16" where the two differ."""
        if self.compute is None or self.compute == self.dtype:
            return self.dtype
        return f"{self.compute}, first moment {self.dtype}"

    @property
    def first_bad_step(self) -> int | None:
        return next((r.step for r in self.rows if not r.ok(self.bound[1], self.update_bound)), None)

    @property
    def ok(self) -> bool:
        return self.first_bad_step is None and not self.frozen

    @property
    def has_ema(self) -> bool:
        """Whether the rows compare moving averages of the weights too (``--ema``)."""
        return any(r.ema_worst for r in self.rows)

    def to_dict(self) -> dict:
        return {
            "dtype": self.dtype,
            "recipes": {"jax": self.recipes[0], "torch": self.recipes[1]},
            "bound": {"kind": self.bound[0], "value": self.bound[1]},
            "update_bound": self.update_bound,
            "ok": self.ok,
            "first_bad_step": self.first_bad_step,
            "frozen_changed": self.frozen,
            "compared": self.setup,
            "steps": [dataclasses.asdict(r) for r in self.rows],
        }


def largest_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray], what: str, dtype: str) -> tuple[float, str]:
    """(largest relative difference over the tensors of ``a`` vs reference ``b`` (``compare``'s, the "train"
    row of the tolerance table), its name).

    Raises:
        ValueError: the two hold different names.
    """
    if a.keys() != b.keys():
        raise ValueError(f"{what}: JAX has {sorted(set(a) - set(b))} more, torch {sorted(set(b) - set(a))} more")
    worst = (0.0, "")
    for name in a:
        c = compare(name, a[name], b[name], "train", dtype)
        worst = max(worst, (c.rel, name))
    return worst


def largest_update_difference(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], start: dict[str, np.ndarray]
) -> tuple[float, str]:
    """(largest over the tensors of max |a - b| / max |b - start|, its name): the twins' difference
    relative to how far the reference ``b`` moved from ``start`` (what a control run measures); a tensor
    that did not move counts 0 where the twins agree exactly, else infinity."""
    worst = (0.0, "")
    for name in b:
        moved = float(np.max(np.abs(np.asarray(b[name], np.float64) - np.asarray(start[name], np.float64)), initial=0))
        diff = float(np.max(np.abs(np.asarray(a[name], np.float64) - np.asarray(b[name], np.float64)), initial=0))
        rel = diff / moved if moved > 0 else (0.0 if diff == 0 else float("inf"))
        worst = max(worst, (rel, name))
    return worst


def describe(
    cfg: ViTConfig, tcfgs: tuple[TrainConfig, TrainConfig], data: Dataset, init: str, max_patches: int | None = None
) -> dict:
    """What a comparison compared: the model (shape, rotary position embedding ``rope``, parameter count,
    dtypes, ``init``: where its weights came from), the data (dataset, training images, batch size,
    augmentation, ``max_patches``: the NaFlex batches' patch budget, None for fixed-size images), and per
    twin the recipe, learning rate and schedule (peak, warm-up steps, floor, ``TrainConfig.schedule_settings``)
    and weight decay; the learning rate each step actually took goes into the rows."""
    model = {
        "width": cfg.width,
        "depth": cfg.depth,
        "num_heads": cfg.num_heads,
        "mlp_dim": cfg.mlp_dim,
        "image_size": list(cfg.image_size),
        "patch_size": list(cfg.patch_size),
        "num_classes": cfg.num_classes,
        "pool": cfg.pool,
        "rope": cfg.rope,
        "parameters": cfg.param_count(),
        "dtype": cfg.dtype,
        "param_dtype": cfg.param_dtype,
        "init": init,
    }
    t = tcfgs[0]
    data_d = {
        "dataset": t.dataset,
        "train_images": len(data.train),
        "batch_size": t.batch_size,
        "augment": dataclasses.asdict(t.augment),
        "max_patches": max_patches,
    }
    twins = {
        name: {
            "recipe": c.recipe,
            "lr": c.lr,
            "warmup_steps": c.warmup_steps,
            "min_lr_ratio": c.min_lr_ratio,
            **c.schedule_settings(),
            "weight_decay": c.weight_decay,
            "layer_decay": c.layer_decay,
            "grad_clip": c.grad_clip,
            "lora": None if c.lora is None else {k: getattr(c, k) for k in LORA_SETTINGS},
        }
        for name, c in zip(("jax", "torch"), tcfgs, strict=True)
    }
    return {"model": model, "data": data_d, "optimizer": twins}


def _vector_rel(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """||a - b|| / ||b|| with every tensor of ``b`` as one vector (float64)."""
    diff = sum(float(np.sum((np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)) ** 2)) for k in b)
    return float(np.sqrt(diff / sum(float(np.sum(np.asarray(b[k], np.float64) ** 2)) for k in b)))


def run_dtype(cfg: ViTConfig, *tcfgs: TrainConfig) -> str:
    """The dtype whose "train" bound applies: bfloat16 when the model computes in it or a recipe keeps
    its first moment in it, else the model's parameter dtype."""
    if cfg.dtype == "bfloat16" or any(get_recipe(t.recipe).mu_dtype == "bfloat16" for t in tcfgs):
        return "bfloat16"
    return cfg.param_dtype


def compare_training(
    cfg: ViTConfig,
    tcfg: TrainConfig,
    data: Dataset,
    steps: int,
    *,
    torch_tcfg: TrainConfig | None = None,
    weights: dict[str, np.ndarray] | None = None,
    init: str = "given weights",
    preprocess=None,
) -> TrainParity:
    """K = ``steps`` optimizer steps of the JAX twin under ``tcfg`` and of the torch twin under
    ``torch_tcfg`` (default the same), from ``weights`` (default the torch twin's initialisation with
    ``torch_tcfg.seed``: torch draws it in milliseconds, JAX compiles a kernel per shape; ``init`` says
    where given ones came from, for the report), on the same batches; see the module docstring. The
    verdict holds each parameter's difference to how far it moved (``largest_update_difference``), and
    the result's ``setup`` records what was compared (``describe``). float64 needs jax_enable_x64 on.
    With bfloat16 compute a third run, the torch twin in float64 from the same weights, batches and
    masks, is the reference: each row's ``ref`` holds both twins' ||twin - f64|| / ||f64||, which the
    verdict holds to the tolerance table's "train_vs_float64" bound. With ``tcfg.lora`` the JAX twin
    draws the adapters (flax's initialisation from ``tcfg.seed``) and the torch twin starts from them.
    ``preprocess`` (``vit_common.data.images.Preprocess``, default the JAX trainer's) is the batches'; a
    NaFlex one (``max_patches``) gives both twins NaFlex batches, images of several sizes padded to it.

    Raises:
        ValueError: steps < 1 or more than the run has, a batch larger than the training images, configs
            whose batches differ (batch size, epochs, seed, augmentation) or whose LoRA settings differ,
            LoRA with adapter dropout (no shared masks for it yet), an EMA in one twin only, or anything
            the trainers refuse.
    """
    import vit_jax.trainer as jt
    import vit_torch.train as tt
    from vit_jax.optimizer_state import adam_state

    torch_tcfg = tcfg if torch_tcfg is None else torch_tcfg
    same = ("batch_size", "epochs", "seed", "augment", "dataset", "accum_steps", *LORA_SETTINGS)
    differ = [k for k in same if getattr(tcfg, k) != getattr(torch_tcfg, k)]
    if differ:
        raise ValueError(f"the twins' train configs differ in {differ}: their batches would not be the same")
    if (tcfg.ema is None) != (torch_tcfg.ema is None):
        raise ValueError(f"ema={tcfg.ema} (JAX) and {torch_tcfg.ema} (torch): an EMA in both twins or in neither")
    check_batch_size(tcfg.batch_size, len(data.train), tcfg.dataset)
    total = batches_per_epoch(len(data.train), tcfg.batch_size) * tcfg.epochs
    if not 1 <= steps <= total:
        raise ValueError(f"steps={steps}: expected 1 <= K <= {total} (the run's steps)")
    if tcfg.lora is not None and tcfg.lora_dropout:
        raise ValueError(
            f"lora_dropout={tcfg.lora_dropout}: the parity mode has no shared masks for the adapters' dropout; "
            "expected 0"
        )
    init = "the torch twin's initialisation" if weights is None else init
    lora = tcfg.lora is not None  # the torch twin takes flax's adapter draws: the JAX twin starts first
    torch_trainer = None if lora else tt.Trainer(cfg, torch_tcfg, data, weights=weights)
    weights = torch_trainer.weights() if weights is None and not lora else weights
    jax_trainer = jt.Trainer(cfg, tcfg, data, weights=weights, preprocess=preprocess)
    state = jax_trainer.init_state()
    if lora:
        weights = jax_trainer.weights(state, merged=False)  # the base weights and the adapters' draws
        torch_trainer = tt.Trainer(cfg, torch_tcfg, data, weights=weights)
    start = {k: np.array(v, copy=True) for k, v in torch_trainer.weights().items()}
    f64 = cfg.replace(dtype="float64", param_dtype="float64")
    reference = tt.Trainer(f64, torch_tcfg, data, weights=weights) if cfg.dtype == "bfloat16" else None
    dtype = run_dtype(cfg, tcfg, torch_tcfg)
    bound = tolerance("train_vs_float64" if reference is not None else "train", dtype)
    out = TrainParity(dtype, (tcfg.recipe, torch_tcfg.recipe), bound, compute=cfg.dtype)
    out.setup = describe(cfg, (tcfg, torch_tcfg), data, init, getattr(preprocess, "max_patches", None))
    if reference is None and dtype == "float64":
        out.update_bound = tolerance("train_update", "float64")[1]
    it = jax_trainer.train_iterator()
    try:
        for k in range(steps):
            batch = next(it)
            masks = drop_path_masks(cfg, tcfg.seed, k, tcfg.batch_size) if cfg.drop_path else None
            drops = dropout_masks(cfg, tcfg.seed, k, tcfg.batch_size) or None
            extra = {n: v for n, v in (("drop_masks", masks), ("dropout_masks", drops)) if v is not None}
            state, mj = jax_trainer.train_step(state, {**batch, **extra})
            mt = torch_trainer.train_step(batch, masks, drops)
            a, b = adam_state(state["opt_state"]), torch_trainer.adam_state()
            pj, pt = jax_trainer.weights(state, merged=False), torch_trainer.weights()
            p = largest_difference(pj, pt, "parameters", dtype)
            update = largest_update_difference(pj, pt, start)
            mu, nu = (largest_difference(a[m], b[m], m, dtype) for m in ("mu", "nu"))
            pairs = [(float(mj[key]), float(mt[key])) for key in ("loss", "grad_norm", "lr")]
            ema = (
                ()
                if tcfg.ema is None
                else largest_difference(
                    jax_trainer.weights(state, ema=True, merged=False), torch_trainer.weights(ema=True), "ema", dtype
                )
            )
            ref = None
            if reference is not None:
                reference.train_step(batch, masks, drops)
                w = reference.weights()
                ref = tuple(
                    _vector_rel(t, w) for t in (jax_trainer.weights(state, merged=False), torch_trainer.weights())
                )
            out.rows.append(
                StepRow(k + 1, *pairs, *p, *mu, *nu, *ema, ref=ref, update=update[0], update_worst=update[1])
            )
        if lora:
            out.frozen = frozen_changed(start, {"jax": pj, "torch": pt})
    finally:
        it.close()
        jax_trainer.close()
    return out


def frozen_changed(start: dict[str, np.ndarray], twins: dict[str, dict[str, np.ndarray]]) -> list[tuple[str, str]]:
    """(twin, name) of every tensor of a LoRA run's ``start`` state outside the adapters and the head that
    a twin's state does not hold bit for bit."""
    frozen = [k for k in start if not k.startswith("head.") and k.rsplit(".", 1)[-1] not in ("lora_a", "lora_b")]
    return [(twin, k) for twin, state in twins.items() for k in frozen if not np.array_equal(state[k], start[k])]


def format_table(result: TrainParity) -> str:
    """One line a step: both losses, gradient norms and learning rates, the largest relative differences
    (and the EMA's, when the run keeps one), and the verdict against the bound."""
    bound = result.bound[1]
    has_ema = result.has_ema
    lines = [
        f"JAX ({result.recipes[0]}) vs torch ({result.recipes[1]}), {result.label}; {verdict_bounds(result)}",
        *setup_lines(result),
        "params, mu, nu"
        + (", ema" if has_ema else "")
        + ": max|JAX - torch| / max|torch| of the worst tensor; update: max|JAX - torch| / max|torch - step 0|",
        f"{'step':>4} {'loss jax':>12} {'loss torch':>12} {'grad_norm':>10} {'lr':>9} "
        f"{'params':>9} {'update':>9} {'mu':>9} {'nu':>9}{' ' + 'ema'.rjust(9) if has_ema else ''}  worst tensor",
    ]
    refs = result.rows[0].ref is not None if result.rows else False
    if refs:
        lines[-1] += "; ref: ||JAX - f64||, ||torch - f64|| / ||f64||"
    by_update = result.update_bound is not None
    for r in result.rows:
        measured = (r.update / result.update_bound * bound, r.update_worst) if by_update else (r.params, r.params_worst)
        tables = [measured, (r.mu, "mu " + r.mu_worst), (r.nu, "nu " + r.nu_worst)]
        tables += [(r.ema, "ema " + r.ema_worst)] if has_ema else []
        vs = f"  ref {r.ref[0]:.2e} {r.ref[1]:.2e}" if refs else ""
        shown = [r.params, r.update, r.mu, r.nu, *([r.ema] if has_ema else [])]
        lines.append(
            f"{r.step:>4} {r.loss[0]:>12.8f} {r.loss[1]:>12.8f} {r.grad_norm[1]:>10.4g} {r.lr[1]:>9.3g} "
            + " ".join(f"{v:>9.2e}" for v in shown)
            + f"  {max(tables)[1]}{vs}{'' if r.ok(bound, result.update_bound) else '  FAIL'}"
        )
    if result.frozen is not None:
        moved = ", ".join(f"{twin} {name}" for twin, name in result.frozen)
        lines.append(
            f"frozen base weights: {'bit for bit as at step 0 in both twins' if not moved else 'moved: ' + moved}"
        )
    bad = result.first_bad_step
    faults = ([f"the twins part at step {bad}"] if bad is not None else []) + (
        ["frozen weights moved"] * bool(result.frozen)
    )
    lines.append(f"verdict: {'; '.join(faults) or 'ok'}")
    return "\n".join(lines)


def verdict_bounds(result: TrainParity) -> str:
    """Which columns the verdict holds to which bound (``StepRow.ok``), and those it shows only."""
    kind, bound = result.bound
    moments = "mu, nu" + (", ema" if result.has_ema else "")
    if result.rows and result.rows[0].ref is not None:
        return f"the verdict holds ref to {kind} {bound:.0e} (params, {moments}: shown, not held)"
    if result.update_bound is None:
        return f"the verdict holds params, {moments} to {kind} {bound:.0e}"
    return (
        f"the verdict holds update to {kind} {result.update_bound:.0e}, {moments} to {kind} {bound:.0e} "
        "(params: shown, not held)"
    )


def setup_lines(result: TrainParity) -> list[str]:
    """What was compared, in three lines: model, data, each twin's learning rate schedule and decay."""
    if not result.setup:
        return []
    m, d, o = result.setup["model"], result.setup["data"], result.setup["optimizer"]
    lrs = [r.lr[1] for r in result.rows]
    span = f"; lr over the {len(lrs)} steps {min(lrs):.3g} .. {max(lrs):.3g}" if lrs else ""
    twins = "; ".join(
        f"{name} {c['recipe']} lr {c['lr']:g} warm-up {c['warmup_steps']} floor x{c['min_lr_ratio']:g} "
        f"weight decay {c['weight_decay']:g}"
        for name, c in o.items()
    )
    return [
        f"model: {m['width']}x{m['depth']}, {m['num_heads']} heads, {m['image_size'][0]}x{m['image_size'][1]} "
        f"patch {m['patch_size'][0]}, {m['num_classes']} classes, "
        + ("" if m.get("rope", "none") == "none" else f"RoPE {m['rope']}, ")
        + f"{m['parameters']:,} parameters, "
        f"{m['dtype']}; weights: {m['init']}",
        f"data: {d['dataset']}, {d['train_images']} training images, batch {d['batch_size']}"
        + ("" if d.get("max_patches") is None else f" NaFlex, {d['max_patches']} patches an image at most")
        + span,
        f"optimizer: {twins}",
    ]


def plot(result: TrainParity, path: Path) -> None:
    """The largest relative differences (parameters relative to their move, mu, nu) against the step, log
    scale, with the bound (matplotlib's ``Figure`` without pyplot: no backend is chosen for the process)."""
    from matplotlib.figure import Figure

    from vit_common.system import io

    steps = [r.step for r in result.rows]
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for key in ("params", "update", "mu", "nu", *(("ema",) if result.has_ema else ())):
        ax.plot(steps, [max(getattr(r, key), 1e-300) for r in result.rows], marker="o", ms=3, label=key)
    ax.axhline(result.bound[1], color="k", ls="--", lw=1, label=f"bound {result.bound[1]:.0e}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("max |JAX - torch| / max |torch| (update: / its move)")
    ax.set_title(f"JAX {result.recipes[0]} vs torch {result.recipes[1]} ({result.dtype})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    io.atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100, metadata=io.PNG_TEXT))
