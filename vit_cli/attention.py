"""`vit attention IMAGE... --checkpoint CKPT`: what a trained ViT looks at, as PNG overlays and .npy arrays.

Per image STEM, written to --out:
  STEM_attention.png       the image, then one panel per map (per head of the chosen block plus the
                           head-fused map, or one fused map per block with --layer all; the MAP probe;
                           the rollout), each overlaid on the image; colours scaled per panel. Bounded
                           whatever the depth and head count: at most FIGURE_BLOCKS blocks and
                           FIGURE_HEADS heads, evenly spaced (``spread``; the choice printed and in the
                           JSON's ``figure``), so at most 16 panels, 2 rows of 8: 1600 x 480 px
  STEM_overlay_blockNN.png the head-fused (or --head H) map of each chosen block, at the model's input size
  STEM_overlay_probe.png   the MAP probe's map (pool='map' only), input size
  STEM_overlay_rollout.png the rollout map, input size
  STEM_raw.npy             [layers, N, h, w] float32: each head's share of attention on every patch
  STEM_probe.npy           [N, h, w] float32 (pool='map' only)
  STEM_rollout.npy         [h, w] float32
  STEM_attention.json      what is shown, preprocessing, prediction, prefix-token shares, file names
The arithmetic is ``vit_common.attention_maps`` (see its docstring for rollout and for what each pooling shows).
A NaFlex model (a patch budget, ``--max-patches``) runs each image alone at its own aspect ratio with exactly
its h x w patches: its input size and grid are that image's (``vit_common.naflex.resize``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from vit_cli.convert import add_checkpoint_arguments, checkpoint_options
from vit_cli.flags import add_image_flags
from vit_common.attention_maps import shares, spread

PANEL_PX = (200, 240)  # width, height of one figure panel in pixels (figure dpi 100)
MAX_COLS = 8
FIGURE_BLOCKS = 12  # blocks drawn in the figure at most (every block still gets its overlay and array)
FIGURE_HEADS = 12  # heads drawn in the figure at most
ALPHA = 0.6  # opacity of the attention colours over the image
CMAP = "inferno"


def _layer(s: str) -> int | str:
    if s == "all":
        return s
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layer {s!r}: expected a block index or 'all'") from None


def _head(s: str) -> int | str:
    if s in ("mean", "max", "min"):
        return s
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--head {s!r}: expected a head index, mean, max or min") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attention",
        help="attention maps and attention rollout of a trained checkpoint on images",
        description="Write attention maps (per head, for one block or all blocks) and attention rollout "
        "(Abnar & Zuidema 2020) of IMAGE(s) as PNG overlays and .npy arrays. A checkpoint is required: "
        "a randomly initialised ViT attends almost uniformly, so its maps show noise, not the image.",
    )
    p.add_argument(
        "images", nargs="+", metavar="IMAGE", help="image files, or folders searched for images (PNG, JPEG, ...)"
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint file or folder (config read from it)")
    add_checkpoint_arguments(p)
    p.add_argument("--framework", choices=("jax", "torch"), default="jax", help="twin to run (default jax)")
    p.add_argument(
        "--layer",
        type=_layer,
        default=-1,
        help="block whose raw maps are drawn: index (negative counts from the end; default -1, "
        "the last) or 'all' (one head-fused map per block)",
    )
    p.add_argument(
        "--head",
        type=_head,
        default="mean",
        help="head index, or the head fusion 'mean' (default, as the paper), 'max' or 'min'; used "
        "by rollout and by the fused panels; a head index draws only that head",
    )
    p.add_argument(
        "--method",
        choices=("raw", "rollout", "both"),
        default="both",
        help="raw attention of the chosen block(s), attention rollout over all blocks, or both",
    )
    add_image_flags(p)
    p.add_argument("--out", default="attention", help="output folder (default ./attention)")
    p.add_argument("--json", action="store_true", help="print one JSON list (one object per image)")
    p.set_defaults(func=run)


def _forward(framework: str, model, images: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(logits [B, K] float64, attention intermediates as float64 numpy) for images [B, H, W, C]."""
    if framework == "jax":
        from vit_jax.runner import intermediates
    else:
        from vit_torch.runner import intermediates
    logits, out = intermediates(model, images)
    return np.asarray(logits, np.float64), {
        k: np.asarray(v, np.float64) for k, v in out.items() if k.startswith("attn")
    }


