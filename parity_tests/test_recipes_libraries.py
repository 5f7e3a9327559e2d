"""Each recipe's optimizer against the library that defines it: timm's parameter groups and optimizer
(timm/optim/_param_groups.py, timm/optim/_optim_factory.py), torch.optim.AdamW, optax.adamw, and the
chain big_vision/optax.py builds. One update of a tiny model, float64."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

import vit_jax.optim as jo
import vit_torch
import vit_torch.train as tt
from vit_common.config import ViTConfig
from vit_common.data.augment import Augment
from vit_common.training.train_config import TrainConfig
from vit_jax.model import VisionTransformer
from vit_jax.weights import _canonical_name, params_to_numpy
from vit_jax.weights import from_numpy as jax_from_numpy
from vit_torch.oracles import timm_model

# A stem with every kind of token and norm_pre; DeiT's distilled model; MAP pooling with fc_norm-free head:
# the fields each sets on the tiny model (the ``models`` fixture).
MODELS = {
    "reg_norm_pre": dict(reg_tokens=2, norm_pre=True, patch_bias=False, posemb_prefix=False),
    "deit_distilled": dict(dist_token=True, head_dist=True),
    "map": dict(pool="map", class_token=False),
}
TCFG = TrainConfig(batch_size=8, epochs=1, warmup_steps=0, lr=1e-2, weight_decay=0.05, grad_clip=0.0, augment=Augment())


@pytest.fixture(scope="module")
def models(tiny_cfg) -> dict[str, ViTConfig]:
    """``MODELS`` on the tiny model with 3 blocks, one channel and float64."""
    base = tiny_cfg.replace(in_chans=1, depth=3, dtype="float64", param_dtype="float64")
    return {name: base.replace(**fields) for name, fields in MODELS.items()}


def _state(cfg: ViTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    return vit_torch.to_numpy(vit_torch.VisionTransformer(cfg))


def _grads(state: dict[str, np.ndarray], seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v.shape) for k, v in state.items()}


def _groups(optimizer) -> dict[str, tuple[float, float]]:
    """{parameter name: (lr_scale, weight_decay)} of a torch optimizer whose groups hold ``names``."""
    return {n: (g.get("lr_scale", 1.0), g["weight_decay"]) for g in optimizer.param_groups for n in g["names"]}


@pytest.mark.slow
@pytest.mark.parametrize("layer_decay", [1.0, 0.75])
@pytest.mark.parametrize("model", list(MODELS))
def test_timm_recipe_groups_are_timm_s(model, layer_decay, models):
    """Our groups (torch twin) and our JAX layer numbering against timm's param_groups_weight_decay /
    param_groups_layer_decay on timm's own model with the model's no_weight_decay()."""
    from timm.optim import param_groups_layer_decay, param_groups_weight_decay

    cfg = models[model]
    state = _state(cfg)
    ref = timm_model(cfg, state)
    nwd = ref.no_weight_decay()
    if layer_decay == 1:
        groups = param_groups_weight_decay(ref, 0.05, no_weight_decay_list=nwd)
    else:
        groups = param_groups_layer_decay(ref, 0.05, no_weight_decay_list=nwd, layer_decay=layer_decay)
    by_id = {id(p): n for n, p in ref.named_parameters()}
    want = {by_id[id(p)]: (g.get("lr_scale", 1.0), g["weight_decay"]) for g in groups for p in g["params"]}
    twin = vit_torch.from_numpy(cfg, state)
    assert twin.no_weight_decay() >= nwd
    tcfg = dataclasses.replace(TCFG, recipe="timm", layer_decay=layer_decay)
    got = _groups(tt.make_optimizer(twin, tcfg, 10)[0])
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-15), name
    if layer_decay != 1:  # the JAX twin numbers its parameters the same way
        abstract = nnx.eval_shape(
            lambda: VisionTransformer(cfg.replace(dtype="float32", param_dtype="float32"), rngs=nnx.Rngs(0))
        )
        _, params, _ = nnx.split(abstract, nnx.Param, ...)
        ids = jo.layer_ids(params, cfg.depth)
        top = max(jax.tree.leaves(ids))
        for path, v in nnx.to_flat_state(ids):
            name = _canonical_name(tuple(map(str, path)))[0]
            assert layer_decay ** (top - int(v.get_value())) == pytest.approx(want[name][0], rel=1e-15), name


def _torch_step(model: torch.nn.Module, optimizer, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for n, p in model.named_parameters():
        p.grad = torch.from_numpy(grads[n].copy())
    optimizer.step()
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("recipe", ["timm", "torch"])
def test_torch_recipes_step_as_timm_s_and_torch_s_own_optimizer(recipe, models):
    """One step of our torch twin's optimizer against timm's create_optimizer_v2 on timm's model (lr_scale
    applied as timm's scheduler does) or a bare torch.optim.AdamW(model.parameters())."""
    from timm.optim import create_optimizer_v2

    cfg = models["deit_distilled"]
    state, grads = _state(cfg), _grads(_state(cfg))
    tcfg = dataclasses.replace(TCFG, recipe=recipe, layer_decay=0.75 if recipe == "timm" else 1.0)
    twin = vit_torch.from_numpy(cfg, state)
    got = _torch_step(twin, tt.make_optimizer(twin, tcfg, 10)[0], grads)
    if recipe == "timm":
        ref = timm_model(cfg).double()  # float64 first, then the state: no float32 rounding on the way
        ref.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
        opt = create_optimizer_v2(ref, "adamw", lr=tcfg.lr, weight_decay=tcfg.weight_decay, layer_decay=0.75)
        for g in opt.param_groups:  # timm/scheduler/scheduler.py: lr = value * param_group["lr_scale"]
            g["lr"] = tcfg.lr * g.get("lr_scale", 1.0)
    else:
        ref = vit_torch.from_numpy(cfg, state)
        opt = torch.optim.AdamW(ref.parameters(), lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    want = _torch_step(ref, opt, grads)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-14, atol=1e-17, err_msg=name)
    moved = [n for n in want if not np.array_equal(want[n], state[n])]
    assert len(moved) == len(want)


