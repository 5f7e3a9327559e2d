"""`vit train --init-optimizer`: a timm training checkpoint's AdamW state continued by the JAX twin.

The checkpoint is written by timm itself: a timm ViT trained 3 steps with ``timm.optim.create_optimizer_v2``
(layer-wise decay 0.75, weight decay 0.05) and saved by ``timm.utils.CheckpointSaver`` with an EMA
(``state_dict``, ``state_dict_ema``, ``optimizer``, ``args``, as timm's train.py). One JAX step from it
(``vit_torch.formats.read_timm_optimizer`` -> ``vit_jax.trainer.Trainer(moments=)``, what ``vit train``
calls) equals one more torch step of timm's optimizer on the same batch, float64, within the tolerance
table's "train" bound (1e-10).
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vit_jax.trainer as jt
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.source import training_weights_entry, weights_entry
from vit_common.config import ViTConfig
from vit_common.data.augment import Augment
from vit_common.data.datasets import Dataset
from vit_common.tolerance import compare
from vit_common.training.train_config import TrainConfig
from vit_jax.optimizer_state import adam_state, check_moments
from vit_torch.formats import SAFE_GLOBALS, read_timm_optimizer, read_torch_file
from vit_torch.oracles import timm_model

TCFG = TrainConfig(
    batch_size=8, epochs=2, warmup_steps=0, lr=1e-2, weight_decay=0.05, recipe="timm", layer_decay=0.75,
    label_smoothing=0.0, grad_clip=0.0, augment=Augment(),
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tiny_cfg) -> ViTConfig:
    """The model of these tests: 2 blocks on ``tiny_dataset``'s one-channel 8x8 images, float64."""
    return tiny_cfg.replace(in_chans=1, depth=2, dtype="float64", param_dtype="float64")


@pytest.fixture(scope="module")
def data(tiny_dataset) -> Dataset:
    return tiny_dataset()


def _torch_step(model, opt, batch) -> None:
    images = torch.from_numpy(np.array(batch["image"])).permute(0, 3, 1, 2).double()
    loss = F.cross_entropy(model(images), torch.from_numpy(np.array(batch["target"])).double())
    opt.zero_grad()
    loss.backward()
    opt.step()


@pytest.fixture(scope="module")
def run(data, tmp_path_factory, tiny):
    """(checkpoint path, timm model and optimizer after one more step, the JAX run's first batch)."""
    from timm.optim import create_optimizer_v2
    from timm.utils import CheckpointSaver, ModelEmaV3

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = timm_model(tiny).double()
    with jax.enable_x64(True):
        trainer = jt.Trainer(tiny, TCFG, data)
        it = trainer.train_iterator()
        batches = [next(it) for _ in range(3)]
        it.close()
        trainer.close()
    opt = create_optimizer_v2(model, "adamw", lr=TCFG.lr, weight_decay=TCFG.weight_decay, layer_decay=0.75)
    for g in opt.param_groups:  # timm/scheduler/scheduler.py: lr = value * param_group["lr_scale"]
        g["lr"] = TCFG.lr * g["lr_scale"]
    ema = ModelEmaV3(model, decay=0.5)
    for b in batches:
        _torch_step(model, opt, b)
        ema.update(model)
    args = argparse.Namespace(model="vit_tiny_test", opt="adamw", lr=TCFG.lr, weight_decay=0.05, layer_decay=0.75)
    folder = tmp_path_factory.mktemp("timm_run")
    saver = CheckpointSaver(model, opt, args=args, model_ema=ema, checkpoint_dir=str(folder), recovery_dir=str(folder))
    saver.save_checkpoint(epoch=0, metric=0.0)
    _torch_step(model, opt, batches[0])  # the JAX run's first batch: a new run's data starts at its step 0
    return folder / "last.pth.tar", model, opt, batches[0]


