"""Twin training: the JAX step (optax) and the torch step (torch.optim) from one TrainConfig agree in every
parameter and both Adam moments, step after step, for each recipe (vit_compare/training.py).

float64 on CPU, a depth-2 width-16 model, the one input pipeline's batches; bounds from
vit_common/tolerance.py ("train" rows).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vit_common.config import ViTConfig
from vit_common.data.augment import Augment
from vit_common.data.datasets import Dataset
from vit_common.tolerance import compare
from vit_common.training.recipes import OPTAX_SCHEDULE, RECIPES, translate
from vit_common.training.train_config import TrainConfig
from vit_compare.training import compare_training, drop_path_masks, dropout_masks

# Every option of the step at once: accumulation over 2 micro-batches, a clip that triggers (the gradient
# norm is 0.8-3), label smoothing, mixup, layer-wise decay; 16 examples in batches of 8: 10 steps.
FULL = TrainConfig(
    batch_size=8, epochs=5, warmup_steps=2, lr=1e-2, weight_decay=0.05, grad_clip=0.5, accum_steps=2,
    label_smoothing=0.1, layer_decay=0.75, augment=Augment(mixup=0.8),
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tiny_cfg) -> ViTConfig:
    """The model of these tests: 2 blocks on ``tiny_dataset``'s one-channel 8x8 images, float64, drop path."""
    return tiny_cfg.replace(in_chans=1, depth=2, dtype="float64", param_dtype="float64", drop_path=0.2)


@pytest.fixture(scope="module")
def data(tiny_dataset) -> Dataset:
    return tiny_dataset()


@pytest.fixture
def f64_moment(monkeypatch):
    """big_vision's recipe with its first moment in the parameter dtype: everything but the bf16 rounding."""
    monkeypatch.setitem(RECIPES, "big_vision", dataclasses.replace(RECIPES["big_vision"], mu_dtype=None))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["twins", "timm", "torch", "optax", "big_vision"])
def test_ten_steps_of_each_recipe_agree_to_1e_10(x64, data, recipe, request, tiny):
    if recipe == "big_vision":
        request.getfixturevalue("f64_moment")
    tcfg = dataclasses.replace(FULL, recipe=recipe, grad_clip=0.4)  # below every step's norm: clipped throughout
    r = compare_training(tiny, tcfg, data, 10)
    assert r.dtype == "float64" and r.bound == ("rel", 1e-10)
    assert len(r.rows) == 10 and r.ok, r.rows[r.first_bad_step - 1]
    assert all(max(row.params, row.mu, row.nu) <= 1e-10 for row in r.rows)
    assert all(row.grad_norm[1] > tcfg.grad_clip for row in r.rows)  # the clip triggered at every step
    assert max(abs(a - b) for row in r.rows for a, b in [row.loss, row.lr]) < 1e-12
    first = 1e-5 if recipe == "timm" else 0.0  # the warm-up's start: timm's train.py --warmup-lr, else 0
    assert r.rows[-1].lr[1] > 0 and r.rows[0].lr == (first, first)


@pytest.mark.slow  # 20 s of CPU each
@pytest.mark.parametrize("name", ["vit_base_patch16_dinov3_qkvb", "eva02_base_patch14_224"])
def test_rope_backbones_train_alike_as_plain_vits_do(x64, data, name):
    """A DINOv3-shaped model (RoPE ``dinov3``, half layout, 4 registers, LayerScale, q/v biases without a
    key bias) and an EVA-02-shaped one (RoPE ``cat`` with a reference grid, split SwiGLU with its inner
    norm, fc_norm): every option of the step, 5 steps, within the float64 bound."""
    from vit_torch.timm_models import timm_model_config

    cfg = timm_model_config(name, img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, in_chans=1)
    cfg = cfg.replace(num_classes=3, dtype="float64", param_dtype="float64", drop_path=0.2)
    assert cfg.rope in ("dinov3", "cat") and not cfg.k_bias
    r = compare_training(cfg, dataclasses.replace(FULL, epochs=3), data, 5)
    assert r.dtype == "float64" and len(r.rows) == 5 and r.ok, r.rows[r.first_bad_step - 1]
    assert all(max(row.params, row.mu, row.nu) <= 1e-10 for row in r.rows)


