"""LoRA fine-tuning of the torch twin through ``peft``: the JAX twin's ``vit_jax.lora`` in PyTorch.

``add_lora`` injects ``peft``'s LoRA layers (``peft.inject_adapter_in_model`` with a ``LoraConfig`` whose
``target_modules`` are the matched layers' full paths) into the linear layers outside the head that a
name of ``tcfg.lora_targets`` matches, by the JAX twin's rule (a canonical path that is the name or ends
in "." + name; the same suffix rule as peft's own). Each adapted layer computes x W + b + (alpha / r)
dropout(x) A B (peft's ``lora.Linear``: ``lora_A`` (r, D_in) and ``lora_B`` (D_out, r), the transposes of
the JAX twin's ``lora_a`` (D_in, r) and ``lora_b`` (r, D_out)). peft leaves only the adapters trainable;
the head is made trainable too, as the JAX twin trains it.

The canonical names of an adapted model are the JAX twin's (``canonical_name``): ``{layer}.weight`` and
``{layer}.bias`` for the base layer's, ``{layer}.lora.lora_a`` (D_in, r) and ``{layer}.lora.lora_b`` (r,
D_out) for the adapters, so that the twins' states and Adam moments compare name by name.
"""

from __future__ import annotations

import numpy as np
import torch

from vit_common.training.train_config import TrainConfig
from vit_torch.weights import numpy_to_tensor, tensor_to_numpy

ADAPTER = "default"  # peft's adapter name
ADAPTER_LEAVES = ("lora_a", "lora_b")  # the canonical adapter tensors' last name part (vit_jax.lora's)
# peft's parameter name -> (the JAX twin's canonical leaf, transposed)
_PEFT_LEAVES = {f"lora_A.{ADAPTER}.weight": "lora.lora_a", f"lora_B.{ADAPTER}.weight": "lora.lora_b"}


def _matches(path: str, target: str) -> bool:
    return path == target or path.endswith("." + target)


def lora_targets(model: torch.nn.Module, tcfg: TrainConfig) -> list[str]:
    """The paths of the linear layers of ``model`` outside the head that a name of ``tcfg.lora_targets``
    matches (the JAX twin's ``vit_jax.lora.add_lora`` rule), in module order.

    Raises:
        ValueError: a rank above the model's width (``model.cfg.width``), or a target name that matches
            no linear layer (naming it and the layers there are).
    """
    width = model.cfg.width
    if tcfg.lora > width:
        raise ValueError(f"lora={tcfg.lora}: expected a rank from 1 to the model's width {width}")
    targets = [t.strip() for t in tcfg.lora_targets.split(",")]
    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n and n.split(".")[0] != "head" and "lora_" not in n
    ]
    unmatched = [t for t in targets if not any(_matches(n, t) for n in names)]
    if unmatched:
        kinds = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise ValueError(
            f"lora_targets={tcfg.lora_targets!r}: no linear layer of the model matches {', '.join(unmatched)} "
            f"(its layers end in {', '.join(kinds)}; the head is trained in full)"
        )
    return [n for n in names if any(_matches(n, t) for t in targets)]


def add_lora(model: torch.nn.Module, tcfg: TrainConfig, adapters: dict[str, np.ndarray] | None = None) -> list[str]:
    """Give ``model`` (in place) peft LoRA adapters of rank ``tcfg.lora``, scale ``tcfg.lora_alpha`` / r
    (alpha defaults to r) and dropout ``tcfg.lora_dropout`` on the layers ``lora_targets`` names; only
    the adapters and the head stay trainable. ``adapters``: their starting values by canonical name
    (``{layer}.lora.lora_a`` (D_in, r), ``{layer}.lora.lora_b`` (r, D_out), e.g. the JAX twin's flax
    draws), else peft's initialisation (A Kaiming-uniform from torch's generator, B zero). Returns the
    adapted layers' paths.

    Raises:
        ModuleNotFoundError: peft is not installed (the ``lora`` extra).
        ValueError: what ``lora_targets`` raises; ``adapters`` that miss an adapted layer's tensor, hold
            one of a layer not adapted, or one of another shape.
    """
    from peft import LoraConfig, inject_adapter_in_model  # the lora extra: importing this module needs no peft

    layers = lora_targets(model, tcfg)
    alpha = tcfg.lora_alpha if tcfg.lora_alpha is not None else tcfg.lora
    config = LoraConfig(r=tcfg.lora, lora_alpha=alpha, lora_dropout=tcfg.lora_dropout, target_modules=layers)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        if name.split(".")[0] == "head":
            p.requires_grad_(True)
    if adapters is not None:
        expected = {f"{layer}.{leaf}" for layer in layers for leaf in _PEFT_LEAVES.values()}
        missing, extra = sorted(expected - set(adapters)), sorted(set(adapters) - expected)
        if missing or extra:
            raise ValueError(f"LoRA adapters: missing {missing}, not of an adapted layer {extra}")
        with torch.no_grad():
            for name, p in model.named_parameters():
                key, transposed = canonical_name(name)
                if key in adapters:
                    value = np.asarray(adapters[key]).T
                    if value.shape != tuple(p.shape):
                        raise ValueError(f"LoRA adapter {key!r}: shape {value.T.shape}, expected {tuple(p.T.shape)}")
                    p.copy_(numpy_to_tensor(value).to(p.dtype))
    return layers


def adapter_layout(name: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` of canonical tensor ``name`` in peft's layout (an adapter's transpose), or back: the same
    transposition both ways; any other tensor unchanged."""
    return arr.T if name.rsplit(".", 1)[-1] in ADAPTER_LEAVES else arr


def canonical_name(name: str) -> tuple[str, bool]:
    """(the canonical name of a parameter or buffer of a peft-adapted model, whether its tensor is the
    transpose of the canonical one): ``blocks.0.attn.qkv.base_layer.weight`` -> ``blocks.0.attn.qkv.weight``,
    ``...qkv.lora_A.default.weight`` -> ``...qkv.lora.lora_a`` (transposed); other names unchanged."""
    for leaf, canonical in _PEFT_LEAVES.items():
        if name.endswith("." + leaf):
            return name[: -len(leaf)] + canonical, True
    return name.replace(".base_layer.", "."), False


def adapted_to_numpy(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The canonical state of a (possibly peft-adapted) model: the base weights under their own names
    and the adapters as the JAX twin names and lays them out (``canonical_name``); contiguous numpy."""
    out = {}
    for name, t in model.state_dict().items():
        key, transposed = canonical_name(name)
        out[key] = np.ascontiguousarray(tensor_to_numpy(t).T if transposed else tensor_to_numpy(t))
    return out
