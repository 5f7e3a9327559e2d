"""Peak anonymous memory and wall time of `vit convert`, side by side with `cp` of the same file.

A timm safetensors file of random weights (float32 or bfloat16) is written by streaming (each tensor
computed when it is written), then converted to each target format in child processes, interleaved with
`cp` of the same file (cp, hf, big_vision, orbax, pth, cp, hf, ...; pth: timm's PyTorch pickle, written
by `torch.save`). Each child's anonymous memory (RssAnon of /proc/PID/status: heap and anonymous maps, not
the pages of memory-mapped files, which VmRSS and VmHWM include) is sampled every 5 ms; a record gives its
peak, the peak less what the child held after its imports (``rise``), both as ratios to the file size, the
wall time and its ratio to the median `cp`.

Run (from the repository root):

    python -m benchmarks.convert_memory --variant L/16 --dtype float32 --repeats 3
    python -m benchmarks.convert_memory --variant 7B/16 --dtype bfloat16 --to hf,big_vision --repeats 1
    python -m benchmarks.convert_memory --dinov3 --variant 7B/16 --dtype bfloat16 --to hf_dinov3,timm \
        --shard-size 5GB --repeats 1
    python -m benchmarks.convert_memory --dinov3 --variant 7B/16 --depth 2 --dtype bfloat16 --to hf_dinov3,timm
    python -m benchmarks.convert_memory --source big_vision --variant B/16 --to hf,timm
    python -m benchmarks.convert_memory --dinov3 --variant 7B/16 --depth 2 --dtype bfloat16 \
        --source dinov3_original --to hf_dinov3,timm

``7B/16`` is ViT-7B-shaped: DINOv3 ViT-7B's width 4096, depth 40 and 32 heads, its SwiGLU feed-forward
(3 x 4096 x 8192) as a plain MLP of 12288 (the same parameter count, which every format holds): 6.7e9
parameters, 13.4 GB in bfloat16. With ``--dinov3`` the model is the DINOv3 backbone itself (timm
vit_7b_patch16_dinov3's shapes: SwiGLU of gated width 8192, 4 registers, LayerScale, RoPE, no qkv bias;
6.7e9 parameters, its count checked against timm's model built on the meta device) and the source a
transformers dinov3_vit folder (``hf_dinov3``) written by streaming, or with ``--source dinov3_original``
a Meta DINOv3 ``.pth`` (torch.hub keys), written by streaming too (one computed tensor at a time); ``--to
dinov3_original`` makes one a contender. Records also give the peak as a ratio to the largest tensor.
``--depth`` keeps fewer blocks: a smaller file with the same largest tensor. The files go to ``--dir``
(default: a temporary folder, removed at the end); with ``--keep-source`` the source stays there, with a
note of what it holds (one per source file), and a later run of the same model and source format reuses
it (writing the 7B/16 file takes about 18 minutes here). Records are JSON lines
(``--out``), with the machine (CPU model and flags from /proc/cpuinfo).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from benchmarks import report
from benchmarks.harness import host
from vit_common.checkpoints.convert import save_checkpoint
from vit_common.checkpoints.formats.dinov3_original import DINOV3_FIXED
from vit_common.checkpoints.formats.tensors import LazyTensor
from vit_common.config import ViTConfig
from vit_common.state import canonical_shapes
from vit_common.system.io import read_json, write_json

SHAPES = {"7B/16": dict(patch_size=16, width=4096, depth=40, num_heads=32, mlp_dim=12288)}
# DINOv3 backbones (--dinov3): timm vit_7b_patch16_dinov3's arguments; the SwiGLU's gated width is
# 2 x 4096 aligned to 64 (swiglu_align_to), 4 registers, LayerScale, no qkv bias.
DINOV3_SHAPES = {
    "7B/16": dict(patch_size=16, width=4096, depth=40, num_heads=32, mlp_dim=8192, timm_name="vit_7b_patch16_dinov3")
}
# A contender: (`vit convert --to` format, destination); "pth" is timm's PyTorch pickle (torch.save).
DESTINATIONS = {
    "hf": ("hf", "out_hf"),
    "hf_dinov3": ("hf_dinov3", "out_hf_dinov3"),
    "big_vision": ("big_vision", "out.npz"),
    "orbax": ("orbax", "out_orbax"),
    "timm": ("timm", "out.safetensors"),
    "pth": ("timm", "out.pth"),
    "dinov3_original": ("dinov3_original", "out_meta.pth"),
}
# A source format and its file: timm and big_vision for a plain ViT, the DINOv3 formats for a DINOv3
# backbone (--dinov3), which the DINOv3 contenders need too.
SOURCES = {"timm": "src.safetensors", "big_vision": "src.npz", "hf_dinov3": "src_hf", "dinov3_original": "src_meta.pth"}
DINOV3_FORMATS = {"hf_dinov3", "dinov3_original"}
_SAMPLE_S = 0.005

# The child: import, say its anonymous memory, then run `vit convert` as the command line does (its
# arguments in sys.argv: `main()` then freezes the objects left before the process exits, which the last
# collection would walk, 0.3 s after a JAX conversion).
_CHILD = """
import sys
from vit_cli.main import main
def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))
print(anon(), flush=True)
sys.argv = ["vit", "convert", sys.argv[1], sys.argv[2], "--to", sys.argv[3], "--json", *sys.argv[4:]]
sys.exit(main())
"""


def dinov3_config(variant: str, dtype: str) -> ViTConfig:
    """The ViTConfig of DINOv3 backbone ``variant`` (a name of ``DINOV3_SHAPES``): the fields every DINOv3
    file fixes, timm Eva's SwiGLU (mlp_dim the gated width), registers, LayerScale; no classifier."""
    shape = {k: v for k, v in DINOV3_SHAPES[variant].items() if k != "timm_name"}
    return ViTConfig(
        **DINOV3_FIXED,
        **shape,
        image_size=224,
        num_classes=0,
        mlp_type="swiglu",
        qkv_bias=False,
        reg_tokens=4,
        layer_scale=1e-5,
        ln_eps=1e-5,
        rope_temperature=100.0,
        rope_periods="computed",
        dynamic_img_size=True,
        param_dtype=dtype,
    )


