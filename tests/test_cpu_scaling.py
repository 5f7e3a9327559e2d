"""benchmarks/cpu_scaling.py: JAX and torch do the same math, the FLOPs formulas against XLA's count,
one tiny run end to end, and bad arguments."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from benchmarks import cpu_scaling
from vit_common.config import ViTConfig
from vit_common.tolerance import compare

# head_dim 64 as in the real variants, small enough for CI
SMALL = ViTConfig(image_size=64, patch_size=16, width=256, depth=1, num_heads=4, mlp_dim=1024, num_classes=10)


def test_part_flops_hand_count():
    cfg = ViTConfig.from_name("mu/16")  # L = 1 + 14 * 14 = 197, D = 32, N = 2, F = 128
    assert cpu_scaling.part_flops(cfg, 2, "attention") == 3 * 4 * 2 * 2 * 197**2 * 16 == 29_805_312
    assert cpu_scaling.part_flops(cfg, 2, "linear") == 3 * 2 * 2 * 197 * 32 * (4 * 32 + 2 * 128) == 29_048_832
    with pytest.raises(ValueError, match="'mlp'"):
        cpu_scaling.part_flops(cfg, 2, "mlp")


@pytest.mark.parametrize("part", cpu_scaling.PARTS)
def test_part_flops_match_xla_cost_analysis(part):
    # XLA also counts the elementwise ops (softmax, the loss's products and sums), which the matmul
    # formula leaves out: 1-4% here. A skipped matmul (e.g. a forward XLA could drop) is 8% or more.
    f, args = cpu_scaling.jax_functions(SMALL, cpu_scaling.inputs(SMALL, 2))[part]
    cost = f.lower(*args).compile().cost_analysis()
    xla = (cost[0] if isinstance(cost, list) else cost)["flops"]
    assert xla == pytest.approx(cpu_scaling.part_flops(SMALL, 2, part), rel=0.05)


@pytest.mark.parametrize("part", cpu_scaling.PARTS)
def test_jax_and_torch_compute_the_same_loss_and_gradients(part):
    a = cpu_scaling.inputs(SMALL, 2)
    f, args = cpu_scaling.jax_functions(SMALL, a)[part]
    loss_jax, grads_jax = f(*args)
    loss_fn, leaves = cpu_scaling.torch_functions(a)[part]
    loss_torch = loss_fn()
    loss_torch.backward()
    assert compare("loss", np.asarray(loss_jax), loss_torch.detach().numpy(), "tensor", "float32").ok
    assert len(grads_jax) == len(leaves)
    for i, (gj, leaf) in enumerate(zip(grads_jax, leaves, strict=True)):
        gt = leaf.grad.numpy()
        gt = gt.T if part == "linear" and i >= 2 else gt  # x, h, then weights, [out, in] in torch
        c = compare(f"{part} grad {i}", np.asarray(gj), gt, "gradient", "float32")
        assert c.ok, str(c)


@pytest.mark.slow  # pinned child processes over every core set
def test_tiny_run_writes_every_record(tmp_path, capsys):
    out = tmp_path / "scaling.jsonl"
    argv = ["--variants", "mu/16", "--image-size", "32", "--batch", "2", "--warmup", "0", "--repeats", "2"]
    assert cpu_scaling.main([*argv, "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    usable = sorted(os.sched_getaffinity(0))
    core_sets = [usable[:1]] + ([usable] if len(usable) > 1 else [])
    cfg = ViTConfig.from_name("mu/16", image_size=32)
    assert sorted((r["cpus"], r["framework"], r["part"]) for r in records) == sorted(
        (cpus, fw, p) for cpus in core_sets for fw in cpu_scaling.FRAMEWORKS for p in cpu_scaling.PARTS
    )
    for r in records:
        assert set(r) == set(cpu_scaling.RECORD_FIELDS)
        assert r["schema"] == cpu_scaling.SCHEMA and r["variant"] == "mu/16" and r["batch"] == 2
        assert r["config"] == cfg.to_dict() and r["flops"] == cpu_scaling.part_flops(cfg, 2, r["part"])
        # the child really ran pinned, with torch on as many threads as cores
        assert r["machine"]["cores"] == r["cores"] == len(r["cpus"]) == r["machine"]["torch_threads"]
        assert len(r["times_s"]) == r["repeats"] == 2 and r["warmup"] == 0
    table = capsys.readouterr().out
    assert table.count("| mu/16 |") == 4 and table.count("core") == len(core_sets)


def test_table_with_one_core_set():
    rec = {"variant": "mu/16", "cores": 1, "median_s": 0.002, "flops_per_s": 3e8}
    records = [rec | {"part": p, "framework": fw} for p in cpu_scaling.PARTS for fw in cpu_scaling.FRAMEWORKS]
    lines = cpu_scaling.table(records).splitlines()
    assert lines[0] == "| variant | part (fwd + bwd) | framework | 1 core ms (GFLOP/s) |"
    assert lines[2] == "| mu/16 | attention | jax | 2.0 (0.3) |" and len(lines) == 6


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--variants", "Q/16"], "Q/16"),
        (["--variants", ","], "--variants=','"),
        (["--repeats", "0"], "--repeats=0"),
        (["--warmup", "-1"], "--warmup=-1"),
        (["--image-size", "30"], "30"),
        (["--out", "."], "--out='.'"),
        (["--child-cpus", "4096"], "--child-cpus=4096"),
    ],
)
def test_bad_arguments_are_named(argv, named, capsys):
    with pytest.raises(SystemExit) as e:
        cpu_scaling.main(argv)
    assert e.value.code == 2 and named in capsys.readouterr().err
