"""benchmarks/gpu_check.py in its --smoke form on CPU: the script the GPU run depends on stays runnable."""

from __future__ import annotations

import json

import jax

from benchmarks import gpu_check
from benchmarks.harness import RECORD_FIELDS


def test_smoke_run_writes_parity_records_and_table(tmp_path):
    out = tmp_path / "out"
    assert gpu_check.main(["--smoke", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["parity.json", "table.md", "throughput.jsonl"]

    par = json.loads((out / "parity.json").read_text())
    assert par["ok"] is True and par["variant"] == "mu/16" and par["smoke"] is True
    names = {r["name"] for r in par["float32_jax_vs_torch"]}
    assert {"logits", "patch_embed"} <= names and any(n.startswith("attn") for n in names)
    for key in ("float32_jax_vs_torch", "bfloat16_jax_vs_float64", "bfloat16_torch_vs_float64"):
        assert par[key] and all(r["ok"] for r in par[key]), key

    records = [json.loads(line) for line in (out / "throughput.jsonl").read_text().splitlines()]
    contenders = gpu_check.CONTENDERS + ["matmul_jax", "matmul_torch"]
    assert [(r["mode"], r["contender"]) for r in records] == [(m, c) for m in ("infer", "train") for c in contenders]
    for r in records:
        assert set(r) == set(RECORD_FIELDS) and r["variant"] == "mu/16" and r["dtype"] == "bfloat16"
        if r["contender"] == "vit_jax@cudnn" and jax.default_backend() == "cpu":
            assert "cuDNN" in r["error"] and r["median_s"] is None
        else:
            assert r["error"] is None and r["median_s"] > 0 and len(r["times_s"]) == 5
    table = (out / "table.md").read_text()
    assert table.startswith(gpu_check.SMOKE_LINE) and table.count("| mu/16 |") == 2