def _share_text(share: dict) -> str:
    parts = [f"patches {share['patches']:.0%}"]
    if "cls" in share:
        parts.append(f"cls {share['cls']:.0%}")
    if "dist" in share:
        parts.append(f"dist {share['dist']:.0%}")
    if "registers" in share:
        parts.append(f"regs {sum(share['registers']):.0%}")
    return ", ".join(parts)


def _colour(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Patch grid [h, w] -> RGB [H, W, 3] in [0, 1]: upsampled, scaled min..max, coloured with CMAP."""
    from matplotlib import colormaps

    from vit_common.attention_maps import upsample

    m = upsample(grid, size)
    span = m.max() - m.min()
    return colormaps[CMAP]((m - m.min()) / span if span > 0 else np.zeros_like(m))[..., :3]


def overlay(image: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Image [H, W, C] in [0, 1] with a patch map [h, w] blended on top: uint8 RGB [H, W, 3]."""
    rgb = np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image
    mixed = (1 - ALPHA) * rgb + ALPHA * _colour(grid, image.shape[:2])
    return np.clip(np.round(mixed * 255), 0, 255).astype(np.uint8)


def panel_grid(n: int) -> tuple[int, int]:
    """(rows, columns) of the figure for n panels: at most MAX_COLS columns."""
    cols = min(n, MAX_COLS)
    return math.ceil(n / cols), cols


def _write_png(path: Path, rgb: np.ndarray) -> None:
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    from vit_common.system.io import PNG_TEXT, atomic_write

    info = PngInfo()
    for key, text in PNG_TEXT.items():
        info.add_text(key, text)
    atomic_write(path, lambda tmp: Image.fromarray(rgb).save(tmp, format="PNG", pnginfo=info))


def _write_npy(path: Path, arr: np.ndarray) -> None:
    from vit_common.system.io import atomic_write

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(arr, np.float32))

    atomic_write(path, write)


def write_figure(path: Path, image: np.ndarray, panels: list[tuple[str, np.ndarray]], title: str) -> None:
    """One PNG: the image, then each (title, patch grid [h, w]) overlaid on it; PANEL_PX per panel."""
    from matplotlib.figure import Figure

    from vit_common.system.io import PNG_TEXT, atomic_write

    rows, cols = panel_grid(len(panels) + 1)
    fig = Figure(figsize=(cols * PANEL_PX[0] / 100, rows * PANEL_PX[1] / 100), dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    shown = image[..., 0] if image.shape[-1] == 1 else image
    for ax, (name, grid) in zip(axes, [("input", None)] + panels, strict=False):
        ax.imshow(shown, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        if grid is not None:
            ax.imshow(_colour(grid, image.shape[:2]), alpha=ALPHA, interpolation="nearest")
        ax.set_title(name, fontsize=8)
    for ax in axes:
        ax.set_axis_off()
    fig.suptitle(title, fontsize=8)
    fig.subplots_adjust(
        left=0.01, right=0.99, bottom=0.01, top=1 - 0.6 / (rows * PANEL_PX[1] / 100), wspace=0.05, hspace=0.4
    )
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100, metadata=PNG_TEXT))


def _selected(per_head: np.ndarray, head: int | str) -> np.ndarray:
    """The map a --head value picks from per-head distributions [N, L]: one head, or the fused rows."""
    from vit_common.attention_maps import fused_rows

    return per_head[head] if isinstance(head, int) else fused_rows(per_head, head)


