"""The benchmark harness on a tiny config: it runs, every record has every field with consistent
values, and the FLOPs formula matches XLA's count of the jitted forward."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.extend import core as jax_core

from benchmarks import harness, report
from vit_cli.main import main
from vit_common.config import ViTConfig
from vit_jax.model import VisionTransformer

FIELDS = {
    "schema",
    "time",
    "machine",
    "versions",
    "variant",
    "config",
    "mode",
    "dtype",
    "batch",
    "warmup",
    "repeats",
    "iters",
    "contender",
    "kind",
    "framework",
    "error",
    "setup_s",
    "memory_bytes",
    "memory_kind",
    "times_s",
    "median_s",
    "min_s",
    "max_s",
    "p25_s",
    "p75_s",
    "spread",
    "flops_per_image",
    "flops_per_step",
    "flops_per_s",
    "matmul_n",
    "matmul_flops_per_s",
    "mfu_matmul",
    "peak_flops_per_s",
    "mfu_datasheet",
    "images_per_s",
    "rel_speed",
    "speed_vs",
    "load_avg_end",
}
CONTENDERS = ["vit_jax", "vit_torch", "timm", "hf"]


@pytest.mark.slow
def test_vit_bench_runs_and_records_every_field(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# title\n\n{report.PAGE_START}\nold table\n{report.PAGE_END}\nafter\n")
    out, md = tmp_path / "bench.jsonl", tmp_path / "table.md"
    rc = main(
        [
            "bench",
            "--variants",
            "mu/8",
            "--image-size",
            "32",
            "--batch",
            "2",
            "--contenders",
            ",".join(CONTENDERS),
            "--repeats",
            "3",
            "--warmup",
            "0",
            "--matmul-n",
            "64",
            "--out",
            str(out),
            "--markdown",
            str(md),
            "--page",
            str(page),
        ]
    )
    assert rc == 0
    records = report.read_jsonl(out)
    assert assert_fields(records) == harness.RECORD_FIELDS.keys() == FIELDS
    assert [(r["mode"], r["contender"]) for r in records] == [
        (m, c) for m in ("infer", "train") for c in CONTENDERS + ["matmul_jax", "matmul_torch"]
    ]
    cfg = ViTConfig.from_name("mu/8", image_size=32)
    for r in records:
        assert r["error"] is None and r["variant"] == "mu/8" and r["config"] == cfg.to_dict()
        assert len(r["times_s"]) == 3 and r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["mfu_matmul"] == pytest.approx(r["flops_per_s"] / r["matmul_flops_per_s"])
        assert r["flops_per_s"] == pytest.approx(r["flops_per_step"] / r["median_s"])
        if r["kind"] == "matmul":
            assert r["flops_per_step"] == 2 * 64**3 and r["matmul_n"] == 64
            continue
        assert r["flops_per_step"] == cfg.flops() * 2 * (3 if r["mode"] == "train" else 1)
        assert r["images_per_s"] == pytest.approx(2 / r["median_s"])
        assert set(r["speed_vs"]) == set(CONTENDERS) - {r["contender"]}
    for mode in ("infer", "train"):
        group = {r["contender"]: r for r in records if r["mode"] == mode and r["kind"] == "model"}
        assert max(r["rel_speed"] for r in group.values()) == 1.0
        ratio = group["vit_jax"]["speed_vs"]["timm"] * group["timm"]["speed_vs"]["vit_jax"]
        assert ratio == pytest.approx(1.0)
        assert group["vit_jax"]["memory_bytes"] > 0
    table = md.read_text()
    assert table.count("| mu/8 |") == 2 and all(f"`{c}`" in table for c in CONTENDERS)
    machine = records[0]["machine"]
    assert machine["cpu_flags"] == harness.host()["cpu_flags"]
    shown = [f for f in machine["cpu_flags"] if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")]
    assert f"{machine['device']} ({', '.join(shown)}), {machine['cores']} cores" in table
    text = page.read_text()
    assert "old table" not in text and table in text and text.endswith(f"{report.PAGE_END}\nafter\n")


def assert_fields(records: list[dict]) -> set[str]:
    """The one key set shared by every record, with finite positive numbers where they apply."""
    keys = {frozenset(r) for r in records}
    assert len(keys) == 1
    for r in records:
        for k in ("median_s", "flops_per_s", "matmul_flops_per_s", "mfu_matmul"):
            assert math.isfinite(r[k]) and r[k] > 0
    return set(next(iter(keys)))


def test_failed_contender_is_reported_and_the_others_run(small_cfg):
    cfg = small_cfg.replace(depth=1, pool="gap", class_token=False)
    records = harness.run_group(
        cfg,
        "gap",
        "infer",
        2,
        "float32",
        ["hf", "timm"],
        warmup=0,
        repeats=2,
        iters=1,
        matmul_n=32,
        context=harness.default_context(),
    )
    by = {r["contender"]: r for r in records}
    assert by["hf"]["error"] == "ValueError: hf cannot express pool='gap'"
    assert by["hf"]["median_s"] is None and by["timm"]["error"] is None and by["timm"]["rel_speed"] == 1.0


def test_bad_contender_is_usage_error(capsys):
    assert main(["bench", "--contenders", "vit_jax,tensorflow"]) == 2
    assert "tensorflow" in capsys.readouterr().err


def test_update_page_needs_markers(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text("# no markers\n")
    with pytest.raises(ValueError, match="benchmarks:start"):
        report.update_page(page, "| table |\n")
    assert page.read_text() == "# no markers\n"


def xla_matmul_flops(closed: jax_core.ClosedJaxpr) -> float:
    """XLA's cost-analysis FLOPs of every dot_general and convolution in a jaxpr (sub-jaxprs included)."""
    total = 0.0
    for eqn in closed.jaxpr.eqns:
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
            cost = jax.jit(lambda *a, e=eqn: e.primitive.bind(*a, **e.params)).lower(*args).cost_analysis()
            total += (cost[0] if isinstance(cost, list) else cost)["flops"]
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jax_core.ClosedJaxpr):
                    total += xla_matmul_flops(sub)
                elif isinstance(sub, jax_core.Jaxpr):
                    total += xla_matmul_flops(jax_core.ClosedJaxpr(sub, ()))
    return total


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"attn_impl": "explicit", "pool": "gap"},
        {"image_size": (32, 48), "pool": "map", "class_token": False, "reg_tokens": 2},
        {"pool": "none", "rep_size": 16},
        {"num_classes": 0, "patch_size": 4},
    ],
    ids=["token", "explicit-gap", "map-reg-nonsquare", "none-prelogits", "backbone-p4"],
)
def test_flops_formula_matches_xla_cost_analysis(overrides, small_cfg):
    """ViTConfig.flops() (matmuls and convolutions) = XLA's count of those ops in the jitted forward.

    XLA's whole-program count also has the elementwise work (LayerNorm, GELU, softmax), which the
    formula leaves out by convention; so the comparison is over the ops the formula claims to count.
    """
    cfg = small_cfg.replace(**overrides)
    model = nnx.eval_shape(lambda: VisionTransformer(cfg, rngs=nnx.Rngs(0)))
    model.eval()
    graphdef, state = nnx.split(model)
    images = jax.ShapeDtypeStruct((3, *cfg.image_size, cfg.in_chans), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, images)
    assert xla_matmul_flops(jaxpr) == pytest.approx(3 * cfg.flops(), rel=0.02)