@pytest.mark.slow
def test_one_jax_step_from_a_timm_checkpoint_equals_one_more_torch_step(x64, data, run, tiny):
    path, model, opt, batch = run
    with weights_entry(training_weights_entry(None)):  # what vit train --init-optimizer reads
        weights, dropped = read_torch_file(path)
    assert {k for k, _ in dropped} >= {"state_dict_ema", "optimizer", "args"}
    moments = read_timm_optimizer(path)
    assert moments["count"] == 3 and moments["mu"].keys() == weights.keys()
    check_moments(moments, weights)
    trainer = jt.Trainer(tiny, TCFG, data, weights=weights, moments=moments)
    state, metrics = trainer.train_step(trainer.init_state(), batch)
    assert float(metrics["lr"]) == TCFG.lr  # the new run's schedule from its step 0
    got, got_moments = trainer.weights(state), adam_state(state["opt_state"])
    trainer.close()
    assert got_moments["count"] == 4
    named = dict(model.named_parameters())
    want_mu = {n: opt.state[p]["exp_avg"].detach().numpy() for n, p in named.items()}
    want_nu = {n: opt.state[p]["exp_avg_sq"].detach().numpy() for n, p in named.items()}
    moved = 0
    for name, p in named.items():
        for a, b in [(got[name], p.detach().numpy()), (got_moments["mu"][name], want_mu[name])]:
            c = compare(name, a, b, "train", "float64")
            assert c.ok, c
        assert compare(name, got_moments["nu"][name], want_nu[name], "train", "float64").ok
        moved += not np.array_equal(weights[name], got[name])
    assert moved == len(named)


def test_a_checkpoint_whose_optimizer_state_does_not_fit_is_refused(run, tmp_path):
    path, *_ = run
    with torch.serialization.safe_globals(SAFE_GLOBALS):
        ckpt = torch.load(path, weights_only=True)
    bad = tmp_path / "bad.pth.tar"
    shape = {**ckpt, "optimizer": {**ckpt["optimizer"], "state": dict(ckpt["optimizer"]["state"])}}
    shape["optimizer"]["state"][0] = {**shape["optimizer"]["state"][0]}
    shape["optimizer"]["state"][0]["exp_avg"] = torch.zeros(5)
    torch.save(shape, bad)
    with pytest.raises(FormatError, match=r"optimizer exp_avg of '\S+' has shape \(5,\), the parameter"):
        read_timm_optimizer(bad)
    fewer = {**ckpt, "state_dict": {k: v for k, v in ckpt["state_dict"].items() if k != "head.bias"}}
    torch.save(fewer, bad)
    with pytest.raises(FormatError, match=r"parameter groups hold \[.*\] tensors; the \d+ tensors of 'state_dict'"):
        read_timm_optimizer(bad)
    moments = read_timm_optimizer(path)
    head = {n: np.zeros((5, 16)) if n == "head.weight" else v for n, v in moments["mu"].items()}
    with pytest.raises(
        ValueError, match=r"optimizer state mu of 'head.weight': shape \(5, 16\), the model's \(3, 16\)"
    ):
        check_moments({**moments, "mu": head}, {n: np.zeros(v.shape) for n, v in moments["nu"].items()})
    with pytest.raises(ValueError, match="--weights-entry state_dict_ema with --init-optimizer"):
        training_weights_entry("state_dict_ema")


def test_vit_train_refuses_moments_that_do_not_fit_the_model(run, npz, tmp_path, capsys, tiny):
    """At --image-size 16 the position embedding is resampled (5 -> 17 rows): its moments cannot continue,
    one line naming it, exit 2, nothing written; a file with no optimizer state is refused likewise."""
    from vit_cli.main import main

    path, *_ = run
    out = tmp_path / "ft"
    argv = ["train", "--dataset", f"npz:{npz}", "--init", str(path), "--init-optimizer", "--out", str(out)]
    argv += ["--set", "num_heads=2"]  # a timm file stores no head count
    assert main([*argv, "--no-progress", "--epochs", "1", "--batch-size", "4", "--image-size", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        "vit train: error: optimizer state mu of 'pos_embed': shape (1, 5, 16), the model's (1, 17, 16)"
    )
    assert not out.exists() or not any(out.iterdir())
    plain = tmp_path / "weights.pth"
    torch.save(timm_model(tiny).state_dict(), plain)
    argv[4] = str(plain)
    assert main([*argv, "--no-progress", "--epochs", "1", "--batch-size", "4"]) == 2
    assert "holds no optimizer state" in capsys.readouterr().err