@pytest.mark.slow
def test_big_vision_bf16_first_moment_agrees_within_the_bf16_bound(x64, data, tiny):
    """The first update uses the unrounded moment in both (optax's scale_by_adam, torch before its hook):
    step 1 agrees to 1e-10; after that the stored bf16 moments part within the bf16 bound."""
    tcfg = dataclasses.replace(FULL, recipe="big_vision", warmup_steps=0, epochs=2)
    r = compare_training(tiny, tcfg, data, 4)
    assert r.dtype == "bfloat16" and r.ok, r.rows
    assert r.rows[0].params <= 1e-10
    assert max(row.mu for row in r.rows[1:]) > 1e-4  # the rounding is real: not a float64 run


@pytest.mark.slow
def test_freeze_trains_the_head_alike_in_both_twins(x64, data, tiny):
    tcfg = dataclasses.replace(FULL, recipe="timm", init="weights", freeze=True, layer_decay=1.0, epochs=2)
    r = compare_training(tiny, tcfg, data, 3)
    assert r.ok and r.bound == ("rel", 1e-10), r.rows
    assert {r.rows[0].mu_worst, r.rows[0].nu_worst} <= {"head.weight", "head.bias"}  # moments of the head only


def test_drop_path_masks_are_the_numpy_draws_both_twins_take(tiny):
    masks = drop_path_masks(tiny, seed=0, step=3, batch_size=64)
    assert masks.shape == (64, 2, 2) and set(np.unique(masks)) == {0.0, 1.0}
    assert masks[:, 0].all()  # block 0's rate is 0 (linspace(0, 0.2, 2)), block 1 drops about 20%
    assert 0.05 < 1 - masks[:, 1].mean() < 0.4
    np.testing.assert_array_equal(masks, drop_path_masks(tiny, seed=0, step=3, batch_size=64))


@pytest.mark.slow
def test_dropout_and_attention_dropout_in_parity_mode_agree_and_a_shifted_mask_is_caught(x64, data, monkeypatch, tiny):
    """Dropout 0.2 and attention dropout 0.3 (every site: position embedding, attention probabilities,
    projection, MLP, the MAP head's MLP, head) from the same numpy masks: 3 steps within 1e-10; the torch
    twin's attention-dropout mask of block 1 rolled by one key: caught at step 1."""
    import vit_torch.train as tt

    cfg = tiny.replace(dropout=0.2, attn_dropout=0.3, pool="map", class_token=False)
    masks = dropout_masks(cfg, seed=0, step=0, batch_size=8)
    assert len(masks) == 1 + 4 * 2 + 2 + 1 and masks["blocks.1.attn.attn_drop"].shape == (8, 2, 4, 4)
    assert 0.2 < 1 - masks["blocks.1.attn.attn_drop"].mean() < 0.4 and 0.1 < 1 - masks["pos_drop"].mean() < 0.3
    tcfg = dataclasses.replace(FULL, epochs=2)
    r = compare_training(cfg, tcfg, data, 3)
    assert r.ok and all(row.worst <= 1e-10 for row in r.rows), r.rows
    step = tt.Trainer.train_step

    def shifted(self, batch, drop_masks=None, dropout_masks=None):
        key = "blocks.1.attn.attn_drop"
        return step(self, batch, drop_masks, {**dropout_masks, key: np.roll(dropout_masks[key], 1, axis=-1)})

    monkeypatch.setattr(tt.Trainer, "train_step", shifted)
    bad = compare_training(cfg, tcfg, data, 1)
    assert bad.first_bad_step == 1 and bad.rows[0].mu > 1e-3, bad.rows  # lr is 0 at step 1 (warmup): moments


@pytest.mark.slow
def test_bf16_compute_of_both_twins_stays_near_a_float64_run(x64, data, tiny):
    """bfloat16 compute (float32 parameters) in both twins against the torch twin in float64 from the same
    weights, batches and drop-path masks: the tolerance table's bound on ||twin - f64|| / ||f64||."""
    cfg = tiny.replace(dtype="bfloat16", param_dtype="float32")
    r = compare_training(cfg, dataclasses.replace(FULL, epochs=2), data, 4)
    assert r.dtype == "bfloat16" and r.bound == ("rel", 1e-2) and r.ok, r.rows
    assert r.rows[0].ref == (0.0, 0.0)  # lr 0 at step 1 (warmup): nothing moved
    assert all(1e-4 < x <= 1e-2 for row in r.rows[1:] for x in row.ref)  # bf16 rounding is there, within bound
    assert r.rows[1].params > 1e-1  # per tensor the twins part (a key bias): why the verdict is against f64