def _image_outputs(
    b: int, image: np.ndarray, maps, cfg, args, out: Path, stem: str, figure: dict
) -> tuple[list, dict, list]:
    """Write one image's overlays and arrays: (figure panels, shares per map, files written); the figure
    panels only of the blocks and heads in ``figure`` ({"blocks": [...], "heads": [...]})."""
    from vit_common.attention_maps import split_tokens

    def grid(dist: np.ndarray) -> np.ndarray:  # [..., L] -> patch grid [..., h, w]
        return split_tokens(dist, cfg).patches

    head, panels, share, files = args.head, [], {}, []
    fusion = head if isinstance(head, str) else f"head {head}"
    sources = []  # (key, label, per-head [N, L] or None, selected [L], draw every head)
    if args.method in ("raw", "both"):
        sources += [
            (f"block{layer:02d}", f"block {layer}", maps.raw[b, j], None, len(maps.layers) == 1)
            for j, layer in enumerate(maps.layers)
        ]
        if maps.probe is not None:
            sources.append(("probe", "MAP probe", maps.probe[b], None, True))
    if args.method in ("rollout", "both"):
        sources.append(("rollout", f"rollout ({fusion})", None, maps.rollout[b], False))
    for key, label, per_head, selected, every_head in sources:
        if per_head is not None:
            selected = _selected(per_head, head)
            share[key] = {"heads": [shares(d, cfg) for d in per_head], str(head): shares(selected, cfg)}
            if every_head and isinstance(head, str):
                panels += [
                    (f"{label} head {n}\n{_share_text(shares(per_head[n], cfg))}", grid(per_head[n]))
                    for n in figure["heads"]
                ]
        else:
            share[key] = shares(selected, cfg)
        name = label if per_head is None else f"{label} {fusion}"
        if not key.startswith("block") or int(key[5:]) in figure["blocks"]:
            panels.append((f"{name}\n{_share_text(shares(selected, cfg))}", grid(selected)))
        files.append(out / f"{stem}_overlay_{key}.png")
        _write_png(files[-1], overlay(image, grid(selected)))
    arrays = {
        "raw": maps.raw[b] if args.method != "rollout" else None,
        "probe": maps.probe[b] if maps.probe is not None and args.method != "rollout" else None,
        "rollout": maps.rollout[b] if args.method != "raw" else None,
    }
    for key, arr in arrays.items():
        if arr is not None:
            files.append(out / f"{stem}_{key}.npy")
            _write_npy(files[-1], grid(arr))
    return panels, share, files