@pytest.mark.slow
def test_a_run_killed_in_its_second_group_keeps_the_first(tmp_path):
    """`vit bench` appends each group's records when the group is measured: SIGKILL while the second
    group (training) compiles leaves the first group (inference) whole on disk."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "bench.jsonl"
    args = ["--variants", "mu/8", "--image-size", "32", "--batch", "2", "--contenders", "vit_jax,vit_torch"]
    args += ["--repeats", "1", "--warmup", "0", "--matmul-n", "32", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vit_cli.main", "bench", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_text().count("\n") >= 4:  # 2 models + 2 matmuls of group one
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed in its second group"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    records = report.read_jsonl(out)
    assert [(r["mode"], r["contender"]) for r in records] == [
        ("infer", c) for c in ("vit_jax", "vit_torch", "matmul_jax", "matmul_torch")
    ]
    assert all(r["error"] is None and r["median_s"] > 0 for r in records)


def test_cpu_info_names_the_extensions_that_tell_cpus_apart():
    xeon = (
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
        "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu\n"
    )
    epyc = "model name\t: AMD EPYC\nflags\t\t: fpu sse4_2 sse4a avx avx2 fma\n"
    assert harness.cpu_info(xeon) == (
        "Intel(R) Xeon(R) Processor",
        [
            "sse4_2",
            "avx",
            "avx2",
            "fma",
            "avx512f",
            "avx512bw",
            "avx512_vnni",
            "avx512_bf16",
            "amx_tile",
            "amx_bf16",
            "amx_int8",
        ],
    )
    assert harness.cpu_info(epyc) == ("AMD EPYC", ["sse4_2", "avx", "avx2", "fma"])
    assert harness.cpu_info("") == (None, [])
    assert set(harness.host()) == {"cpu", "cpu_flags", "cores", "load_avg"}


def test_dinov3_row_times_the_twins_beside_timms_eva(tmp_path):
    """``dinov3-ROW/P``: timm ``vit_base_patch16_dinov3``'s choices at ROW's shape; timm's contender is its
    ``Eva``, and Hugging Face's ViT, which has no RoPE, is reported as unable."""
    from benchmarks.contenders import variant_config

    out = tmp_path / "bench.jsonl"
    args = ["bench", "--variants", "dinov3-mu/8", "--image-size", "32", "--batch", "2", "--modes", "infer"]
    args += ["--contenders", "vit_jax,vit_torch,timm,hf", "--repeats", "1", "--warmup", "0", "--matmul-n", "32"]
    assert main([*args, "--out", str(out)]) == 0
    cfg = variant_config("dinov3-mu/8", image_size=32)
    assert (cfg.rope, cfg.rope_layout, cfg.reg_tokens, cfg.width, cfg.depth, cfg.patch_size) == (
        "dinov3",
        "half",
        4,
        32,
        1,
        (8, 8),
    )
    by = {r["contender"]: r for r in report.read_jsonl(out)}
    assert all(r["config"] == cfg.to_dict() for r in by.values())
    assert by["hf"]["error"].startswith("ValueError: hf cannot express") and "rope='dinov3'" in by["hf"]["error"]
    assert all(by[c]["error"] is None and by[c]["median_s"] > 0 for c in ("vit_jax", "vit_torch", "timm"))
    assert set(by["vit_jax"]["speed_vs"]) == {"vit_torch", "timm"}
    with pytest.raises(ValueError, match="unknown family 'dinov2'"):
        variant_config("dinov2-B/16")


