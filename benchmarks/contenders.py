"""The timed contenders: one inference call or one training step of a model, ready to repeat.

A contender name is one of ``CONTENDERS``; ``vit_jax`` takes the attention kernel the model chooses for
the platform (``vit_jax.platforms.choose_attention``), ``vit_jax@xla`` / ``vit_jax@cudnn`` force one
(``cfg.attn_backend``); ``vit_torch_compile`` and ``timm_compile`` are those models under
``torch.compile`` (default mode, inductor), compiled by their first call. Each builder returns a
``Contender`` whose ``run(n)`` performs n calls and then waits for the device (``block_until_ready`` /
``torch.cuda.synchronize``), so wall time around it is the time of the work.

Modes: 'infer' is a forward pass without gradients (eval mode); 'train' is forward, cross-entropy
loss, backward and an AdamW update (lr 1e-3, weight decay 0.05, the other AdamW constants at the
shared defaults of optax and torch), with the model in training mode.

Variants: a ``ViTConfig.VARIANTS`` name (``B/16``), or ``dinov3-ROW/P``: the block choices of timm's
``vit_base_patch16_dinov3`` (RoPE ``dinov3``, 4 registers, LayerScale, average pooling; read off timm's
own model, ``variant_config``) at the width, depth and heads of row ROW and patch size P. timm's contender
of a RoPE config is its ``Eva`` (``vit_torch.oracles.timm_model``); Hugging Face's ``ViT`` cannot hold one.

Dtypes: 'float32' everywhere. 'bfloat16' (or 'float16'): inference stores the parameters in that
dtype too; training keeps float32 parameters and computes in the low dtype (the twins through
``cfg.dtype``, timm and HF through ``torch.autocast``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import vit_common.state
from vit_common.config import ViTConfig

ROPE_FAMILIES = {"dinov3": "vit_base_patch16_dinov3"}  # variant prefix -> the timm model giving its choices
CONTENDERS = ("vit_jax", "vit_torch", "vit_torch_compile", "timm", "timm_compile", "hf")
MODES = ("infer", "train")
LR, WEIGHT_DECAY = 1e-3, 0.05


@dataclass
class Contender:
    """``run(n)`` performs n calls and syncs; ``memory`` is peak/footprint bytes where reported."""

    name: str
    framework: str  # 'jax' | 'torch'
    run: Callable[[int], None]
    memory_bytes: int | None = None
    memory_kind: str | None = None  # how memory_bytes was obtained


def model_config(cfg: ViTConfig, mode: str, dtype: str) -> ViTConfig:
    """The twins' config for a benchmark: compute dtype, and parameter dtype by the rule above."""
    low = dtype != "float32"
    return cfg.replace(dtype=dtype, param_dtype=dtype if (low and mode == "infer") else "float32")


def variant_config(name: str, **overrides) -> ViTConfig:
    """The config of benchmark variant ``name`` (see module doc) with keyword overrides (e.g. image_size).

    Raises:
        ValueError: an unknown variant row or family prefix, or overrides ViTConfig refuses (named).
    """
    family, sep, rest = name.rpartition("-")
    if not sep:
        return ViTConfig.from_name(name, **overrides)
    if family not in ROPE_FAMILIES:
        raise ValueError(f"variant {name!r}: unknown family {family!r}; known: {', '.join(ROPE_FAMILIES)}")
    from vit_torch.timm_models import timm_model_config

    shape = ViTConfig.from_name(rest)
    base = timm_model_config(ROPE_FAMILIES[family])
    keep = ("width", "depth", "num_heads", "mlp_dim", "patch_size")
    return base.replace(**{k: getattr(shape, k) for k in keep} | {"image_size": shape.image_size} | overrides)


