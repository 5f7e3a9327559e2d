"""The learning-rate schedule against timm's ``create_scheduler_v2`` (timm/scheduler/scheduler_factory.py),
stepped as timm's train.py steps it: ``step_update(num_updates)`` after every optimizer update and
``step(epoch + 1)`` at each epoch's end, with train.py's defaults (``--sched cosine``, ``--warmup-lr 1e-5``,
``--min-lr 0``, no ``--warmup-prefix``, no ``--sched-on-updates``)."""

from __future__ import annotations

import pytest
import torch
from timm.scheduler import create_scheduler_v2

from vit_common.training.recipes import TIMM_SCHEDULE
from vit_common.training.train_config import TrainConfig

EPOCHS, PER_EPOCH, WARMUP_EPOCHS, LR = 7, 4, 2, 3e-3


def timm_rates(**kw) -> list[float]:
    """The learning rate of every update of a run as train.py drives timm's scheduler."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    sched, _ = create_scheduler_v2(opt, sched="cosine", updates_per_epoch=PER_EPOCH, **kw)
    rates, updates = [], 0
    for epoch in range(EPOCHS):
        for _ in range(PER_EPOCH):
            rates.append(opt.param_groups[0]["lr"])
            updates += 1
            sched.step_update(num_updates=updates)
        sched.step(epoch + 1)
    return rates


@pytest.mark.parametrize(
    "ours, theirs",
    [
        ({}, {}),
        ({"sched_on_updates": True}, {"step_on_epochs": False}),
        ({"warmup_prefix": True}, {"warmup_prefix": True, "num_epochs": EPOCHS - WARMUP_EPOCHS}),
        ({"warmup_lr": 0.0, "min_lr_ratio": 0.1}, {"warmup_lr": 0.0, "min_lr": LR * 0.1}),
    ],
    ids=["train.py defaults", "sched-on-updates", "warmup-prefix", "warmup-lr 0, min-lr"],
)
def test_the_timm_recipe_schedules_as_timm_train_py_step_for_step(ours, theirs):
    tcfg = TrainConfig(
        recipe="timm", epochs=EPOCHS, lr=LR, warmup_steps=WARMUP_EPOCHS * PER_EPOCH, **{"min_lr_ratio": 0.0} | ours
    )
    schedule = tcfg.schedule(EPOCHS * PER_EPOCH, PER_EPOCH)
    want = timm_rates(**{"num_epochs": EPOCHS, "warmup_epochs": WARMUP_EPOCHS, "min_lr": 0.0} | theirs)
    got = [LR * schedule.factor(step) for step in range(EPOCHS * PER_EPOCH)]
    assert got == pytest.approx(want, rel=1e-13, abs=1e-19)
    assert len(set(got)) == (len(got) if tcfg.sched_on_updates else EPOCHS)


def test_only_the_timm_recipe_takes_train_py_s_defaults():
    assert {k: getattr(TrainConfig(recipe="timm").schedule(10, 2), k) for k in TIMM_SCHEDULE} == TIMM_SCHEDULE
    assert TrainConfig(recipe="timm", warmup_lr=0.0).schedule_settings() == TIMM_SCHEDULE | {"warmup_lr": 0.0}
    assert TrainConfig(recipe="twins").schedule(10, 2).is_optax
    assert not TrainConfig(recipe="twins", warmup_lr=1e-5).schedule(10, 2).is_optax