@pytest.mark.slow
def test_rope_speed_records_the_models_and_the_block_shares(tmp_path, capsys):
    from benchmarks import rope_speed

    out = tmp_path / "rope.json"
    args = ["--variant", "dinov3-mu/8", "--image-size", "32", "--batch", "2", "--warmup", "0"]
    assert rope_speed.main([*args, "--repeats", "1", "--block-repeats", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record["model"]) == {"vit_jax", "vit_torch", "timm"}
    assert set(record["block"]) == {f"vit_jax/{p}" for p in ("rope", "plain", "op")} | {
        f"vit_torch/{p}" for p in ("rope", "plain", "op", "tables")
    }
    timm = record["model"]["timm"]["median_s"]
    assert record["speed_vs_timm"]["vit_jax"] == pytest.approx(timm / record["model"]["vit_jax"]["median_s"])
    for twin, share in record["share"].items():
        rope = record["block"][f"{twin}/rope"]["median_s"]
        assert share["op_share"] == pytest.approx(record["block"][f"{twin}/op"]["median_s"] / rope)
    assert record["machine"]["cpu_flags"] == harness.host()["cpu_flags"]
    assert "speed vs timm's Eva: vit_jax" in capsys.readouterr().out


def test_records_are_appended_to_a_results_file_another_process_wrote(tmp_path):
    out = tmp_path / "results.jsonl"
    out.write_text('{"run": 1}\n')  # a committed records file: not this process's
    report.append_jsonl([{"run": 2}], out)
    assert report.read_jsonl(out) == [{"run": 1}, {"run": 2}]
