"""benchmarks/cpu_scaling.py: the FLOPs formulas against XLA's count, and one tiny run end to end."""

from __future__ import annotations

import json

import pytest

from benchmarks import cpu_scaling
from vit_common.config import ViTConfig


def test_part_flops_hand_count():
    cfg = ViTConfig.from_name("mu/16")  # L = 1 + 14 * 14 = 197, D = 32, N = 2, F = 128
    assert cpu_scaling.part_flops(cfg, 2, "attention") == 3 * 4 * 2 * 2 * 197**2 * 16 == 29_805_312
    assert cpu_scaling.part_flops(cfg, 2, "linear") == 3 * 2 * 2 * 197 * 32 * (4 * 32 + 2 * 128) == 29_048_832
    with pytest.raises(ValueError, match="'mlp'"):
        cpu_scaling.part_flops(cfg, 2, "mlp")


@pytest.mark.parametrize("part", cpu_scaling.PARTS)
def test_part_flops_match_xla_cost_analysis(part):
    # head_dim 64 as in the real variants; XLA also counts the elementwise ops (softmax, the loss's
    # products and sums), which the matmul formula leaves out: 1-4% here.
    cfg = ViTConfig(image_size=64, patch_size=16, width=256, depth=1, num_heads=4, mlp_dim=1024, num_classes=10)
    f, args = cpu_scaling.jax_functions(cfg, cpu_scaling.inputs(cfg, 2))[part]
    cost = f.lower(*args).compile().cost_analysis()
    xla = (cost[0] if isinstance(cost, list) else cost)["flops"]
    assert xla == pytest.approx(cpu_scaling.part_flops(cfg, 2, part), rel=0.05)


def test_tiny_run_writes_every_record(tmp_path, capsys):
    out = tmp_path / "scaling.jsonl"
    argv = ["--variants", "mu/16", "--image-size", "32", "--batch", "2", "--warmup", "0", "--repeats", "2"]
    assert cpu_scaling.main([*argv, "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    usable = sorted(__import__("os").sched_getaffinity(0))
    core_counts = sorted({1, len(usable)})
    assert len(records) == len(core_counts) * 4
    for r in records:
        assert set(r) == set(cpu_scaling.RECORD_FIELDS)
        assert r["schema"] == cpu_scaling.SCHEMA and r["variant"] == "mu/16" and r["batch"] == 2
        assert r["machine"]["cores"] == r["cores"] == len(r["cpus"]) and r["cores"] in core_counts
        assert r["machine"]["torch_threads"] == r["cores"]
        assert len(r["times_s"]) == 2 and r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["flops_per_s"] == pytest.approx(r["flops"] / r["median_s"])
    assert {(r["framework"], r["part"]) for r in records} == {
        (fw, p) for fw in cpu_scaling.FRAMEWORKS for p in cpu_scaling.PARTS
    }
    table = capsys.readouterr().out
    assert table.count("| mu/16 |") == (4 if len(usable) > 1 else 0)


def test_bad_arguments_are_named(capsys):
    with pytest.raises(SystemExit) as e:
        cpu_scaling.main(["--variants", "Q/16"])
    assert e.value.code == 2 and "Q/16" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cpu_scaling.main(["--repeats", "0"])
    assert e.value.code == 2 and "--repeats=0" in capsys.readouterr().err