@pytest.mark.slow
def test_timm_and_big_vision_with_the_same_numbers_part_and_meet_after_translation(x64, data, f64_moment, tiny):
    """JAX big_vision vs torch timm with weight_decay=0.05 at lr=1e-2: big_vision's decay is not scaled by
    the lr, so they part at the first step that moves; with big_vision's wd translated (5e-4) they agree
    (clip and layer decay off: what the translation cannot keep, see translate().lost; one schedule, optax's,
    for both: timm's train.py schedule is another difference)."""
    base = dataclasses.replace(FULL, warmup_steps=0, grad_clip=0.0, layer_decay=1.0, epochs=1, **OPTAX_SCHEDULE)
    timm = dataclasses.replace(base, recipe="timm")
    same = compare_training(tiny, dataclasses.replace(base, recipe="big_vision"), data, 2, torch_tcfg=timm)
    assert same.first_bad_step == 1 and same.rows[0].params > 1e-4
    wd = translate(0.05, base.lr, "timm", "big_vision").weight_decay
    assert wd == pytest.approx(5e-4, rel=1e-12)
    met = compare_training(
        tiny, dataclasses.replace(base, recipe="big_vision", weight_decay=wd), data, 2, torch_tcfg=timm
    )
    assert met.ok, met.rows


@pytest.mark.slow
def test_the_verdict_is_against_how_far_the_parameters_moved(x64, data, f64_moment, tiny):
    """README's case: big_vision vs timm under a 300-step warm-up, K = 3: the learning rate stays near
    zero, so the parameters differ by little against their size (params) but by more than they moved
    (update): the twins part. The result records what was compared. Both warm up from 0 (optax's schedule:
    timm's train.py would start from 1e-5)."""
    base = dataclasses.replace(FULL, warmup_steps=300, grad_clip=0.0, layer_decay=1.0, epochs=2, **OPTAX_SCHEDULE)
    r = compare_training(
        tiny,
        dataclasses.replace(base, recipe="big_vision"),
        data,
        3,
        torch_tcfg=dataclasses.replace(base, recipe="timm"),
    )
    assert r.rows[0].update == 0.0 and r.rows[0].lr == (0.0, 0.0)  # step 1: lr 0, nothing moved
    assert r.first_bad_step == 2 and r.rows[1].update > max(1.0, 10 * r.rows[1].params)
    compared = r.to_dict()["compared"]
    assert compared["optimizer"]["jax"]["recipe"] == "big_vision" and compared["optimizer"]["torch"]["lr"] == base.lr
    assert compared["optimizer"]["torch"]["warmup_steps"] == 300 and compared["model"]["dtype"] == "float64"
    assert compared["data"]["batch_size"] == base.batch_size and compared["model"]["init"].startswith("the torch")


@pytest.mark.slow
def test_a_wrong_optimizer_setting_on_one_side_is_caught_at_step_1(x64, data, tiny):
    tcfg = dataclasses.replace(FULL, warmup_steps=0, epochs=1)
    r = compare_training(tiny, tcfg, data, 1, torch_tcfg=dataclasses.replace(tcfg, b1=0.95))
    assert r.first_bad_step == 1 and r.rows[0].mu > 1e-3


def test_bad_requests_are_refused(data, tiny):
    with pytest.raises(ValueError, match="steps=0: expected 1 <= K <= 10"):
        compare_training(tiny.replace(dtype="float32", param_dtype="float32"), FULL, data, 0)
    with pytest.raises(ValueError, match=r"differ in \['batch_size'\]"):
        compare_training(tiny, FULL, data, 1, torch_tcfg=dataclasses.replace(FULL, batch_size=4))