def timm_param_count(name: str) -> int:
    """Parameters of timm model ``name``'s state_dict, built on the meta device (nothing allocated)."""
    import timm
    import torch

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    return sum(v.numel() for v in model.state_dict().values())


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def config(variant: str, dtype: str) -> ViTConfig:
    """The ViTConfig of ``variant`` (a VARIANTS name such as L/16, or a name of ``SHAPES``), 1000 classes."""
    if variant in SHAPES:
        return ViTConfig(image_size=224, num_classes=1000, param_dtype=dtype, **SHAPES[variant])
    return ViTConfig.from_name(variant, num_classes=1000, param_dtype=dtype)


def random_lazy_state(cfg: ViTConfig, dtype: str, seed: int = 0) -> dict[str, LazyTensor]:
    """Canonical tensors of random values, each computed (the same every time, from its own seed) only when
    asked for: a file of any size is written one tensor in memory at a time. float32: uniform in
    [-0.02, 0.02); bfloat16: random sign and mantissa bits at exponent 2^-7 (|x| in [0.0078, 0.0156)),
    drawn as raw bytes, about 5x faster than rounding float32 draws (a 7B file's writes compute every
    tensor three times)."""
    out = {}
    for i, (name, shape) in enumerate(canonical_shapes(cfg).items()):

        def make(shape=shape, i=i) -> np.ndarray:
            rng = np.random.default_rng([seed, i])
            if dtype == "bfloat16":
                bits = np.frombuffer(rng.bytes(2 * int(np.prod(shape))), np.uint16).reshape(shape)
                return ((bits & 0x807F) | 0x3C00).view(_dtype(dtype))
            a = rng.random(shape, np.float32)
            a -= 0.5
            a *= 0.04
            return a.astype(_dtype(dtype), copy=False)

        out[name] = LazyTensor(shape, _dtype(dtype), make)
    return out


