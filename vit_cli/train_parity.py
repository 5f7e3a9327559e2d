"""`vit train-parity`: does a JAX training run reproduce the PyTorch one, step by step?

``compare_training`` gives both twins the same initial weights and the same K batches from the one
input pipeline (``vit_jax.train.Trainer.train_iterator``: augmentation, mixup / cutmix and padding drawn
in numpy), takes K optimizer steps in each (``vit_jax.train`` with optax, ``vit_torch.train`` with
torch.optim), and after every step compares the loss, the gradient norm, the learning rate, every
parameter and both Adam moments by canonical name. Drop path runs in the parity mode: both twins take
the same masks, drawn in numpy per step (``drop_path_masks``); dropout has no parity mode yet, so a
config with dropout is refused.

Each twin may run its own ``TrainConfig`` (another recipe, another weight decay): a run of one recipe
against another shows at which step and in which tensor they part. Bounds: ``vit_common.tolerance``'s
"train" rows for the run's dtype (bfloat16 when a recipe keeps its first moment in bfloat16).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vit_common.config import ViTConfig
from vit_common.data.datasets import Dataset, batches_per_epoch
from vit_common.data.train_config import TrainConfig
from vit_common.recipes import get_recipe
from vit_common.tolerance import compare, tolerance

_DROP = 2  # first word of the drop-path masks' seeds (the pipeline's examples use 0, its batches 1)


def drop_path_masks(cfg: ViTConfig, seed: int, step: int, batch_size: int) -> np.ndarray:
    """float32 [B, depth, 2] keep masks (1 keep, 0 drop) of both drop-path branches of every block for
    optimizer step ``step``, from a numpy generator seeded by (seed, 2, step); block i drops with the
    rate both twins give it (``linspace(0, drop_path, depth)``, timm's stochastic-depth rule)."""
    rates = np.linspace(0.0, cfg.drop_path, cfg.depth) if cfg.depth > 1 else np.array([cfg.drop_path])
    rng = np.random.default_rng((seed, _DROP, step))
    return (rng.random((batch_size, cfg.depth, 2)) >= rates[None, :, None]).astype(np.float32)


@dataclass
class StepRow:
    """One optimizer step of both twins: (JAX, torch) metrics, and the largest relative difference
    (max |JAX - torch| / max |torch| of a tensor) over the parameters and each Adam moment, with the
    tensor that has it."""

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

    @property
    def worst(self) -> float:
        return max(self.params, self.mu, self.nu)


@dataclass
class TrainParity:
    """``compare_training``'s result: the rows, the bound (kind, value) of ``dtype`` and the verdict."""

    dtype: str
    recipes: tuple[str, str]
    bound: tuple[str, float]
    rows: list[StepRow] = field(default_factory=list)

    @property
    def first_bad_step(self) -> int | None:
        return next((r.step for r in self.rows if not r.worst <= self.bound[1]), None)

    @property
    def ok(self) -> bool:
        return self.first_bad_step is None

    def to_dict(self) -> dict:
        return {
            "dtype": self.dtype,
            "recipes": {"jax": self.recipes[0], "torch": self.recipes[1]},
            "bound": {"kind": self.bound[0], "value": self.bound[1]},
            "ok": self.ok,
            "first_bad_step": self.first_bad_step,
            "steps": [dataclasses.asdict(r) for r in self.rows],
        }


def _largest(a: dict[str, np.ndarray], b: dict[str, np.ndarray], what: str, dtype: str) -> tuple[float, str]:
    """(largest relative difference over the tensors of ``a`` vs reference ``b``, its name).

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
) -> TrainParity:
    """K = ``steps`` optimizer steps of the JAX twin under ``tcfg`` and of the torch twin under
    ``torch_tcfg`` (default the same), from ``weights`` (default the torch twin's initialisation with
    ``torch_tcfg.seed``: torch draws it in milliseconds, JAX compiles a kernel per shape), on the same
    batches; see the module docstring. float64 needs jax_enable_x64 on.

    Raises:
        ValueError: steps < 1 or more than the run has, a config with dropout or attention dropout (no
            parity mode), configs whose batches differ (batch size, epochs, seed, augmentation), or
            anything the trainers refuse.
    """
    import vit_jax.train as jt
    import vit_torch.train as tt
    from vit_jax.optimizer_state import adam_state

    torch_tcfg = tcfg if torch_tcfg is None else torch_tcfg
    if cfg.dropout or cfg.attn_dropout:
        raise ValueError(
            f"dropout={cfg.dropout}, attn_dropout={cfg.attn_dropout}: the twins share drop-path masks only; "
            "compare with dropout=0 and attn_dropout=0"
        )
    same = ("batch_size", "epochs", "seed", "augment", "dataset", "accum_steps")
    differ = [k for k in same if getattr(tcfg, k) != getattr(torch_tcfg, k)]
    if differ:
        raise ValueError(f"the twins' train configs differ in {differ}: their batches would not be the same")
    total = batches_per_epoch(len(data.train), tcfg.batch_size) * tcfg.epochs
    if not 1 <= steps <= total:
        raise ValueError(f"steps={steps}: expected 1 <= K <= {total} (the run's steps)")
    torch_trainer = tt.Trainer(cfg, torch_tcfg, data, weights=weights)
    weights = torch_trainer.weights() if weights is None else weights
    jax_trainer = jt.Trainer(cfg, tcfg, data, weights=weights)
    dtype = run_dtype(cfg, tcfg, torch_tcfg)
    out = TrainParity(dtype, (tcfg.recipe, torch_tcfg.recipe), tolerance("train", dtype))
    state = jax_trainer.init_state()
    it = jax_trainer.train_iterator()
    try:
        for k in range(steps):
            batch = next(it)
            masks = drop_path_masks(cfg, tcfg.seed, k, tcfg.batch_size) if cfg.drop_path else None
            state, mj = jax_trainer.train_step(state, batch if masks is None else {**batch, "drop_masks": masks})
            mt = torch_trainer.train_step(batch, masks)
            a, b = adam_state(state["opt_state"]), torch_trainer.adam_state()
            p = _largest(jax_trainer.weights(state), torch_trainer.weights(), "parameters", dtype)
            mu, nu = (_largest(a[m], b[m], m, dtype) for m in ("mu", "nu"))
            pairs = [(float(mj[key]), float(mt[key])) for key in ("loss", "grad_norm", "lr")]
            out.rows.append(StepRow(k + 1, *pairs, *p, *mu, *nu))
    finally:
        it.close()
        jax_trainer.close()
    return out


def format_table(result: TrainParity) -> str:
    """One line a step: both losses, gradient norms and learning rates, the largest relative differences,
    and the verdict against the bound."""
    kind, bound = result.bound
    lines = [
        f"JAX ({result.recipes[0]}) vs torch ({result.recipes[1]}), {result.dtype}, bound {kind} {bound:.0e}",
        f"{'step':>4} {'loss jax':>12} {'loss torch':>12} {'grad_norm':>10} {'lr':>9} "
        f"{'params':>9} {'mu':>9} {'nu':>9}  worst tensor",
    ]
    for r in result.rows:
        worst = max((r.params, r.params_worst), (r.mu, "mu " + r.mu_worst), (r.nu, "nu " + r.nu_worst))[1]
        lines.append(
            f"{r.step:>4} {r.loss[0]:>12.8f} {r.loss[1]:>12.8f} {r.grad_norm[1]:>10.4g} {r.lr[1]:>9.3g} "
            f"{r.params:>9.2e} {r.mu:>9.2e} {r.nu:>9.2e}  {worst}{'' if r.worst <= bound else '  FAIL'}"
        )
    bad = result.first_bad_step
    lines.append("verdict: ok" if bad is None else f"verdict: the twins part at step {bad}")
    return "\n".join(lines)


def plot(result: TrainParity, path: Path) -> None:
    """The largest relative differences (parameters, mu, nu) against the step, log scale, with the bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vit_common.system import io

    steps = [r.step for r in result.rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in ("params", "mu", "nu"):
        ax.plot(steps, [max(getattr(r, key), 1e-300) for r in result.rows], marker="o", ms=3, label=key)
    ax.axhline(result.bound[1], color="k", ls="--", lw=1, label=f"bound {result.bound[1]:.0e}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("max |JAX - torch| / max |torch|")
    ax.set_title(f"JAX {result.recipes[0]} vs torch {result.recipes[1]} ({result.dtype})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    io.atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
