"""benchmarks/gpu_check.py in its --smoke form on CPU, so the script the GPU run depends on stays
runnable; and its `vit train` part's reading of metrics.jsonl, with a stand-in for `vit train`."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import gpu_check
from benchmarks.harness import RECORD_FIELDS


@pytest.mark.slow
def test_smoke_run_writes_every_part(tmp_path):
    out = tmp_path / "out"
    parts = "parity,B/16 infer 256,B/16 train 256,attention,patch_embed,S/16 infer 256"
    assert gpu_check.main(["--smoke", "--out", str(out), "--parts", parts]) == 0
    names = ["attention.jsonl", "parity.json", "parts.json", "patch_embed.jsonl", "table.md"]
    names.append("throughput.jsonl")
    assert sorted(p.name for p in out.iterdir()) == names

    status = json.loads((out / "parts.json").read_text())
    assert sorted(status) == sorted(parts.split(","))
    assert all(status[p]["status"] == "done" for p in parts.split(",")[:-1]), status
    assert status["S/16 infer 256"]["status"].startswith("skipped")

    par = json.loads((out / "parity.json").read_text())
    assert par["ok"] is True and par["variant"] == "mu/16" and par["smoke"] is True
    names = {r["name"] for r in par["float32_jax_vs_torch"]}
    assert {"logits", "patch_embed"} <= names and any(n.startswith("attn") for n in names)
    assert [r["name"] for r in par["bfloat16_jax_fused_vs_float64"]] == ["logits"]
    assert par["bfloat16_jax_fused_kernel"] == "explicit"  # CPU's choice
    for key in ("float32_jax_vs_torch", "bfloat16_jax_vs_float64", "bfloat16_torch_vs_float64"):
        assert par[key] and all(r["ok"] for r in par[key]), key

    records = [json.loads(line) for line in (out / "throughput.jsonl").read_text().splitlines()]
    contenders = gpu_check.CONTENDERS + ["matmul_jax", "matmul_torch"]
    assert [(r["mode"], r["contender"]) for r in records] == [(m, c) for m in ("infer", "train") for c in contenders]
    for r in records:
        assert set(r) == set(RECORD_FIELDS) and r["variant"] == "mu/16" and r["dtype"] == "bfloat16"
        assert r["error"] is None and r["median_s"] > 0 and len(r["times_s"]) == 1, r["contender"]
    table = (out / "table.md").read_text()
    assert table.startswith(gpu_check.SMOKE_LINE) and table.count("| mu/16 |") == 2

    rows = [json.loads(line) for line in (out / "attention.jsonl").read_text().splitlines()]
    by = {r["variant"]: r for r in rows}
    assert by["xla, unpadded"]["fwd_bwd_ms"] > 0 and by["xla, unpadded"]["grad_max_abs_vs_xla"] == 0
    assert all("cuDNN" in r["error"] for name, r in by.items() if "cudnn" in name)  # none on CPU

    conv, matmul = (json.loads(line) for line in (out / "patch_embed.jsonl").read_text().splitlines())
    assert conv["wgrad_rel_diff_vs_conv"] == 0 and 0 < matmul["wgrad_rel_diff_vs_conv"] < 2e-2  # bf16
    assert conv["fwd_wgrad_ms"] > 0 and matmul["fwd_wgrad_ms"] > 0


def test_train_part_reads_time_to_first_step_and_skips_without_it(tmp_path):
    """The cold and warm runs share one compilation cache; figures come from metrics.jsonl as `vit train`
    writes them, and 'skipped: not available' stands where a run's metrics do not have them."""
    script = tmp_path / "fake_train.py"
    script.write_text(
        "import json, os, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "cache = os.environ['JAX_COMPILATION_CACHE_DIR']\n"
        "warm = os.path.isdir(cache)\n"
        "os.makedirs(cache, exist_ok=True)\n"
        "os.makedirs(out)\n"
        "line = {'step': 10, 'loss': 2.3, 'time': 4.5}\n"
        "if warm:\n"
        "    line |= {'time_to_first_step_s': 1.5, 'compile_cache': 'warm'}\n"
        "open(os.path.join(out, 'metrics.jsonl'), 'w').write(json.dumps(line) + '\\n')\n"
    )
    result = gpu_check.train_runs(tmp_path, smoke=True, command=[sys.executable, str(script)])
    assert result["cold"]["exit_code"] == 0 and result["warm"]["exit_code"] == 0
    assert result["cold"]["time_to_first_step_s"] == gpu_check.NOT_AVAILABLE
    assert result["cold"]["first_log_time_s"] == 4.5
    assert result["warm"]["time_to_first_step_s"] == 1.5 and result["warm"]["compile_cache"] == "warm"
    assert result["warm"]["wall_s"] > 0
    metrics = ["train_cold_metrics.jsonl", "train_warm_metrics.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_train.py", *metrics]  # runs and caches elsewhere


def test_unknown_part_is_a_usage_error(capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--smoke", "--parts", "parity,B/32 infer"])
    assert e.value.code == 2 and "B/32 infer" in capsys.readouterr().err


def test_parts_past_the_budget_are_skipped_and_said_so(tmp_path):
    out = tmp_path / "out"
    assert gpu_check.main(["--out", str(out), "--budget-s", "0", "--parts", "attention,S/16 infer 256"]) == 0
    status = json.loads((out / "parts.json").read_text())
    assert sorted(status) == ["S/16 infer 256", "attention"]
    assert all(s["status"].startswith("skipped:") and "budget" in s["status"] for s in status.values())
    assert sorted(p.name for p in out.iterdir()) == ["parts.json"]