def _dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def rss_anon(pid: int) -> int | None:
    """RssAnon of process ``pid`` in bytes (None once it has gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:")), None)
    except OSError:
        return None


def sampled_run(argv: list[str], every: float = _SAMPLE_S, **popen) -> tuple[float, int, str, float]:
    """Run ``argv`` (``popen``: more ``subprocess.Popen`` arguments), sampling its RssAnon every ``every``
    seconds: (wall seconds, peak anonymous bytes, its stdout, the CPU seconds it used, user + system,
    from ``os.wait4``: on a shared machine less loose than the wall time).

    Raises:
        RuntimeError: the child exited non-zero (its stderr's end quoted).
    """
    start = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    peak = 0
    while True:
        peak = max(peak, rss_anon(p.pid) or 0)
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(every)
    wall = time.perf_counter() - start
    p.returncode = os.waitstatus_to_exitcode(status)
    out, err = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {p.returncode}: {err.strip()[-2000:]}")
    return wall, peak, out, usage.ru_utime + usage.ru_stime


def measure(argv: list[str], reports_baseline: bool, **popen) -> dict:
    """Run ``argv`` (``popen`` as ``sampled_run``'s), sampling its RssAnon; wall and CPU seconds, peak
    bytes and (``reports_baseline``: the child's first stdout line) what it held after its imports."""
    wall, peak, out, cpu = sampled_run(argv, **popen)
    baseline = int(out.split()[0]) if reports_baseline else 0
    return {"wall_s": wall, "cpu_s": cpu, "peak_anon_bytes": peak, "baseline_anon_bytes": baseline}


def _torch_writers() -> dict:
    """vit_torch's file writers (torch imported only for a .pth source)."""
    from vit_torch.formats import WRITERS

    return WRITERS


def _commit(tree: Path) -> str:
    """The commit checked out at ``tree`` (``git rev-parse HEAD``)."""
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", default="L/16", help="a ViT variant (L/16) or 7B/16 (default L/16)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument(
        "--to",
        default="hf,big_vision,orbax,pth",
        help="contenders, comma-separated: hf, hf_dinov3, big_vision, orbax, timm (.safetensors), pth (timm's .pth), "
        "dinov3_original (Meta's DINOv3 .pth)",
    )
    p.add_argument(
        "--dinov3",
        action="store_true",
        help="a DINOv3 backbone (--variant 7B/16): the source is a transformers dinov3_vit folder, not timm",
    )
    p.add_argument(
        "--source",
        choices=tuple(SOURCES),
        help="the source file: timm .safetensors (the default) or a big_vision .npz (converted to hf with "
        "--accept-assumed all: an .npz states no GELU or LayerNorm eps); with --dinov3 a dinov3_vit folder "
        "(hf_dinov3, the default) or Meta's DINOv3 .pth (dinov3_original)",
    )
    p.add_argument("--shard-size", help="vit convert's --shard-size for the hf and hf_dinov3 targets")
    p.add_argument(
        "--depth", type=int, help="blocks instead of the variant's (a smaller file with the same largest tensor)"
    )
    p.add_argument("--repeats", type=int, default=3, help="rounds of cp + every target (default 3)")
    p.add_argument("--dir", help="folder for the files (default: a temporary one, removed at the end)")
    p.add_argument(
        "--keep-source",
        action="store_true",
        help="with --dir: keep the source file there, and reuse one a run of the same model kept",
    )
    p.add_argument("--out", help="append JSON-line records here")
    p.add_argument(
        "--baseline",
        help="a checkout of another commit (git worktree add DIR COMMIT): each target also runs with its code, "
        "interleaved (each code first in every other round), as TARGET@baseline",
    )
    args = p.parse_args(argv)
    targets = [t for t in args.to.split(",") if t]
    unknown = [t for t in targets if t not in DESTINATIONS]
    if args.keep_source and not args.dir:
        p.error("--keep-source needs --dir (a temporary folder is removed at the end)")
    source = args.source or ("hf_dinov3" if args.dinov3 else "timm")
    if (source in DINOV3_FORMATS) != args.dinov3 or (not args.dinov3 and DINOV3_FORMATS & set(targets)):
        p.error(
            f"--source {source!r} --to {args.to!r}: with --dinov3 the source is hf_dinov3 or dinov3_original, "
            f"without it timm or big_vision; --to {' and '.join(sorted(DINOV3_FORMATS))} need --dinov3"
        )
    if unknown or args.repeats < 1 or (args.dinov3 and args.variant not in DINOV3_SHAPES) or (args.depth or 1) < 1:
        p.error(
            f"--to {args.to!r}: expected some of {', '.join(DESTINATIONS)}; --repeats and --depth at least 1; "
            f"--dinov3 --variant one of {', '.join(DINOV3_SHAPES)}"
        )
    work = Path(args.dir).resolve() if args.dir else Path(tempfile.mkdtemp(prefix="vit_convert_memory_"))
    baseline = Path(args.baseline).resolve() if args.baseline else None
    work.mkdir(parents=True, exist_ok=True)
    cfg = dinov3_config(args.variant, args.dtype) if args.dinov3 else config(args.variant, args.dtype)
    name = DINOV3_SHAPES.get(args.variant, {}).get("timm_name") if args.dinov3 and not args.depth else None
    cfg = cfg.replace(depth=args.depth) if args.depth else cfg
    if name and timm_param_count(name) != cfg.param_count():
        raise RuntimeError(f"{args.variant}: {cfg.param_count()} parameters, timm {name} has {timm_param_count(name)}")
    src = work / SOURCES[source]
    state = random_lazy_state(cfg, args.dtype)
    largest = max(t.nbytes for t in state.values())
    shard = ["--shard-size", args.shard_size] if args.shard_size else []
    # what a user gives for a Meta .pth: the image size it does not state (the HF and timm files state it),
    # and its RoPE periods recomputed (as transformers and timm compute them)
    meta = ["--source-image-size", "x".join(map(str, cfg.image_size)), "--rope-periods", "recomputed"]
    given = meta if source == "dinov3_original" else []
    kept = work / (src.name + ".json")  # what a kept source holds: reused only for the same model
    model = {"source": source, "variant": args.variant, "depth": args.depth, "dtype": args.dtype, "seed": 0}
    try:
        note = read_json(kept) if args.keep_source and src.exists() and kept.exists() else {}
        if note.get("model") == model:
            made_s = note["written_s"]
            print(f"# reusing the source kept in {work}", flush=True)
        else:
            _remove(src)
            kept.unlink(missing_ok=True)
            t0 = time.perf_counter()
            save_checkpoint(src, cfg, state, source, writers=_torch_writers() if source == "dinov3_original" else None)
            made_s = time.perf_counter() - t0
            if args.keep_source:
                write_json(kept, {"model": model, "written_s": made_s})
        size = _bytes(src)
        context = {
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": host(),
            "variant": ("dinov3 " if args.dinov3 else "")
            + args.variant
            + (f" depth {args.depth}" if args.depth else ""),
            "source_format": source,
            "largest_tensor_bytes": largest,
            "dtype": args.dtype,
            "params": cfg.param_count(),
            "file_bytes": size,
            "source_written_s": made_s,
            "sample_s": _SAMPLE_S,
            "baseline_commit": _commit(baseline) if baseline else None,
        }
        print(
            f"# {args.variant} {args.dtype}: {cfg.param_count():,} parameters, {size / 1e9:.2f} GB, written "
            f"by streaming in {made_s:.1f} s",
            flush=True,
        )
        codes = ["", "@baseline"] if baseline else [""]
        runs: dict[str, list[dict]] = {name: [] for name in ["cp", *(t + at for t in targets for at in codes)]}
        for r in range(args.repeats):
            codes.reverse()  # each code first in every other round: the run after cp or another write is slower
            for name in ["cp", *(t + at for t in targets for at in codes)]:
                target, at, _ = name.partition("@")
                fmt, dest = DESTINATIONS.get(target, (None, "copy" + src.suffix))
                dst = work / dest
                _remove(dst)
                if name == "cp":
                    m = measure(["cp", "-r", str(src), str(dst)], False)
                else:
                    flags = [*given, *(shard if fmt.startswith("hf") else [])]
                    flags += ["--accept-assumed", "all"] if fmt.startswith("hf") and source == "big_vision" else []
                    code = {"cwd": baseline, "env": os.environ | {"PYTHONPATH": str(baseline)}} if at else {}
                    m = measure([sys.executable, "-c", _CHILD, str(src), str(dst), fmt, *flags], True, **code)
                _remove(dst)
                runs[name].append(m)
                print(
                    f"round {r + 1} {name:10s} {m['wall_s']:7.2f} s  peak anon {m['peak_anon_bytes'] / 2**20:8.1f} MiB",
                    flush=True,
                )
        cp_s = statistics.median(m["wall_s"] for m in runs["cp"])
        cp_cpu = statistics.median(m["cpu_s"] for m in runs["cp"])
        records = []
        for name, ms in runs.items():
            peak = max(m["peak_anon_bytes"] for m in ms)
            rise = max(m["peak_anon_bytes"] - m["baseline_anon_bytes"] for m in ms)
            wall = statistics.median(m["wall_s"] for m in ms)
            cpu = statistics.median(m["cpu_s"] for m in ms)
            records.append(
                context
                | {
                    "contender": name,
                    "runs": ms,
                    "wall_median_s": wall,
                    "wall_vs_cp": wall / cp_s,
                    "cpu_median_s": cpu,
                    "cpu_vs_cp": cpu / cp_cpu,
                    "peak_anon_bytes": peak,
                    "peak_anon_vs_file": peak / size,
                    "peak_anon_vs_largest_tensor": peak / largest,
                    "rise_anon_bytes": rise,
                    "rise_anon_vs_file": rise / size,
                }
            )
        print(
            "\n| contender | wall (median) | x cp | CPU (median) | x cp | peak anon | x file | x largest tensor "
            "| rise after imports | x file |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for rec in records:
            print(
                f"| {rec['contender']} | {rec['wall_median_s']:.1f} s | {rec['wall_vs_cp']:.2f} | "
                f"{rec['cpu_median_s']:.2f} s | {rec['cpu_vs_cp']:.1f} | "
                f"{rec['peak_anon_bytes'] / 2**20:.0f} MiB | {rec['peak_anon_vs_file']:.3f} | "
                f"{rec['peak_anon_vs_largest_tensor']:.2f} | "
                f"{rec['rise_anon_bytes'] / 2**20:.0f} MiB | {rec['rise_anon_vs_file']:.3f} |"
            )
        print(
            f"\nCPU: {context['machine']['cpu']}; flags: {', '.join(context['machine']['cpu_flags'] or [])}; "
            f"cores: {context['machine']['cores']}"
        )
        if args.out:
            report.append_jsonl(records, args.out)
    finally:
        if args.dir:
            kept_src = [] if args.keep_source else [src, kept]
            for path in [*kept_src, work / ("copy" + src.suffix), *(work / d for _, d in DESTINATIONS.values())]:
                _remove(path)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