def _jax_update(cfg: ViTConfig, tx, state, grads) -> dict[str, np.ndarray]:
    """The canonical parameters after one update of ``tx`` on the JAX twin holding ``state``."""
    _, params, _ = nnx.split(jax_from_numpy(cfg, state), nnx.Param, ...)
    g = jax.tree_util.tree_map_with_path(lambda p, x: jnp.asarray(_jax_layout(grads, p, x)), params)
    updates, _ = jax.jit(tx.update)(g, jax.jit(tx.init)(params), params)  # one compile, not one per op
    return params_to_numpy(cfg, optax.apply_updates(params, updates))


def _jax_layout(grads, path, leaf):
    keys = tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
    name, kind = _canonical_name(keys)
    g = grads[name]
    if kind == "kernel":
        g = g.T if g.ndim == 2 else g.transpose(2, 3, 1, 0)
    return g.reshape(leaf.shape)


def _flax_path(path) -> str:
    return "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["optax", "big_vision"])
def test_jax_recipes_update_as_optax_adamw_and_big_vision_s_chain(x64, recipe, models):
    """One update of our JAX optimizer against ``optax.adamw`` (mask None) or the chain of
    big_vision/optax.py ``make``: clip_by_global_norm, scale_by_adam(mu_dtype=bfloat16), scale(lr),
    add_decayed_weights(wd, '.*/kernel$'), scale_by_schedule, scale(-1)."""
    cfg = models["map"]
    state, grads = _state(cfg), _grads(_state(cfg))
    tcfg = dataclasses.replace(TCFG, recipe=recipe, grad_clip=1.0, weight_decay=0.05 if recipe == "optax" else 1e-3)
    ours, _ = jo.make_optimizer(tcfg, 10, cfg.depth, no_weight_decay=frozenset(["pos_embed", "cls_token"]))
    got = _jax_update(cfg, ours, state, grads)
    unit = optax.warmup_cosine_decay_schedule(0.0, 1.0, 0, 10, end_value=tcfg.min_lr_ratio)
    sched = lambda c: unit(jnp.asarray(c, jnp.float64))  # noqa: E731  (optax counts in float32 otherwise)
    if recipe == "optax":
        ref = optax.chain(
            optax.clip_by_global_norm(1.0),
            optax.adamw(lambda c: tcfg.lr * sched(c), weight_decay=tcfg.weight_decay),
        )
    else:
        kernels = lambda p: jax.tree_util.tree_map_with_path(  # noqa: E731
            lambda q, _: re.fullmatch(".*/kernel$", _flax_path(q)) is not None, p
        )
        ref = optax.chain(
            optax.clip_by_global_norm(1.0),
            optax.scale_by_adam(mu_dtype=jnp.bfloat16),
            optax.scale(tcfg.lr),
            optax.add_decayed_weights(tcfg.weight_decay, kernels),
            optax.scale_by_schedule(sched),
            optax.scale(-1.0),
        )
    want = _jax_update(cfg, ref, state, grads)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-13, atol=1e-17, err_msg=name)
    assert not np.array_equal(want["attn_pool.latent"], state["attn_pool.latent"])


@pytest.mark.parametrize("kwargs", [dict(weight_decay=0.05, layer_decay=0.75), dict(weight_decay=0.05), {}])
@pytest.mark.parametrize("model", list(MODELS))
def test_timm_param_groups_give_create_optimizer_v2_s_order(model, kwargs, models):
    """vit_common.training.recipes.timm_param_groups: the names of timm's own optimizer groups, in order (what
    maps a timm checkpoint's optimizer state, numbered through its groups, back to names)."""
    from timm.optim import create_optimizer_v2

    from vit_common.training.recipes import timm_param_groups

    ref = timm_model(models[model])
    opt = create_optimizer_v2(ref, "adamw", lr=1e-3, **kwargs)
    name_of = {id(p): n for n, p in ref.named_parameters()}
    want = [[name_of[id(p)] for p in g["params"]] for g in opt.param_groups]
    params = [(n, p.ndim) for n, p in ref.named_parameters()]
    got = timm_param_groups(params, kwargs.get("weight_decay", 0.0), kwargs.get("layer_decay"))
    assert got == want and len(want) > (1 if kwargs else 0)