def random_state(cfg: ViTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Canonical float32 weights for timing: ``vit_common.state.random_state`` at normal(0, 0.02),
    LayerNorm weights 1.

    Drawn in numpy, so neither twin compiles its random initialisers (tens of seconds of XLA
    compilation on a small CPU); the values do not change the work.
    """
    return {
        name: np.ones_like(value) if "norm" in name and name.endswith(".weight") else value
        for name, value in vit_common.state.random_state(cfg, seed=seed, scale=0.02).items()
    }


def inputs(cfg: ViTConfig, batch: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The same standard-normal images [B, C, H, W] (float32) and integer labels [B] for every contender."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((batch, cfg.in_chans, *cfg.image_size), np.float32)
    return images, rng.integers(0, max(cfg.num_classes, 1), batch)


def check(name: str, mode: str) -> None:
    """Raise ValueError naming ``name`` or ``mode`` if it is not a known contender or mode."""
    base, _, backend = name.partition("@")
    if base not in CONTENDERS or (backend and (base != "vit_jax" or backend not in ("xla", "cudnn"))):
        raise ValueError(f"contender {name!r}: expected one of {CONTENDERS}, or vit_jax@xla, vit_jax@cudnn")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {MODES}")


def build(name: str, cfg: ViTConfig, mode: str, batch: int, dtype: str, compile_backend: str = "inductor") -> Contender:
    """Build contender ``name`` (see module doc) for ``mode`` at ``batch`` images and ``dtype``.

    ``compile_backend``: the ``torch.compile`` backend of the ``*_compile`` contenders ('eager' checks
    the wiring without inductor's compile time).

    Raises:
        ValueError: unknown contender or mode, or a config the peer cannot express.
    """
    check(name, mode)
    base, _, backend = name.partition("@")
    if base == "vit_jax":
        return _jax(name, model_config(cfg, mode, dtype).replace(attn_backend=backend or None), mode, batch)
    return _torch(name, base, cfg, mode, batch, dtype, compile_backend)


def jax_program(model, mode: str) -> tuple[Callable, list]:
    """The jitted program a ``vit_jax`` contender times, and its state arguments (before the batch).

    'infer': ``fn(state, x) -> logits``, model in eval mode. 'train': ``fn(params, opt_state, x, y) ->
    (params, opt_state, loss)``, model in training mode, params and opt_state donated. Works on an
    abstract model (``nnx.eval_shape``) too: the state is then ``jax.ShapeDtypeStruct`` leaves.
    """
    import jax
    import optax
    from flax import nnx

    if mode == "infer":
        model.eval()
        graphdef, state = nnx.split(model)
        return jax.jit(lambda state, x: nnx.merge(graphdef, state)(x)), [state]
    model.train()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)

    def loss_fn(params, x, y):
        logits = nnx.merge(graphdef, params, rest)(x).astype("float32")
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    abstract = all(isinstance(v, jax.ShapeDtypeStruct) for v in jax.tree.leaves(params))
    return step, [params, jax.eval_shape(tx.init, params) if abstract else tx.init(params)]


def memory_footprint(compiled) -> int | None:
    """Arguments + outputs - aliased (donated) + temporaries, from XLA's memory analysis (bytes)."""
    mem = compiled.memory_analysis()
    if mem is None:
        return None
    return mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes


def _jax(name: str, cfg: ViTConfig, mode: str, batch: int) -> Contender:
    import jax

    from vit_jax.weights import from_numpy

    images, labels = inputs(cfg, batch)
    x = jax.device_put(images.transpose(0, 2, 3, 1).astype(cfg.dtype))  # [B, H, W, C]
    y = jax.device_put(labels)
    fn, carry = jax_program(from_numpy(cfg, random_state(cfg)), mode)
    if mode == "infer":
        compiled = fn.lower(*carry, x).compile()

        def run(n: int) -> None:
            for _ in range(n):
                out = compiled(*carry, x)
            out.block_until_ready()
    else:
        compiled = fn.lower(*carry, x, y).compile()

        def run(n: int) -> None:
            for _ in range(n):
                carry[0], carry[1], loss = compiled(*carry, x, y)
            loss.block_until_ready()

    footprint = memory_footprint(compiled)
    return Contender(name, "jax", run, footprint, "xla memory_analysis (arguments + outputs + temps)")


def _torch_model(base: str, cfg: ViTConfig, mode: str, dtype: str):
    """The torch module for contender ``base`` and whether it needs autocast for ``dtype``."""
    import torch

    from benchmarks.peers import peer_config

    if base in ("vit_torch", "vit_torch_compile"):
        from vit_torch.weights import from_numpy

        twin_cfg = model_config(cfg, mode, dtype)
        return from_numpy(twin_cfg, random_state(twin_cfg)), False
    param_dtype = torch.float32 if mode == "train" else getattr(torch, dtype)
    if base in ("timm", "timm_compile"):
        from timm.models.vision_transformer import VisionTransformer

        from vit_common.checkpoints.formats.timm_eva import is_eva
        from vit_torch.oracles import timm_model

        if is_eva(cfg):  # timm's own initialisation: the values do not change the work
            model = timm_model(cfg)
        else:
            model = VisionTransformer(**peer_config(cfg, "timm"))
    else:
        import transformers

        model = transformers.ViTForImageClassification(transformers.ViTConfig(**peer_config(cfg, "hf")))
    return model.to(param_dtype), mode == "train" and dtype != "float32"


def _torch(name: str, base: str, cfg: ViTConfig, mode: str, batch: int, dtype: str, compile_backend: str) -> Contender:
    import contextlib

    import torch
    import torch.nn.functional as F

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_bytes = torch.cuda.memory_allocated()
    model, autocast = _torch_model(base, cfg, mode, dtype)
    model = model.to(device).train(mode == "train")
    images, labels = inputs(cfg, batch)
    x_dtype = torch.float32 if mode == "train" else getattr(torch, dtype)
    x = torch.from_numpy(images).to(device, x_dtype)  # [B, C, H, W]
    y = torch.from_numpy(labels).to(device)
    hf = base == "hf"
    forward = torch.compile(model, backend=compile_backend) if base.endswith("_compile") else model
    amp = torch.autocast(device.type, dtype=getattr(torch, dtype)) if autocast else contextlib.nullcontext()

    def logits() -> torch.Tensor:
        with amp:
            out = forward(pixel_values=x) if hf else forward(x)
        return out.logits if hf else out

    if mode == "infer":

        def call() -> None:
            with torch.inference_mode():
                logits()
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, fused=True)

        def call() -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(logits().float(), y).backward()
            opt.step()

    def run(n: int) -> None:
        for _ in range(n):
            call()
        if cuda:
            torch.cuda.synchronize()

    run(1)  # first call: compile (torch.compile), allocate optimizer state; measured for memory
    mem = torch.cuda.max_memory_allocated() - base_bytes if cuda else None
    return Contender(name, "torch", run, mem, "torch.cuda.max_memory_allocated (model, state, step)" if cuda else None)
