"""The parity report as pictures: per-layer differences between the twins, one attention map side by side.

``write_parity_report(out_dir, rows, maps)`` writes into ``out_dir``:

  diffs.png   one panel per (what, kind) group of rows (e.g. intermediates relative to max |reference|,
              attention probabilities absolute): max and mean |jax - torch| per row, log scale, the
              tolerance from ``vit_common.tolerance`` as a dashed line, rows over it marked
  maps.png    (when ``maps`` is given) the JAX map, the torch map (one colour scale) and jax - torch
              (a symmetric diverging scale)
  index.html  both pictures and the table of numbers

Input (plain data, JSON-serialisable; ``diff_row`` builds a row from two arrays):

  rows: sequence, in forward order, of mappings with keys
      name      str, e.g. 'block03' or 'attn03'
      what      'tensor' | 'attention' | 'gradient' (the tolerance table's row)
      dtype     compute dtype, e.g. 'float32'
      max_abs   max |a - ref|;  mean_abs  mean |a - ref|;  scale  max |ref|
      kind      'rel' (bound on max_abs / scale) | 'abs' (bound on max_abs);  bound  float
  maps: None or a mapping with keys
      title     str, e.g. 'attn05, image 0, head 2'
      jax, torch  2-D arrays of one shape (e.g. one head's probabilities [L, L])
      bound     optional float: the absolute bound the difference panel is judged against
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from vit_common.system.io import PNG_TEXT, atomic_write, write_text
from vit_common.tolerance import Comparison, compare

MAX_WIDTH = 40.0  # inches (4,000 px at 100 dpi): diffs.png's width for any depth; the panels are fixed in number
ROW_KEYS = ("name", "what", "dtype", "max_abs", "mean_abs", "scale", "kind", "bound")


def diff_row(name: str, a, ref, what: str, dtype: str) -> dict:
    """One report row comparing ``a`` (JAX) against ``ref`` (torch) under the tolerance table.

    Returns a dict with ROW_KEYS plus 'rel' and 'ok' (floats, str and bool only).

    Raises:
        ValueError: shapes differ. KeyError: no bound for (what, dtype).
    """
    return {"name": name, "what": what, "dtype": dtype} | compare(name, a, ref, what, dtype).to_dict()


def _check_rows(rows: Sequence[Mapping]) -> None:
    if not rows:
        raise ValueError("parity report: no rows to report")
    for i, r in enumerate(rows):
        missing = [k for k in ROW_KEYS if k not in r]
        if missing:
            raise ValueError(f"parity report row {i} ({r.get('name', '?')}): missing keys {missing}")
        if r["kind"] not in ("rel", "abs"):
            raise ValueError(f"parity report row {r['name']}: kind={r['kind']!r}, expected 'rel' or 'abs'")


def _check_maps(maps: Mapping) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(maps["jax"], np.float64), np.asarray(maps["torch"], np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"parity report maps: shapes {a.shape} and {b.shape}, expected two equal 2-D arrays")
    return a, b


def _comparison(r: Mapping) -> Comparison:
    rel = r["max_abs"] / r["scale"] if r["scale"] > 0 else r["max_abs"]
    return Comparison(r["name"], r["max_abs"], rel, r["kind"], r["bound"])


def _groups(rows: Sequence[Mapping]) -> dict[tuple[str, str], list[Mapping]]:
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for r in rows:
        groups.setdefault((r["what"], r["kind"]), []).append(r)
    return groups


def _save(fig, path: Path) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100, metadata=PNG_TEXT))


def plot_diffs(path: str | os.PathLike, rows: Sequence[Mapping], title: str) -> None:
    """Write diffs.png: per (what, kind) group, max and mean difference per row against the bound.

    'rel' rows are drawn as |diff| / max |reference|, 'abs' rows as |diff|, so each panel shares the
    units of its bound. Exact zeros are drawn on the panel's floor (hollow markers). The picture is at
    most ``MAX_WIDTH`` inches wide whatever the number of rows.
    """
    from matplotlib.figure import Figure

    groups = _groups(rows)
    width = min(max(6.0, 0.28 * max(len(g) for g in groups.values()) + 2.0), MAX_WIDTH)
    fig = Figure(figsize=(width, 3.2 * len(groups)), dpi=100)
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    for ax, ((what, kind), group) in zip(axes, groups.items(), strict=True):
        div = np.array([r["scale"] if kind == "rel" and r["scale"] > 0 else 1.0 for r in group])
        mx = np.array([r["max_abs"] for r in group]) / div
        mean = np.array([r["mean_abs"] for r in group]) / div
        bound = np.array([r["bound"] for r in group])
        positive = np.concatenate([mx[mx > 0], mean[mean > 0], bound])
        floor = 10.0 ** (np.floor(np.log10(positive.min())) - 1)
        x = np.arange(len(group))
        for vals, label, colour in ((mx, "max", "C0"), (mean, "mean", "C1")):
            shown = np.where(vals > 0, vals, floor)
            ax.plot(x, shown, "-", color=colour, lw=1, label=f"{label} |jax - torch|")
            ax.plot(x[vals > 0], vals[vals > 0], "o", color=colour, ms=4)
            ax.plot(x[vals == 0], np.full((vals == 0).sum(), floor), "o", mfc="none", color=colour, ms=5)
        ax.plot(x, bound, "--", color="C3", lw=1.2, drawstyle="steps-mid", label="tolerance")
        fail = mx > bound
        if fail.any():
            ax.plot(x[fail], mx[fail], "x", color="C3", ms=9, mew=2, label="over tolerance")
        ax.set_yscale("log")
        ax.set_xticks(x, [r["name"] for r in group], rotation=90, fontsize=7)
        unit = "|diff| / max |torch|" if kind == "rel" else "|diff|"
        ax.set_ylabel(unit, fontsize=8)
        dtypes = sorted({r["dtype"] for r in group})
        ax.set_title(f"{what} ({', '.join(dtypes)}): {unit}; hollow = exactly 0", fontsize=9)
        ax.legend(fontsize=7, loc="best", framealpha=0.8)
        ax.grid(True, which="major", axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, Path(path))


def plot_maps(path: str | os.PathLike, maps: Mapping) -> None:
    """Write maps.png: JAX map, torch map (shared colour scale) and jax - torch (symmetric scale)."""
    from matplotlib.figure import Figure

    a, b = _check_maps(maps)
    diff = a - b
    lim = float(np.abs(diff).max()) or 1e-30
    lo, hi = float(min(a.min(), b.min())), float(max(a.max(), b.max()))
    fig = Figure(figsize=(12, 4), dpi=100)
    axes = fig.subplots(1, 3)
    panels = (
        (a, "JAX", "viridis", lo, hi),
        (b, "PyTorch", "viridis", lo, hi),
        (diff, "JAX - PyTorch", "RdBu_r", -lim, lim),
    )
    for ax, (arr, name, cmap, vmin, vmax) in zip(axes, panels, strict=True):
        im = ax.imshow(arr, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, format="%.1e" if name.startswith("JAX -") else None)
    verdict = f"max |diff| {np.abs(diff).max():.2e}"
    if maps.get("bound") is not None:
        verdict += f", bound {maps['bound']:.0e}: {'ok' if np.abs(diff).max() <= maps['bound'] else 'FAIL'}"
    fig.suptitle(f"{maps.get('title', '')}  ({verdict})", fontsize=10)
    fig.tight_layout()
    _save(fig, Path(path))


def _html(rows: Sequence[Mapping], title: str, meta: Mapping[str, str], pictures: list[str]) -> str:
    esc = html.escape
    comps = [_comparison(r) for r in rows]
    failed = [c.name for c in comps if not c.ok]
    verdict = f"{len(rows) - len(failed)} of {len(rows)} within tolerance" + (
        f"; over tolerance: {', '.join(failed)}" if failed else ""
    )
    meta_html = "".join(f"<tr><th>{esc(str(k))}</th><td>{esc(str(v))}</td></tr>" for k, v in meta.items())
    body = []
    for r, c in zip(rows, comps, strict=True):
        measured = c.rel if c.kind == "rel" else c.max_abs
        body.append(
            f"<tr class='{'ok' if c.ok else 'fail'}'><td>{esc(r['name'])}</td><td>{esc(r['what'])}</td>"
            f"<td>{esc(r['dtype'])}</td><td>{r['max_abs']:.3e}</td><td>{r['mean_abs']:.3e}</td>"
            f"<td>{r['scale']:.3e}</td><td>{measured:.3e} ({c.kind})</td><td>{c.bound:.0e}</td>"
            f"<td>{'ok' if c.ok else 'FAIL'}</td></tr>"
        )
    imgs = "".join(f"<p><img src='{esc(p)}' alt='{esc(p)}'></p>" for p in pictures)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;font-size:13px;text-align:right}} th{{text-align:left}}
tr.fail td{{background:#fdd}} img{{max-width:100%}}</style></head>
<body><h1>{esc(title)}</h1><p><b>{esc(verdict)}</b></p>
<table>{meta_html}</table>{imgs}
<table><tr><th>name</th><th>what</th><th>dtype</th><th>max |jax - torch|</th><th>mean |jax - torch|</th>
<th>max |torch|</th><th>measured</th><th>bound</th><th></th></tr>
{chr(10).join(body)}
</table></body></html>
"""


def write_parity_report(
    out_dir: str | os.PathLike,
    rows: Sequence[Mapping],
    maps: Mapping | None = None,
    *,
    title: str = "JAX vs PyTorch parity",
    meta: Mapping[str, str] | None = None,
) -> dict[str, Path]:
    """Write diffs.png, maps.png (if ``maps``) and index.html into ``out_dir`` (created if needed).

    ``rows`` and ``maps`` are described in the module docstring; ``meta`` is shown above the pictures
    (checkpoint, device, versions...). Every file is written atomically. Returns {'index', 'diffs'
    and 'maps' if drawn: path}.

    Raises:
        ValueError: no rows, a row without the required keys, or maps that are not two equal 2-D arrays.
    """
    _check_rows(rows)
    if maps is not None:
        _check_maps(maps)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"diffs": out / "diffs.png"}
    plot_diffs(paths["diffs"], rows, title)
    if maps is not None:
        paths["maps"] = out / "maps.png"
        plot_maps(paths["maps"], maps)
    page = _html(rows, title, dict(meta or {}), [p.name for k, p in paths.items()])
    paths["index"] = out / "index.html"
    write_text(paths["index"], page)
    return paths
