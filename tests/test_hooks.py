"""The training loop's hook registry (vit_jax.hooks): which hooks run at which step, in which order."""

from __future__ import annotations

import pytest

from vit_jax.hooks import Hooks, RunState


def drive(hooks: Hooks, start: int, total: int) -> RunState:
    """The loop's calls (vit_jax.loop._steps) without a model: before, step, after, then close."""
    run = RunState(trainer=None, state=None, start=start, total=total, began=0.0, lead=True, step=start)
    try:
        for step in range(start, total):
            hooks.before(run)
            run.step = step + 1
            hooks.after(run)
    finally:
        hooks.close()
    return run


def test_every_n_steps_and_the_last_in_registration_order():
    calls = []
    hooks = Hooks()
    hooks.add_hook(lambda r: calls.append(("a", r.step)), every=3)
    hooks.add_hook(lambda r: calls.append(("b", r.step)))
    hooks.add_hook(lambda r: calls.append(("pre", r.step + 1)), before=True, every=4)
    hooks.add_hook(lambda r: calls.append(("c", r.step)), every=2, close=lambda: calls.append(("close c", None)))
    hooks.add_hook(lambda r: None, close=lambda: calls.append(("close d", None)))
    drive(hooks, start=1, total=7)  # a run resumed at step 1: steps 2..7
    assert calls == [
        ("b", 2), ("c", 2),
        ("a", 3), ("b", 3),
        ("pre", 4), ("b", 4), ("c", 4),
        ("b", 5),
        ("a", 6), ("b", 6), ("c", 6),
        ("a", 7), ("b", 7), ("c", 7),  # the last step: every hook, each once
        ("close c", None), ("close d", None),
    ]  # fmt: skip


def test_a_hook_that_raises_ends_the_step_and_the_hooks_still_close():
    calls = []

    def stop(r):
        if r.step == 2:
            raise RuntimeError("stop")

    hooks = Hooks()
    hooks.add_hook(lambda r: calls.append(r.step), close=lambda: calls.append("closed"))
    hooks.add_hook(stop)
    hooks.add_hook(lambda r: calls.append(-r.step))
    with pytest.raises(RuntimeError, match="stop"):
        drive(hooks, start=0, total=5)
    assert calls == [1, -1, 2, "closed"]


def test_every_below_one_is_refused():
    with pytest.raises(ValueError, match="every=0"):
        Hooks().add_hook(lambda r: None, every=0)
