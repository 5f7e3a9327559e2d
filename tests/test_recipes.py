"""The optimizer recipes as data (vit_common/training/recipes.py): masks, layer numbering, the schedule in Python
floats against optax's, and the translation between recipes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from vit_common.training.recipes import RECIPES, decays, get_recipe, layer_ids, lr_factor, schedule_steps, translate
from vit_common.training.train_config import TrainConfig
from vit_jax.optim import _schedule, lr_schedule

NWD = ("pos_embed", "cls_token", "reg_token", "dist_token")  # timm VisionTransformer.no_weight_decay()


def test_big_vision_weight_decay_at_lr_1e_3_is_timm_s_0_1_and_back():
    t = translate(1e-4, 1e-3, "big_vision", "timm")
    assert t.weight_decay == pytest.approx(0.1, rel=1e-12)
    assert any("first moment stored in bfloat16" in x for x in t.lost)
    assert any("gradient clip" in x for x in t.lost)
    assert translate(t.weight_decay, 1e-3, "timm", "big_vision").weight_decay == pytest.approx(1e-4, rel=1e-12)
    assert str(t).splitlines()[0] == "big_vision weight_decay=0.0001 at lr=0.001 = timm weight_decay=0.1"


def test_translation_names_what_the_masks_do_not_share():
    lost = translate(0.05, 1e-3, "twins", "timm").lost
    assert translate(0.05, 1e-3, "twins", "timm").weight_decay == 0.05
    assert [x.split(":")[0] for x in lost] == ["dist_token", "the MAP probe attn_pool.latent", "gradient clip"]
    assert translate(0.05, 1e-3, "torch", "torch").lost == ()
    assert any(x.startswith("1-D tensors") for x in translate(0.05, 1e-3, "torch", "timm").lost)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(source="adam"), "recipe 'adam': expected one of twins, timm, torch, big_vision, optax"),
        (dict(lr=0.0), "lr=0.0: expected a finite number > 0"),
        (dict(weight_decay=float("nan")), "weight_decay=nan: expected a finite number >= 0"),
    ],
)
def test_bad_translations_are_one_line_errors(bad, match):
    args = dict(weight_decay=0.05, lr=1e-3, source="timm", target="big_vision") | bad
    with pytest.raises(ValueError, match=f"^{match}$"):
        translate(**args)


def test_each_recipe_decays_what_its_library_decays():
    cases = {  # name, rank -> decayed under twins, timm, torch, big_vision, optax
        ("blocks.0.attn.qkv.weight", 2): (True, True, True, True, True),
        ("patch_embed.proj.weight", 4): (True, True, True, True, True),
        ("blocks.0.attn.qkv.bias", 1): (False, False, True, False, True),
        ("blocks.0.ls1.gamma", 1): (False, False, True, False, True),
        ("pos_embed", 3): (False, False, True, False, True),
        ("cls_token", 3): (False, False, True, False, True),
        ("dist_token", 3): (True, False, True, False, True),
        ("attn_pool.latent", 3): (False, True, True, False, True),
    }
    for (name, ndim), want in cases.items():
        got = tuple(decays(RECIPES[r], name, ndim, NWD) for r in ("twins", "timm", "torch", "big_vision", "optax"))
        assert got == want, name
    with pytest.raises(ValueError, match="recipe 'sgd'"):
        get_recipe("sgd")


def test_layers_are_numbered_as_timm_groups_them():
    names = [
        "cls_token", "dist_token", "reg_token", "pos_embed", "patch_embed.proj.weight", "norm_pre.weight",
        "blocks.0.norm1.weight", "blocks.2.mlp.fc2.bias", "norm.weight", "fc_norm.bias", "attn_pool.latent",
        "head.weight", "head_dist.bias",
    ]  # fmt: skip
    ids = layer_ids(names, 3)
    assert [ids[n] for n in names] == [0, 0, 0, 0, 0, 0, 1, 3, 3, 4, 4, 4, 4]


@pytest.mark.slow
def test_schedule_in_python_floats_is_optax_s():
    """lr_factor (the torch twin's LambdaLR) against the JAX twin's optax schedule in float64, every step
    of a 20-step run with 5 warmup steps, and past its end."""
    warmup, decay = schedule_steps(5, 20)
    with jax.enable_x64(True):
        sched = _schedule(3e-3, warmup, decay, 0.02)
        for step in range(23):
            want = float(sched(jnp.int32(step)))
            assert 3e-3 * lr_factor(step, warmup, decay, 0.02) == pytest.approx(want, rel=1e-14, abs=1e-18), step
    assert schedule_steps(300, 10) == (9, 10)  # the warmup leaves one cosine step


@pytest.mark.parametrize("on_updates", [False, True], ids=["per epoch", "per update"])
def test_the_jax_twins_timm_schedule_is_the_python_one(on_updates):
    """timm's schedule traced in the JAX twin (vit_jax.optim.lr_schedule) against its Python floats
    (the torch twin's LambdaLR; tests/test_schedule_timm.py holds those against timm): float64 to the
    last bits, float32 to float32's rounding (of the peak rate near the end, where the cosine cancels),
    every step of 6 epochs of 3 steps with 4 warm-up steps."""
    tcfg = TrainConfig(recipe="timm", epochs=6, lr=3e-3, warmup_steps=4, sched_on_updates=on_updates)
    want = [3e-3 * tcfg.schedule(18, 3).factor(step) for step in range(20)]
    for x64, rel, tol in ((True, 1e-14, 1e-18), (False, 1e-6, 3e-3 * 1e-7)):
        with jax.enable_x64(x64):
            sched = lr_schedule(tcfg, 18, 3)
            got = [float(sched(jnp.int32(step))) for step in range(20)]
        assert got == pytest.approx(want, rel=rel, abs=tol), x64


@pytest.mark.parametrize(
    "argv",
    [
        ["train-parity", "--steps", "0"],
        ["train-parity", "--steps", "1", "--torch-recipe", "adam"],
        ["train", "--recipe", "adam"],
        ["recipes", "--translate", "big_vision", "sgd"],
    ],
)
def test_bad_command_lines_end_in_one_error_line_and_exit_2(argv, capsys):
    from vit_cli.main import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"vit {argv[0]}: error: argument --")


def test_the_translation_command_line(capsys):
    from vit_cli.main import main

    assert main(["recipes", "--translate", "big_vision", "timm", "--lr", "1e-3", "--weight-decay", "1e-4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "big_vision weight_decay=0.0001 at lr=0.001 = timm weight_decay=0.1"
    assert len(out) == 5 and all(line.startswith("  not kept: ") for line in out[1:])
