"""The GPU check: one prepared run, most important part first; each part's JSON is under OUT when it ends.

Run through ``benchmarks/gpu_check.sh`` (installs carried wheels, sets the environment). The parts, in
order; the first three (``REQUIRED``) always start, each later one only if its estimated time (``PARTS``,
seconds on one H200, guesses) still fits the budget (--budget-s); the shell's ``timeout`` is the backstop.
parts.json says of every part whether it ran, how long, or why not:
    parity               OUT/parity.json: B/16 through the twins' runners (vit_jax.runner,
                         vit_torch.runner: full matmul precision pinned in every run, JAX "highest", no
                         TF32 in torch, restored after): float32, every intermediate of vit_jax against
                         vit_torch; bf16 compute of both twins against a float64 reference (vit_torch in
                         float64), intermediates through the explicit attention path and logits through
                         the fused one (the kernel the model chose, e.g. cuDNN).
    B/16 infer, train    OUT/throughput.jsonl (appended per group, ``benchmarks.harness.RECORD_FIELDS``):
                         bf16 inference and training of every contender in ``CONTENDERS``; OUT/table.md
                         rewritten after each group.
    train                OUT/train.json: `vit train` (the demo, one epoch) run twice on one fresh JAX
                         compilation cache, cold then warm: time to first step as metrics.jsonl reports it
                         (``time_to_first_step_s``, ``compile_cache``) where `vit train` writes it, and
                         the wall time of each run; OUT/train_{cold,warm}_metrics.jsonl. Needs grain and
                         mlxtend.
    input_pipeline       OUT/input_pipeline.jsonl: ``python -m benchmarks.input_pipeline`` where it exists
                         (its exit code and output in OUT/input_pipeline.json).
    attention            OUT/attention.jsonl: jax.nn.dot_product_attention alone at B/16's shapes: XLA,
                         cuDNN unpadded (forward), cuDNN padded to even / multiple-of-8 / 256 tokens with
                         masked keys (forward + backward), the model's route; ms per call, differences.
    patch_embed          OUT/patch_embed.jsonl: B/16's patch embedding, forward + weight gradient, as the
                         model computes it (a stride-16 convolution; XLA writes its weight gradient as a
                         dilated convolution) against the same product as reshape + one matmul.
    S/16, L/16           more throughput groups while the budget lasts.
--smoke (any machine, a minute or two on CPU): mu/16, batch 2, one timed round of one call,
torch.compile with its eager backend; parity.json carries "smoke": true and table.md opens with a line
saying the numbers check the script. --parts runs a subset. Exit code 1 if a parity check fails, else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vit_common.system import host_memory

CONTENDERS = ["vit_jax", "vit_torch", "vit_torch_compile", "timm", "timm_compile", "hf"]
# part -> estimated seconds on one H200 (compilation included), most important first. A throughput
# part is "VARIANT MODE BATCH".
PARTS: dict[str, float] = {
    "parity": 75,
    "B/16 infer 256": 100,
    "B/16 train 256": 170,
    "train": 80,
    "input_pipeline": 45,
    "attention": 25,
    "patch_embed": 20,
    "S/16 infer 256": 70,
    "S/16 train 256": 110,
    "L/16 infer 256": 110,
    "L/16 train 128": 190,
}
SMOKE_LINE = (
    "SMOKE RUN (--smoke: mu/16, batch 2, torch.compile with its eager backend): these numbers check the "
    "script, they measure nothing."
)
REQUIRED = ("parity", "B/16 infer 256", "B/16 train 256")
NOT_AVAILABLE = "skipped: not available"


def _write_json(path: Path, obj) -> None:
    from benchmarks.report import write_text

    write_text(path, json.dumps(obj, indent=1, sort_keys=True))


# ---------------------------------------------------------------------------------------- parity


def parity(context: dict, variant: str) -> dict:
    """``variant`` on 2 images: float32 twins (pinned precision) and bf16 twins against float64."""
    import torch

    from benchmarks.contenders import inputs, random_state
    from vit_common.config import ViTConfig
    from vit_common.tolerance import compare
    from vit_jax import runner as jax_runner
    from vit_jax.weights import from_numpy as jax_from_numpy
    from vit_torch import runner as torch_runner
    from vit_torch.weights import from_numpy as torch_from_numpy

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = ViTConfig.from_name(variant)
    state = random_state(cfg)
    images, _ = inputs(cfg, 2)
    nhwc = images.transpose(0, 2, 3, 1)

    def to_np(v) -> np.ndarray:
        return np.asarray(v.astype("float32") if v.dtype != np.float64 else v)

    def run_jax(c: ViTConfig) -> dict[str, np.ndarray]:
        _, out = jax_runner.intermediates(jax_from_numpy(c, state), nhwc.astype(c.dtype))
        return {k: to_np(v) for k, v in out.items()}

    def run_jax_fused(c: ViTConfig) -> tuple[dict[str, np.ndarray], str]:
        model = jax_from_numpy(c, state)
        (logits,) = jax_runner.logits(model, [nhwc.astype(c.dtype)])
        return {"logits": to_np(logits)}, model.blocks[0].attn.kernel

    def run_torch(c: ViTConfig) -> dict[str, np.ndarray]:
        _, out = torch_runner.intermediates(torch_from_numpy(c, state, device=device), nhwc)
        return {k: to_np(v) for k, v in out.items()}

    def compare_all(a: dict, ref: dict, dtype: str) -> list[dict]:
        rows = []
        for k in a:
            what = "attention" if k.startswith("attn") and dtype != "bfloat16" else "tensor"
            rows.append(compare(k, a[k], ref[k], what, dtype).to_dict())
        return rows

    # Every run through the twins' runners: full float32 matmul precision in both (no TF32), restored after.
    f32 = compare_all(run_jax(cfg), run_torch(cfg), "float32")
    ref64 = run_torch(cfg.replace(dtype="float64", param_dtype="float64"))
    bf16_cfg = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    fused, kernel = run_jax_fused(bf16_cfg)
    result = {
        **context,
        "variant": variant,
        "batch": 2,
        "float32_jax_vs_torch": f32,
        "bfloat16_jax_vs_float64": compare_all(run_jax(bf16_cfg), ref64, "bfloat16"),
        "bfloat16_jax_fused_vs_float64": compare_all(fused, ref64, "bfloat16"),
        "bfloat16_jax_fused_kernel": kernel,
        "bfloat16_torch_vs_float64": compare_all(run_torch(bf16_cfg), ref64, "bfloat16"),
    }
    keys = [k for k, v in result.items() if k.endswith("_vs_float64") or k.endswith("_vs_torch")]
    result["ok"] = all(r["ok"] for key in keys for r in result[key])
    return result


# ------------------------------------------------------------------------------------ throughput


def throughput(out: Path, variant: str, mode: str, batch: int, context: dict, smoke: bool) -> list[dict]:
    """One harness group; its records appended to OUT/throughput.jsonl at once."""
    from benchmarks import harness, report
    from vit_common.config import ViTConfig

    group = harness.run_group(
        ViTConfig.from_name(variant),
        variant,
        mode,
        batch,
        "bfloat16",
        CONTENDERS,
        warmup=0 if smoke else 1,
        repeats=1 if smoke else 5,
        iters=1 if smoke else (10 if mode == "infer" else 5),
        matmul_n=256 if smoke else 8192,
        context=context,
        compile_backend="eager" if smoke else "inductor",
    )
    report.append_jsonl(group, out / "throughput.jsonl")
    print(report.terminal_table(group), flush=True)
    return group


# ----------------------------------------------------------------------------- vit train, pipeline


def first_step(metrics: Path) -> dict:
    """What a run's metrics.jsonl says about its first step: ``time_to_first_step_s`` and
    ``compile_cache`` where `vit train` writes them (else NOT_AVAILABLE), and the ``time`` of its
    first logged line (seconds since the loop started, compilation included)."""
    lines = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()] if metrics.exists() else []
    keys = ("time_to_first_step_s", "compile_cache")
    found = {k: next((ln[k] for ln in lines if k in ln), NOT_AVAILABLE) for k in keys}
    return found | {"first_log_time_s": next((ln["time"] for ln in lines if "time" in ln), None)}


def train_runs(out: Path, smoke: bool, command: list[str] | None = None, timeout_s: float = 150) -> dict:
    """`vit train` twice on one fresh compilation cache (cold, then warm): first-step figures and wall time."""
    missing = [m for m in ("grain", "mlxtend") if importlib.util.find_spec(m) is None]
    if missing and command is None:
        return {"status": f"{NOT_AVAILABLE}: {', '.join(missing)} not installed (carry their wheels in .whl/)"}
    args = ["--epochs", "1", "--no-parity", "--no-progress"]
    if smoke:
        args += ["--dataset", "digits", "--image-size", "8", "--patch-size", "4", "--width", "32", "--depth", "1"]
        args += ["--num-heads", "2", "--mlp-dim", "64", "--batch-size", "64"]
    command = command or [sys.executable, "-m", "vit_cli.main", "train", *args]
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check_train_"))  # run folders and caches stay out of OUT
    cache = scratch / "compile_cache"
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache), "XDG_CACHE_HOME": str(scratch / "xdg_cache")}
    result: dict = {"command": command[1:], "compile_cache_dir": str(cache)}
    for run in ("cold", "warm"):
        run_dir = scratch / run
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                [*command, "--out", str(run_dir)], env=env, capture_output=True, text=True, timeout=timeout_s
            )
            rc, tail = p.returncode, (p.stdout + p.stderr)[-2000:]
        except subprocess.TimeoutExpired as e:  # its output comes as bytes even with text=True
            said = b"".join(v if isinstance(v, bytes) else v.encode() for v in (e.stdout, e.stderr) if v)
            rc, tail = "timeout", f"stopped after {timeout_s} s: {said.decode(errors='replace')[-1000:]}"
        result[run] = {"exit_code": rc, "wall_s": time.perf_counter() - t0, **first_step(run_dir / "metrics.jsonl")}
        if rc != 0:
            result[run]["output_tail"] = tail
        if (run_dir / "metrics.jsonl").exists():
            shutil.copyfile(run_dir / "metrics.jsonl", out / f"train_{run}_metrics.jsonl")
    shutil.rmtree(scratch, ignore_errors=True)
    return result


def input_pipeline(out: Path, timeout_s: float = 120) -> dict:
    """``python -m benchmarks.input_pipeline --out OUT/input_pipeline.jsonl`` where that module exists."""
    if importlib.util.find_spec("benchmarks.input_pipeline") is None:
        return {"status": f"{NOT_AVAILABLE}: no benchmarks.input_pipeline"}
    if importlib.util.find_spec("grain") is None:
        return {"status": f"{NOT_AVAILABLE}: grain not installed (carry its wheel in .whl/)"}
    t0 = time.perf_counter()
    command = [sys.executable, "-m", "benchmarks.input_pipeline", "--out", str(out / "input_pipeline.jsonl")]
    try:
        p = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        rc, tail = "timeout", f"stopped after {timeout_s} s"
    return {"exit_code": rc, "wall_s": time.perf_counter() - t0, "output_tail": tail}


# ------------------------------------------------------------------------------------- attention


def attention_probe(out: Path, smoke: bool) -> list[dict]:
    """ms per call of attention alone, [B, 197, N, D/N] bf16 (B/16: 256, 12, 64), each variant of the
    cuDNN route against XLA unpadded; one JSON line per variant, appended to OUT/attention.jsonl."""
    import functools

    import jax
    import jax.numpy as jnp

    from benchmarks import report
    from vit_jax import platforms

    b, n, h = (2, 2, 16) if smoke else (256, 12, 64)
    t = 197
    rng = np.random.default_rng(0)
    q, k, v, g = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16) for _ in range(4))
    scale = h**-0.5

    def timed(fn, *a) -> float:
        fn(*a)  # compile and warm up
        jax.block_until_ready(fn(*a))
        t0 = time.perf_counter()
        for _ in range(10):
            r = fn(*a)
        jax.block_until_ready(r)
        return (time.perf_counter() - t0) / 10 * 1e3

    def fwd_bwd(attn):
        return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * g), (0, 1, 2)))

    xla = functools.partial(jax.nn.dot_product_attention, scale=scale, implementation="xla")
    ref_out, ref_grads = jax.jit(xla)(q, k, v), fwd_bwd(xla)(q, k, v)[1]
    variants = {
        "xla, unpadded": (xla, True),
        "cudnn, unpadded (forward only)": (functools.partial(xla, implementation="cudnn"), False),
        "cudnn, padded to even (198), keys masked": (
            functools.partial(platforms.padded_attention, scale=scale, implementation="cudnn", multiple=2),
            True,
        ),
        "cudnn, padded to a multiple of 8 (200), keys masked": (
            functools.partial(platforms.padded_attention, scale=scale, implementation="cudnn", multiple=8),
            True,
        ),
        "cudnn, padded to 256, keys masked": (
            functools.partial(platforms.padded_attention, scale=scale, implementation="cudnn", multiple=128),
            True,
        ),
        "the model's route (vit_jax.platforms.dot_product_attention, cudnn)": (
            functools.partial(platforms.dot_product_attention, scale=scale, implementation="cudnn"),
            True,
        ),
    }
    rows = []
    for name, (attn, backward) in variants.items():
        row = {"shape": [b, t, n, h], "dtype": "bfloat16", "variant": name}
        try:
            row["fwd_ms"] = timed(jax.jit(attn), q, k, v)
            row["max_abs_vs_xla"] = float(jnp.max(jnp.abs(jax.jit(attn)(q, k, v) - ref_out).astype(jnp.float32)))
            if backward:
                step = fwd_bwd(attn)
                row["fwd_bwd_ms"] = timed(step, q, k, v)
                grads = step(q, k, v)[1]
                row["grad_max_abs_vs_xla"] = max(
                    float(jnp.max(jnp.abs(a - r).astype(jnp.float32))) for a, r in zip(grads, ref_grads, strict=True)
                )
        except Exception as e:  # noqa: BLE001 -- a variant this device cannot run is reported
            row["error"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        rows.append(row)
    report.append_jsonl(rows, out / "attention.jsonl")
    return rows


def patch_embed_probe(out: Path, smoke: bool) -> list[dict]:
    """ms per call of the patch embedding's forward + weight gradient, [B, 224, 224, 3] bf16 images
    (B/16: B=256, D=768): the convolution against reshape + matmul; appended to OUT/patch_embed.jsonl."""
    import jax
    import jax.numpy as jnp

    from benchmarks import report

    b, d, p, size = (2, 32, 16, 224) if smoke else (256, 768, 16, 224)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((b, size, size, 3)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((p, p, 3, d)) * 0.02, jnp.float32)
    g = jnp.asarray(rng.standard_normal((b, size // p, size // p, d)), jnp.bfloat16)

    def conv(w, x):
        dims = ("NHWC", "HWIO", "NHWC")
        return jax.lax.conv_general_dilated(x, w.astype(x.dtype), (p, p), "VALID", dimension_numbers=dims)

    def matmul(w, x):
        n, h, wd = x.shape[0], x.shape[1] // p, x.shape[2] // p
        patches = x.reshape(n, h, p, wd, p, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, h, wd, p * p * 3)
        return patches @ w.astype(x.dtype).reshape(p * p * 3, -1)

    rows, ref = [], None
    for name, fn in (("convolution (the model)", conv), ("reshape + matmul", matmul)):
        step = jax.jit(jax.value_and_grad(lambda w, x, fn=fn: jnp.sum(fn(w, x).astype(jnp.float32) * g)))
        step(w, x)[1].block_until_ready()
        t0 = time.perf_counter()
        for _ in range(10):
            r = step(w, x)
        jax.block_until_ready(r)
        grad = np.asarray(r[1], np.float64)
        ref = grad if ref is None else ref
        rows.append(
            {
                "shape": [b, size, size, 3],
                "width": d,
                "variant": name,
                "fwd_wgrad_ms": (time.perf_counter() - t0) / 10 * 1e3,
                "wgrad_rel_diff_vs_conv": float(np.max(np.abs(grad - ref)) / np.max(np.abs(ref))),
            }
        )
    report.append_jsonl(rows, out / "patch_embed.jsonl")
    return rows


# ------------------------------------------------------------------------------------------ main


def _outcome(skipped: str | None, exit_codes: list) -> dict:
    if skipped:
        return {"status": skipped}
    return {"status": "done" if all(c == 0 for c in exit_codes) else f"failed: exit codes {exit_codes}"}


def main(argv: list[str] | None = None) -> int:
    host_memory.reuse_freed_memory()  # as `vit bench` does, so the records carry the same setting
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"), help="output folder ($OUT)")
    p.add_argument("--budget-s", type=float, default=330.0, help="start a part only if its estimate fits this (s)")
    p.add_argument("--smoke", action="store_true", help="check the script itself: mu/16, batch 2, any device")
    p.add_argument("--parts", default=None, help=f"comma-separated subset of: {', '.join(PARTS)} (default all)")
    args = p.parse_args(argv)
    parts = list(PARTS) if args.parts is None else [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = [s for s in parts if s not in PARTS]
    if unknown:
        p.error(f"--parts: unknown {', '.join(unknown)}; expected some of: {', '.join(PARTS)}")
    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from benchmarks import harness, report

    context = harness.default_context()
    print(json.dumps(context["machine"]), json.dumps(context["versions"]), flush=True)
    status: dict[str, dict] = {}
    records: list[dict] = []
    parity_ok = True
    for part in parts:
        elapsed = time.perf_counter() - t_start
        if args.smoke and part[0].isupper() and not part.startswith("B/16"):
            status[part] = {"status": "skipped: --smoke times one group per mode"}
            _write_json(out / "parts.json", status)
            continue
        if not args.smoke and part not in REQUIRED and elapsed + PARTS[part] > args.budget_s:
            status[part] = {"status": f"skipped: {elapsed:.0f} s + ~{PARTS[part]:.0f} s > budget {args.budget_s:.0f} s"}
            _write_json(out / "parts.json", status)
            continue
        t0 = time.perf_counter()
        try:
            if part == "parity":
                try:
                    par = parity(context, "mu/16" if args.smoke else "B/16")
                except Exception as e:  # noqa: BLE001 -- keep going to the other parts, and say what failed
                    par = {**context, "ok": False, "error": f"{type(e).__name__}: {e}"}
                parity_ok = par["ok"]
                _write_json(out / "parity.json", par | {"smoke": args.smoke})
                result = {"status": "done", "ok": par["ok"]}
            elif part == "train":
                runs = train_runs(out, args.smoke)
                _write_json(out / "train.json", runs)
                result = _outcome(runs.get("status"), [runs.get(r, {}).get("exit_code") for r in ("cold", "warm")])
            elif part == "input_pipeline":
                run = input_pipeline(out)
                _write_json(out / "input_pipeline.json", run)
                result = _outcome(run.get("status"), [run.get("exit_code")])
            elif part == "attention":
                result = {"rows": len(attention_probe(out, args.smoke))}
            elif part == "patch_embed":
                result = {"rows": len(patch_embed_probe(out, args.smoke))}
            else:
                variant, mode, batch = part.split()
                variant, batch = ("mu/16", "2") if args.smoke else (variant, batch)
                records += throughput(out, variant, mode, int(batch), context, args.smoke)
                table = report.markdown_table(records)
                report.write_text(out / "table.md", f"{SMOKE_LINE}\n\n{table}" if args.smoke else table)
                result = {}
        except Exception as e:  # noqa: BLE001 -- one part's failure must not lose the others
            result = {"status": f"error: {type(e).__name__}: {e}"}
        status[part] = {"status": "done", **result, "seconds": time.perf_counter() - t0}
        _write_json(out / "parts.json", status)
        print(f"{part}: {status[part]['status']} ({status[part]['seconds']:.0f} s)", flush=True)
    return 0 if parity_ok else 1


if __name__ == "__main__":
    sys.exit(main())
