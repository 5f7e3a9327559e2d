"""LoRA fine-tuning of the JAX twin with flax's own adapters (``nnx.LoRALinear``, ``nnx.LoRAParam``).

``add_lora`` replaces each target linear layer of a model by a ``LoRALinear`` holding the same ``kernel``
and ``bias`` Variables plus ``lora.lora_a`` (D_in, r) and ``lora.lora_b`` (r, D_out), flax's
initialisation (A He-uniform, B zero: the adapted model starts equal to the base); the layer computes
x W + b + (alpha / r) dropout(x) A B, PEFT's ``LoraLayer`` form. Targets are canonical (timm) module
names matched against each linear layer's path (``blocks.3.attn.qkv`` matches ``qkv``, ``attn.qkv`` and
itself); the head is never adapted (``TrainConfig.lora`` trains it in full).

``merge_lora`` folds the adapters of a canonical state into plain weights: weight (D_out, D_in) +
(alpha / r) (A B)^T, computed in float64 and cast to the weight's dtype, so every writer takes the result
unchanged. The trainer (``vit_jax.trainer``) freezes everything but the adapters and the head
(``vit_jax.optim.trainable_mask``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_common.training.train_config import TrainConfig

ADAPTER_LEAVES = ("lora_a", "lora_b")  # the nnx.LoRAParam names of nnx.LoRA


class LoRALinear(nnx.LoRALinear):
    """``nnx.LoRALinear`` with PEFT's scale alpha / r and dropout on the adapter's input, sharing the
    ``kernel`` and ``bias`` Variables of ``base``. Input [..., D_in] -> [..., D_out], multiplied as one
    [M, D_in] matrix (as ``vit_jax.platforms.FlatLinear``). Adapter parameters are ``nnx.LoRAParam`` in
    at least float32 (the base's ``param_dtype`` if wider)."""

    def __init__(self, base: nnx.Linear, rank: int, alpha: float, dropout: float, rngs: nnx.Rngs):
        super().__init__(
            base.in_features,
            base.out_features,
            lora_rank=rank,
            lora_dtype=base.dtype,
            lora_param_dtype=jnp.promote_types(base.param_dtype, jnp.float32),
            use_bias=base.use_bias,
            dtype=base.dtype,
            param_dtype=base.param_dtype,
            precision=base.precision,
            kernel_init=nnx.initializers.zeros_init(),  # replaced by the base's kernel below
            rngs=rngs,
        )
        self.kernel, self.bias = base.kernel, base.bias
        self.scale = alpha / rank
        self.lora_dropout = nnx.Dropout(dropout, rngs=rngs if dropout > 0 else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        flat = x.reshape(-1, x.shape[-1])  # [M, D_in]
        y = nnx.Linear.__call__(self, flat) + self.lora(self.lora_dropout(flat)) * self.scale  # [M, D_out]
        return y.reshape(*x.shape[:-1], self.out_features)


def lora_scale(tcfg: TrainConfig) -> float:
    """alpha / r of ``tcfg`` (alpha defaults to the rank r)."""
    return (tcfg.lora_alpha if tcfg.lora_alpha is not None else tcfg.lora) / tcfg.lora


def _matches(path: str, target: str) -> bool:
    return path == target or path.endswith("." + target)


def add_lora(model: nnx.Module, tcfg: TrainConfig, rngs: nnx.Rngs) -> list[str]:
    """Give each linear layer of ``model`` outside the head that a name of ``tcfg.lora_targets`` matches
    an adapter of rank ``tcfg.lora`` (in place). Returns the adapted layers' canonical paths.

    Raises:
        ValueError: a rank above the model's width (``model.cfg.width``), or a target name that matches
            no linear layer (naming it and the layers there are).
    """
    width = model.cfg.width
    if tcfg.lora > width:
        raise ValueError(f"lora={tcfg.lora}: expected a rank from 1 to the model's width {width}")
    targets = [t.strip() for t in tcfg.lora_targets.split(",")]
    linears = [
        (path, m)
        for path, m in nnx.iter_modules(model)
        if isinstance(m, nnx.Linear) and path and path[0] != "head" and not isinstance(m, LoRALinear)
    ]
    names = [".".join(str(k) for k in path) for path, _ in linears]
    unmatched = [t for t in targets if not any(_matches(n, t) for n in names)]
    if unmatched:
        kinds = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise ValueError(
            f"lora_targets={tcfg.lora_targets!r}: no linear layer of the model matches {', '.join(unmatched)} "
            f"(its layers end in {', '.join(kinds)}; the head is trained in full)"
        )
    done = []
    for (path, m), name in zip(linears, names, strict=True):
        if not any(_matches(name, t) for t in targets):
            continue
        parent = model
        for k in path[:-1]:
            parent = parent[k] if isinstance(k, int) else getattr(parent, k)
        adapted = LoRALinear(m, tcfg.lora, lora_scale(tcfg) * tcfg.lora, tcfg.lora_dropout, rngs)
        if isinstance(path[-1], int):
            parent[path[-1]] = adapted
        else:
            setattr(parent, path[-1], adapted)
        done.append(name)
    return done


def merge_lora(state: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """A canonical state with adapters (``{layer}.lora.lora_a`` (D_in, r), ``{layer}.lora.lora_b``
    (r, D_out), as ``vit_jax.weights.params_to_numpy`` names them) -> the plain state: each
    ``{layer}.weight`` (D_out, D_in) replaced by weight + scale (A B)^T, computed in float64 and cast to
    the weight's dtype; the adapter tensors dropped, every other tensor the same object."""
    out = {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] not in ADAPTER_LEAVES}
    for key in state:
        if not key.endswith(".lora.lora_a"):
            continue
        layer = key[: -len(".lora.lora_a")]
        a, b = (np.asarray(state[f"{layer}.lora.{n}"], np.float64) for n in ADAPTER_LEAVES)
        w = out[f"{layer}.weight"]
        out[f"{layer}.weight"] = np.ascontiguousarray((w.astype(np.float64) + scale * (a @ b).T).astype(w.dtype))
    return out
