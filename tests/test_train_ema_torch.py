"""The torch twin's moving average of the weights (``vit_torch.train.ModelEma``) is timm's ``ModelEmaV3``
(``timm/utils/model_ema.py``), bit for bit: the same decays, warmup and floor, and the same handling of
integer buffers, step after step of the torch twin's training."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from timm.utils import ModelEmaV3

from vit_common.data.augment import Augment
from vit_common.training.train_config import TrainConfig
from vit_torch.train import ModelEma, Trainer

# 16 examples in batches of 4: 4 steps an epoch
BASE = TrainConfig(batch_size=4, epochs=2, warmup_steps=1, lr=1e-2, augment=Augment())


@pytest.fixture
def tiny(tiny_cfg):
    """The model of these tests: 2 blocks on ``tiny_dataset``'s one-channel 8x8 images, 3 classes."""
    return tiny_cfg.replace(in_chans=1, depth=2)


def batches(n: int) -> list[dict]:
    """``n`` batches of 4 as the input pipeline makes them (image float32 [4, 8, 8, 1] in [-1, 1], label,
    one-hot target, mask), drawn in numpy."""
    rng = np.random.default_rng(1)
    out = []
    for _ in range(n):
        label = rng.integers(0, 3, 4).astype(np.int32)
        image = rng.uniform(-1, 1, (4, 8, 8, 1)).astype(np.float32)
        out.append(
            {
                "image": image,
                "label": label,
                "target": np.eye(3, dtype=np.float32)[label],
                "mask": np.ones(4, np.float32),
            }
        )
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "ema",
    [
        dict(ema=0.7),
        dict(ema=0.6, ema_warmup=True, ema_warmup_gamma=2.0, ema_warmup_power=0.8, ema_min_decay=0.3),
    ],
    ids=["plain", "warmup"],
)
def test_the_twin_s_ema_is_timm_s_model_ema_v3_bit_for_bit(ema, tiny_dataset, tiny):
    tcfg = dataclasses.replace(BASE, **ema)
    t = Trainer(tiny, tcfg, tiny_dataset())
    timm_ema = ModelEmaV3(
        t.model,
        decay=tcfg.ema,
        min_decay=tcfg.ema_min_decay,
        use_warmup=tcfg.ema_warmup,
        warmup_gamma=tcfg.ema_warmup_gamma,
        warmup_power=tcfg.ema_warmup_power,
    )
    start = {k: v.clone() for k, v in t.model.state_dict().items()}
    decays = []
    for batch in batches(8):
        t.train_step(batch)
        timm_ema.update(t.model, step=t.step)
        decays.append(timm_ema.get_decay(t.step))
        for name, value in timm_ema.module.state_dict().items():
            assert torch.equal(t.ema.module.state_dict()[name], value), (t.step, name)
    assert decays == [tcfg.ema_decay(s) for s in range(1, 9)] and decays[0] == 0.0
    if tcfg.ema_warmup:  # the floor, the warm-up curve and the cap each decide a step
        assert decays[1] == 0.3 and 0.3 < decays[2] < decays[3] < 0.6 and decays[-1] == 0.6
    else:
        assert decays[1:] == [0.7] * 7
    weights, averaged = t.weights(), t.weights(ema=True)
    assert all(np.abs(weights[k] - averaged[k]).max() > 1e-4 for k in ("head.weight", "blocks.0.mlp.fc1.weight"))
    assert not any(torch.equal(start[k], v) for k, v in t.ema.module.state_dict().items() if k.endswith("weight"))


def test_integer_buffers_are_copied_and_float_ones_averaged_as_timm_does():
    """A model with BatchNorm (float running statistics, an integer batch count) after three updates."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    tcfg = dataclasses.replace(BASE, ema=0.5)
    ours, theirs = ModelEma(model, tcfg), ModelEmaV3(model, decay=0.5)
    for step in range(1, 4):
        model.train()(torch.randn(8, 3))
        with torch.no_grad():
            model[0].weight.add_(0.1)
        ours.update(model, step)
        theirs.update(model, step=step)
    for name, value in theirs.module.state_dict().items():
        assert torch.equal(ours.module.state_dict()[name], value), name
    assert int(ours.module.state_dict()["1.num_batches_tracked"]) == 3  # copied, not averaged
    assert not torch.equal(ours.module.state_dict()["1.running_mean"], model.state_dict()["1.running_mean"])


def test_no_ema_below_float32_parameters(tiny_dataset, tiny):
    with pytest.raises(ValueError, match=r"ema=0.9 with param_dtype='bfloat16': expected float32 or float64"):
        Trainer(tiny.replace(param_dtype="bfloat16"), dataclasses.replace(BASE, ema=0.9), tiny_dataset())


def test_the_torch_twin_refuses_lora_without_weights_to_fine_tune(tiny, tiny_dataset):
    with pytest.raises(ValueError, match="lora=2: expected weights to fine-tune"):
        Trainer(tiny, TrainConfig(init="x", lora=2, batch_size=4, augment=Augment()), tiny_dataset(6, 7))