@pytest.mark.slow
def test_the_command_reports_every_step_and_exits_1_where_the_twins_part(npz, tmp_path, capsys):
    """`vit train-parity`: float64, dropout and attention dropout (parity mode), the torch twin with another
    weight decay: JSON of both steps, a plot, the verdict on stdout, exit code 1; the parting shows at step
    1 in a decayed kernel."""
    from vit_cli.main import main

    argv = ["train-parity", "--steps", "2", "--dataset", f"npz:{npz}", "--image-size", "8", "--patch-size", "4"]
    argv += ["--width", "16", "--depth", "1", "--num-heads", "2", "--mlp-dim", "32", "--batch-size", "8"]
    argv += ["--epochs", "1", "--warmup-steps", "0", "--torch-weight-decay", "0.5"]
    argv += ["--dropout", "0.1", "--attn-dropout", "0.1"]
    argv += ["--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert (
        "JAX (twins) vs torch (twins), float64; the verdict holds update to rel 1e-08" in out
        and "the twins part at step 1" in out
    )
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] is False and report["first_bad_step"] == 1 and len(report["steps"]) == 2
    assert report["steps"][0]["params_worst"].endswith(".weight") and report["steps"][0]["nu"] < 1e-10
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.png"]  # nothing else left beside them


@pytest.mark.slow
def test_train_parity_starts_from_the_users_checkpoint(npz, tmp_path, tiny_cfg, capsys):
    """`vit train-parity --init FILE`: both twins start from the file's weights (here a timm state_dict of 5
    classes: the 3-class dataset gets a new zero head, as vit train --init gives it); model flags the file
    decides are refused."""
    import json

    import timm
    from safetensors.torch import save_file

    from vit_cli.main import main

    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2,
        in_chans=1, num_classes=5,
    )  # fmt: skip
    save_file(model.state_dict(), str(tmp_path / "ft.safetensors"))
    argv = ["train-parity", "--steps", "2", "--dataset", f"npz:{npz}", "--init", str(tmp_path / "ft.safetensors")]
    argv += ["--set", "num_heads=2", "--source-image-size", "8", "--batch-size", "8", "--warmup-steps", "0"]
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] and report["compared"]["model"]["init"] == f"{tmp_path / 'ft.safetensors'} (timm)"
    assert report["compared"]["model"]["num_classes"] == 3 and report["compared"]["model"]["width"] == 16
    assert "weights: " + str(tmp_path / "ft.safetensors") in capsys.readouterr().out
    assert main([*argv, "--width", "32"]) == 2
    assert "--width: --init" in capsys.readouterr().err


