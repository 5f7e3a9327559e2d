"""Benchmark records -> a terminal table, JSON lines, and the markdown table of docs/benchmarks.md.

Headline numbers are ratios measured in one interleaved run: ``rel_speed`` (the fastest contender of
a (variant, mode) group / this one; 1.00 = fastest), ``vit_jax`` against the fastest torch peer, and
``vit_torch`` against timm. Absolute times on a shared CPU mean little; ratios hold.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from vit_common.system import in_place, io

PAGE_START, PAGE_END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"


def _groups(records: Iterable[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        out.setdefault((r["variant"], r["mode"]), []).append(r)
    return out


def _fmt(v, spec: str, missing: str = "-") -> str:
    return missing if v is None else format(v, spec)


def terminal_table(records: Sequence[dict]) -> str:
    """One line per contender: time, spread, images/s, GFLOP/s, MFU, relative speed, memory."""
    head = (
        f"{'variant':8s} {'mode':5s} {'contender':18s} {'batch':>5s} {'median ms':>10s} {'spread':>7s} "
        f"{'img/s':>9s} {'GFLOP/s':>9s} {'MFU mm':>7s} {'MFU peak':>8s} {'rel':>5s} {'mem MiB':>8s}"
    )
    lines = [head, "-" * len(head)]
    for (variant, mode), recs in _groups(records).items():
        for r in recs:
            if r.get("error"):
                lines.append(f"{variant:8s} {mode:5s} {r['contender']:18s} error: {r['error']}")
                continue
            mem = r.get("memory_bytes")
            lines.append(
                f"{variant:8s} {mode:5s} {r['contender']:18s} {r['batch']:5d} {r['median_s'] * 1e3:10.2f} "
                f"{r['spread'] * 100:6.1f}% {_fmt(r.get('images_per_s'), '9.1f'):>9s} "
                f"{r['flops_per_s'] / 1e9:9.1f} {r['mfu_matmul']:7.1%} "
                f"{_fmt(r['mfu_datasheet'], '8.1%'):>8s} "
                f"{_fmt(r.get('rel_speed'), '5.2f'):>5s} {_fmt(mem and mem / 2**20, '8.0f'):>8s}"
            )
    return "\n".join(lines)


def headlines(recs: Sequence[dict]) -> dict[str, float | None]:
    """The targets of one (variant, mode) group.

    ``jax_vs_torch``: fastest torch peer's median / vit_jax's median (>= 1: vit_jax is fastest);
    ``jax_mfu``: vit_jax FLOP/s / matmul FLOP/s; ``torch_vs_timm``: timm's median / vit_torch's.
    """
    by = {r["contender"]: r for r in recs if r["kind"] == "model" and not r.get("error")}
    jax_name = next((n for n in by if n.startswith("vit_jax")), None)
    torch_peers = [r["median_s"] for r in by.values() if r["framework"] == "torch"]
    jax = by.get(jax_name)
    return {
        "jax_vs_torch": min(torch_peers) / jax["median_s"] if jax and torch_peers else None,
        "jax_mfu": jax["mfu_matmul"] if jax else None,
        "torch_vs_timm": by["timm"]["median_s"] / by["vit_torch"]["median_s"]
        if "timm" in by and "vit_torch" in by
        else None,
    }


def markdown_table(records: Sequence[dict]) -> str:
    """README table: images/s and speed relative to the fastest contender, then the target ratios."""
    names = list(dict.fromkeys(r["contender"] for r in records if r["kind"] == "model"))
    head = (
        ["variant", "mode", "batch"]
        + [f"`{n}`" for n in names]
        + ["`vit_jax` / fastest torch", "`vit_jax` % of matmul", "`vit_torch` / timm"]
    )
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (variant, mode), recs in _groups(records).items():
        by = {r["contender"]: r for r in recs}
        cells = [variant, mode, str(recs[0]["batch"])]
        for n in names:
            r = by.get(n)
            cells.append("n/a" if r is None or r.get("error") else f"{r['rel_speed']:.2f} ({r['images_per_s']:.1f}/s)")
        h = headlines(recs)
        cells += [
            _fmt(h["jax_vs_torch"], ".2f"),
            _fmt(h["jax_mfu"] and h["jax_mfu"] * 100, ".0f"),
            _fmt(h["torch_vs_timm"], ".2f"),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    r0 = records[0]
    m, v = r0["machine"], r0["versions"]
    shown = [f for f in m.get("cpu_flags") or () if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")]
    device = f"{m['device']} ({', '.join(shown)})" if m["platform"] == "cpu" and shown else m["device"]
    note = (
        f"{device}, {m['cores']} cores, {r0['dtype']}; jax {v['jax']}, torch {v['torch']}, "
        f"timm {v['timm']}, transformers {v['transformers']}; {r0['time'][:10]}. Cells: speed relative "
        f"to the fastest contender (1.00 = fastest) and images/s; median of {r0['repeats']} interleaved "
        "runs. Training = forward + backward + AdamW."
    )
    return "\n".join(rows) + "\n\n" + note + "\n"


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` atomically: the file is written whole or not at all."""
    io.write_text(path, text)


def write_jsonl(records: Sequence[dict], path: str | Path) -> None:
    """One JSON object per line (sorted keys), written atomically."""
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def append_jsonl(records: Sequence[dict], path: str | Path) -> None:
    """Append one JSON object per line (sorted keys) to ``path`` (parents made) in one write, and
    flush it to disk: records appended as each benchmark group finishes survive a run stopped later. An
    existing file is appended to, whoever wrote it: a benchmark's ``--out`` asks for that."""
    with io.overwriting(), in_place.open_log(path) as f:
        f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def update_page(page: str | Path, table: str) -> None:
    """Replace the text between the benchmark markers of the markdown file ``page`` with ``table``.

    Raises:
        ValueError: the markers are missing.
    """
    text = Path(page).read_text()
    pattern = re.compile(re.escape(PAGE_START) + ".*?" + re.escape(PAGE_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{page}: no '{PAGE_START}' ... '{PAGE_END}' block to replace")
    new = pattern.sub(lambda _: f"{PAGE_START}\n{table}{PAGE_END}", text)
    with io.overwriting():  # --page asks for this page's block to be replaced
        write_text(page, new)