def _naflex_runs(args, model, preprocess, files: list, layers: list[int]) -> list:
    """A NaFlex model's images, each run alone at its own aspect ratio (``vit_common.naflex.resize``, at
    most ``preprocess.max_patches`` patches) with exactly its h x w patches, so no padding enters its maps:
    per image (pixels [H, W, C] float32 in [0, 1], its ``AttentionMaps``, the config whose grid is its
    (h, w), logits [K], 0). The budget's memory is checked first (``vit_common.naflex.check_model``)."""
    from vit_common.attention_maps import attention_maps
    from vit_common.data.images import normalize, open_image, to_array, to_channels
    from vit_common.naflex import check_model, patchify, resize, stack_patches

    cfg, n, (p, _) = model.cfg, preprocess.max_patches, model.cfg.patch_size
    check_model(cfg, n, 1, str(args.checkpoint))
    runs = []
    for path in files:
        try:
            image = resize(to_channels(open_image(path), cfg.in_chans), p, n, preprocess.interpolation)
            pixels = to_array(image, cfg.in_chans)  # uint8 [H, W, C]
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
        hw = (pixels.shape[0] // p, pixels.shape[1] // p)
        batch = stack_patches([(patchify(normalize(pixels, preprocess), (p, p)), hw)], hw[0] * hw[1])
        logits, inter = _forward(args.framework, model, batch)
        own = cfg.replace(image_size=pixels.shape[:2])  # the maps' patch grid (h, w); the model is unchanged
        runs.append(
            (pixels.astype(np.float32) / 255.0, attention_maps(own, inter, layers, args.head), own, logits[0], 0)
        )
    return runs


def run(args: argparse.Namespace) -> int:
    from vit_cli.flags import values
    from vit_common.attention_maps import attention_maps
    from vit_common.data.images import Preprocess, list_images, load_image, normalize
    from vit_common.system.io import write_json
    from vit_compare.run_model import class_names, load_with_info

    files = list_images(args.images)
    stems = [p.stem for p in files]
    if len(set(stems)) != len(stems):
        raise ValueError(f"images {[str(f) for f in files]}: names without suffix must differ (outputs use them)")
    model, info = load_with_info(
        args.checkpoint, args.framework, checkpoint_options(args), values(Preprocess, args), args.classes
    )
    cfg = model.cfg
    if args.layer == "all":
        layers = list(range(cfg.depth))
    elif -cfg.depth <= args.layer < cfg.depth:
        layers = [args.layer % cfg.depth]
    else:
        raise ValueError(f"--layer {args.layer}: the model has blocks 0..{cfg.depth - 1}")
    if info.preprocess.max_patches is None:
        pixels = np.stack([load_image(p, cfg.image_size, cfg.in_chans, info.preprocess) for p in files])  # uint8
        logits, inter = _forward(args.framework, model, normalize(pixels, info.preprocess))
        maps = attention_maps(cfg, inter, layers, args.head)
        runs = [(pixels[b].astype(np.float32) / 255.0, maps, cfg, logits[b], b) for b in range(len(files))]
    else:
        runs = _naflex_runs(args, model, info.preprocess, files, layers)
    maps = runs[0][1]
    shows = {
        k: v
        for k, v in maps.shows.items()
        if not ((args.method == "rollout" and k in ("raw", "probe")) or (args.method == "raw" and k == "rollout"))
    }
    query = {
        "token": "class token's row",
        "map": "blocks: mean over patch queries; probe and rollout: MAP probe",
    }.get(cfg.pool, f"mean over patch queries (pool={cfg.pool!r})")
    preprocess = f"{info.describe(cfg.image_size)} ({info.preprocess_source})"
    names = class_names(info, cfg.num_classes)
    figure_maps = {
        "blocks": [maps.layers[i] for i in spread(len(maps.layers), FIGURE_BLOCKS)],
        "heads": spread(cfg.num_heads, FIGURE_HEADS),
    }
    out = Path(args.out)
    reports = []
    for (image, maps, grid_cfg, row, b), path, stem in zip(runs, files, stems, strict=True):
        panels, share, written = _image_outputs(b, image, maps, grid_cfg, args, out, stem, figure_maps)
        figure, summary = out / f"{stem}_attention.png", out / f"{stem}_attention.json"
        write_figure(figure, image, panels, f"{Path(path).name}: {query}; colours scaled per panel")
        report = {
            "image": str(path),
            "checkpoint": str(args.checkpoint),
            "framework": args.framework,
            "config": {
                "pool": cfg.pool,
                "class_token": cfg.class_token,
                "reg_tokens": cfg.reg_tokens,
                "grid": list(grid_cfg.grid),
                "num_heads": cfg.num_heads,
                "depth": cfg.depth,
            },
            "preprocess": preprocess,
            "layers": list(maps.layers),
            "figure": figure_maps,
            "head": args.head,
            "shows": shows,
            "shares": share,
            "files": [str(f) for f in [figure, *written, summary]],
        }
        if cfg.num_classes and cfg.pool != "none":
            p = np.exp(row - row.max())
            k = int(p.argmax())
            report["prediction"] = {"class": names[k], "index": k, "probability": float(p.max() / p.sum())}
        write_json(summary, report, indent=1)
        reports.append(report)
    if args.json:
        print(json.dumps(reports))
        return 0
    (h, w), (gh, gw) = cfg.image_size, cfg.grid
    size = f"{h}x{w} px in {gh}x{gw} patches" if info.preprocess.max_patches is None else "each image its own grid"
    print(
        f"vit attention: {args.framework} twin, {args.checkpoint} (pool={cfg.pool!r}, class token "
        f"{'yes' if cfg.class_token else 'no'}, {cfg.reg_tokens} registers, {size})"
    )
    print(f"  input: {preprocess}")
    for k, v in shows.items():
        print(f"  {k}: {v}")
    if args.method != "rollout" and len(figure_maps["blocks"]) < len(maps.layers):
        print(
            f"  figure: blocks {', '.join(map(str, figure_maps['blocks']))} of {len(maps.layers)} (at most "
            f"{FIGURE_BLOCKS}, evenly spaced; every block's overlay and array are written)"
        )
    if len(maps.layers) == 1 and isinstance(args.head, str) and len(figure_maps["heads"]) < cfg.num_heads:
        print(
            f"  figure: heads {', '.join(map(str, figure_maps['heads']))} of {cfg.num_heads} (at most "
            f"{FIGURE_HEADS}, evenly spaced; the .npy holds every head)"
        )
    for r in reports:
        pred = r.get("prediction")
        pred = f" predicted class {pred['class']} (p={pred['probability']:.2f})" if pred else ""
        grid = "" if info.preprocess.max_patches is None else " {}x{} patches,".format(*r["config"]["grid"])
        print(f"  {r['image']}:{grid}{pred}")
        for k, s in r["shares"].items():
            print(f"    {k}: {_share_text(s.get(str(args.head), s))}")
        print(f"    wrote {', '.join(Path(f).name for f in r['files'])} in {out}")
    return 0