@pytest.mark.slow  # 12 s of CPU
def test_train_parity_runs_a_rope_backbone_from_a_timm_hub_folder(npz, tmp_path, capsys):
    """`vit train-parity --init` on a timm DINOv3 hub folder (RoPE ``dinov3``, q/v biases, registers,
    LayerScale; its own 3-class head, so every block's gradient flows from step 1): float64, both steps
    within the bound, the RoPE model and where its weights came from recorded in the JSON."""
    import json

    import timm
    import torch

    from vit_cli.main import main

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_base_patch16_dinov3_qkvb", pretrained=False, img_size=8, patch_size=4, embed_dim=16, depth=1,
        num_heads=2, in_chans=1, num_classes=3,
    ).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # LayerScale off timm's 1e-5, so the blocks matter
    timm.models.save_for_hf(model, tmp_path / "dino", safe_serialization=True)
    argv = ["train-parity", "--steps", "2", "--dataset", f"npz:{npz}", "--init", str(tmp_path / "dino")]
    assert main([*argv, "--batch-size", "8", "--warmup-steps", "0", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "3 classes, RoPE dinov3, 3,731 parameters, float64; weights: " in out and "verdict: ok" in out
    report = json.loads((tmp_path / "r.json").read_text())
    model_d = report["compared"]["model"]
    assert report["ok"] and report["first_bad_step"] is None and report["bound"] == {"kind": "rel", "value": 1e-10}
    assert (model_d["rope"], model_d["pool"], model_d["parameters"]) == ("dinov3", "gap", 3731)
    assert model_d["init"] == f"{tmp_path / 'dino'} (timm)" and model_d["dtype"] == "float64"
    assert [row["step"] for row in report["steps"]] == [1, 2]
    for row in report["steps"]:  # measured: params 8e-16, moments 1.4e-15, update 7.6e-14
        assert max(row["params"], row["mu"], row["nu"]) <= 1e-10 and row["update"] <= report["update_bound"], row
        assert row["loss"][0] == pytest.approx(row["loss"][1], rel=1e-10) and row["grad_norm"][0] > 0


@pytest.mark.slow
def test_adam_state_crosses_frameworks_k_torch_then_k_jax_equals_2k_jax(x64, data, tiny):
    """Optimizer state by canonical names: 3 torch steps, then the JAX twin continues from torch's weights,
    moments and step for 3 more = 6 JAX steps; and 3 JAX steps continued by torch = 6 torch steps."""
    import vit_jax.trainer as jt
    import vit_torch.train as tt
    from vit_jax.optimizer_state import adam_state, train_state

    k, tcfg = 3, dataclasses.replace(FULL, recipe="timm", epochs=3)
    torch_run = tt.Trainer(tiny, tcfg, data)
    w0 = torch_run.weights()
    jax_run = jt.Trainer(tiny, tcfg, data, weights=w0)
    it = jax_run.train_iterator()
    batches = [{**next(it), "drop_masks": drop_path_masks(tiny, tcfg.seed, s, tcfg.batch_size)} for s in range(2 * k)]
    it.close()
    step = lambda trainer, state, b: trainer.train_step(state, b)[0]  # noqa: E731
    state = jax_run.init_state()
    for b in batches[:k]:
        state = step(jax_run, state, b)
    half = jax_run.weights(state), adam_state(state["opt_state"])
    for b in batches[k:]:
        state = step(jax_run, state, b)
    jax_2k = jax_run.weights(state), adam_state(state["opt_state"])
    for b in batches[:k]:
        torch_run.train_step(b, b["drop_masks"])
    cont = train_state(jax_run, torch_run.weights(), torch_run.adam_state())
    for b in batches[k:]:
        cont = step(jax_run, cont, b)
    torch_then_jax = jax_run.weights(cont), adam_state(cont["opt_state"])
    torch_cont = tt.Trainer(tiny, tcfg, data, weights=half[0])
    torch_cont.load_adam_state(half[1])
    for b in batches[k:]:
        torch_run.train_step(b, b["drop_masks"])
        torch_cont.train_step(b, b["drop_masks"])
    torch_2k = torch_run.weights(), torch_run.adam_state()
    jax_then_torch = torch_cont.weights(), torch_cont.adam_state()
    assert torch_then_jax[1]["count"] == jax_2k[1]["count"] == jax_then_torch[1]["count"] == 2 * k
    for (w, m), (w_ref, m_ref) in [(torch_then_jax, jax_2k), (jax_then_torch, torch_2k)]:
        for table, ref in [(w, w_ref), (m["mu"], m_ref["mu"]), (m["nu"], m_ref["nu"])]:
            for name in ref:
                c = compare(name, table[name], ref[name], "train", "float64")
                assert c.ok, c
    with pytest.raises(ValueError, match=r"missing \['head.bias'\]"):
        torch_cont.load_adam_state({**half[1], "mu": {n: v for n, v in half[1]["mu"].items() if n != "head.bias"}})


@pytest.mark.slow
def test_the_twins_moving_averages_agree_to_the_float64_bound_and_a_wrong_decay_shows(x64, data, tiny):
    """--ema with a warm-up in both twins (optax.incremental_update in the jitted step against the torch
    twin's ModelEma): every step's EMA within 1e-10; a torch twin with another decay agrees at step 1 (the
    first update is a copy in both) and parts in the EMA alone at step 2."""
    knobs = dict(ema=0.8, ema_warmup=True, ema_warmup_gamma=2.0, ema_warmup_power=0.8, ema_min_decay=0.3)
    tcfg = dataclasses.replace(FULL, recipe="timm", epochs=3, **knobs)
    r = compare_training(tiny, tcfg, data, 6)
    assert r.ok and r.has_ema and all(row.ema <= 1e-10 and row.ema_worst for row in r.rows), r.rows
    plain = dataclasses.replace(tcfg, ema_warmup=False, epochs=1)
    other = compare_training(tiny, plain, data, 2, torch_tcfg=dataclasses.replace(plain, ema=0.5))
    assert other.first_bad_step == 2 and other.rows[0].ema <= 1e-10, other.rows
    assert other.rows[1].ema > 1e-3 and other.rows[1].params <= 1e-10
    with pytest.raises(ValueError, match=r"ema=0.8 \(JAX\) and None \(torch\): an EMA in both twins or in neither"):
        compare_training(tiny, tcfg, data, 1, torch_tcfg=dataclasses.replace(tcfg, ema=None, ema_warmup=False))
