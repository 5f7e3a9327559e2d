"""vit_jax.memory_plan: the plan's bytes against XLA's own memory analysis of the run's compiled training
step; `vit train --plan` prints it and writes nothing; a run whose plan exceeds the device's memory is
refused before anything is written."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vit_cli.main import main
from vit_common.data.datasets import ArraySource, Dataset
from vit_common.training.train_config import TrainConfig

TINY = (
    "--image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4 "
    "--epochs 1 --no-progress --no-parity --cpu-devices 1 --compile-cache off"
).split()


def tiny_trainer(tiny_cfg, **train):
    from vit_jax.trainer import Trainer

    h, w = tiny_cfg.image_size
    src = ArraySource(np.zeros((4, h, w, tiny_cfg.in_chans), np.uint8), np.arange(4) % tiny_cfg.num_classes)
    data = Dataset("zeros", src, src, tuple("abc"), (h, w), tiny_cfg.in_chans)
    return Trainer(tiny_cfg, TrainConfig(batch_size=4, **train), data)


@pytest.mark.slow
def test_the_plan_adds_up_to_xlas_analysis_of_the_same_compiled_step(tiny_cfg):
    import jax

    from vit_jax.memory_plan import plan

    cfg = tiny_cfg.replace(dropout=0.1)  # RNG state in the train state: typed keys counted as key data
    trainer = tiny_trainer(cfg, ema=0.9, accum_steps=2)
    p = plan(trainer, memory=2**30, device="test")
    mem = trainer.compile().memory_analysis()
    assert trainer.compile() is trainer.compile()  # the run takes the program the plan compiled
    assert p.parameters + p.optimizer_state + p.batch == mem.argument_size_in_bytes
    assert p.activations + p.temporaries == mem.temp_size_in_bytes
    assert p.outputs == mem.output_size_in_bytes - mem.alias_size_in_bytes > 0  # the metrics; the state donated
    footprint = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    assert p.total == footprint + mem.temp_size_in_bytes
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(trainer.abstract_state["params"]))
    params = 4 * n_params * 2
    # float32 weights (and their EMA), the step counter, one key and its counter per dropout stream
    assert params < p.parameters <= params + 4 + 16 * cfg.depth * 4
    assert p.optimizer_state >= 2 * 4 * n_params  # AdamW's two moments
    assert p.batch == 4 * (8 * 8 * 3 * 4 + 4 + 3 * 4 + 4)  # image, label, target, mask of 4 rows
    assert 0 < p.activations < p.total and p.fits()


@pytest.mark.slow
def test_activations_follow_the_micro_batch_and_remat(tiny_cfg):
    from vit_jax.memory_plan import activation_bytes

    cfg = tiny_cfg.replace(depth=3)
    full, half, remat = (activation_bytes(tiny_trainer(cfg, **t)) for t in ({}, {"accum_steps": 2}, {"remat": True}))
    assert remat < full / 2
    # the residuals of a forward pass grow with its rows (all but a few row-free ones, the LayerNorms' scales)
    assert full / 2 < half < 0.51 * full


def test_a_plan_over_the_device_memory_is_refused_with_one_line(tiny_cfg):
    from vit_jax.memory_plan import MemoryPlan

    p = MemoryPlan(1, 2, 3, 4, 5, 0, 3 * 2**30, device_memory=2**30, device="a fake device")
    with pytest.raises(ValueError, match=r"needs 3 GiB per device, beyond the 1 GiB of a fake device") as e:
        p.check()
    assert "\n" not in str(e.value) and "--remat" in str(e.value)
    assert MemoryPlan(1, 2, 3, 4, 5, 0, 15, device_memory=None).fits()


@pytest.mark.slow
def test_plan_prints_the_plan_and_writes_nothing(tmp_path, capsys, image_folder):
    out = tmp_path / "run"
    data = image_folder(tmp_path / "data", "xyz")
    rc = main(["train", *TINY, "--out", str(out), "--dataset", f"imagefolder:{data}", "--plan"])
    captured = capsys.readouterr()
    assert rc == 0 and not out.exists()
    assert captured.out.startswith("memory plan per device: ") and "optimizer state" in captured.out
    assert "of " in captured.out.split(":")[1]  # the host's memory shared by the CPU device


@pytest.mark.slow
def test_a_run_over_a_fake_small_memory_exits_2_writing_nothing(tmp_path, capsys, image_folder):
    out = tmp_path / "run"
    data = image_folder(tmp_path / "data", "xyz")
    rc = main(["train", *TINY, "--out", str(out), "--dataset", f"imagefolder:{data}", "--device-memory", "1e-6"])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    *_, line, last = err.strip().splitlines()  # the plan, printed first by every run, then the refusal
    assert "; memory plan per device: " in line and " of 1.05 KiB (cpu): " in line
    assert last.startswith("vit train: error: the training step needs ") and "beyond the 1.05 KiB of cpu" in last


def test_a_step_the_compiler_refuses_as_over_the_memory_is_one_line(tiny_cfg, monkeypatch):
    """A TPU's compiler refuses a program over its memory (as libtpu did for 7B/16 on a v5e chip here):
    the plan turns its error into the refusal's one line."""
    import jax

    from vit_jax.memory_plan import plan

    trainer = tiny_trainer(tiny_cfg)
    said = "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (88.42G)"

    def refused():
        raise jax.errors.JaxRuntimeError(said + "\nmore detail")

    monkeypatch.setattr(trainer, "compile", refused)
    with pytest.raises(ValueError, match=r"does not fit cpu: XLA's compiler says RESOURCE_EXHAUSTED") as e:
        plan(trainer)
    assert "\n" not in str(e.value) and "88.42G" in str(e.value) and "--remat" in str(e.value)


def test_sizes_print_in_binary_units_without_exponents():
    from vit_jax.memory_plan import size

    assert [size(n) for n in (12, 3584, 1023 * 2**10, 1000 * 2**20 + 1, 2 * 2**30)] == [
        "12 B",
        "3.5 KiB",
        "1023 KiB",
        "1000 MiB",
        "2 GiB",
    ]
