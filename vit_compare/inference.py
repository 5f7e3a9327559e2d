"""Inference parity: load one checkpoint into both twins (and optionally timm or transformers), run the
same images through each, and compare every intermediate under the one tolerance table.

The computation is ``run_parity(...) -> ParityResult`` (a plain dataclass; ``to_dict()`` for JSON);
``format_table`` is its text, ``report_maps`` the attention maps ``vit_compare.report`` draws.
The twins and the reference libraries are imported inside ``run_parity``, so importing this module loads no
framework.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.provenance import assumed_summary, assumption_block, provenance_table
from vit_common.tolerance import Comparison, compare


@dataclass
class Row:
    """One compared tensor.

    ``name``: intermediate key of ``forward_intermediates`` ('patch_embed', 'pos_embed', 'blockNN',
    'attnNN', 'norm', 'attn_pool', 'pre_logits', 'logits'); ``what``: 'tensor' or 'attention' (which
    tolerance applies); ``dtype`` of the run; ``twins``: JAX twin vs torch twin (torch is the
    reference; its ``mean_abs`` is mean |JAX - torch|, its ``scale`` max |torch|); ``against``: the
    --against library vs the torch twin, or None where that library exposes no such tensor; ``constant``:
    the torch twin's tensor holds one value throughout (every logit 0 after a zero head): agreement on it
    proves nothing about the weights before it, so the verdict names it as uninformative.
    """

    name: str
    what: str
    dtype: str
    twins: Comparison
    against: Comparison | None = None
    constant: bool = False

    @property
    def ok(self) -> bool:
        return self.twins.ok and (self.against is None or self.against.ok)

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-able row: name, what, dtype, max_abs, mean_abs, scale (max |torch|), kind, bound,
        rel, ok (JAX vs torch; ``ok`` covers --against too) and against (None or its max_abs, rel, ok)."""
        t, a = self.twins, self.against
        return {
            "name": self.name,
            "what": self.what,
            "dtype": self.dtype,
            "max_abs": t.max_abs,
            "mean_abs": t.mean_abs,
            "scale": t.scale,
            "kind": t.kind,
            "bound": t.bound,
            "rel": t.rel,
            "ok": self.ok,
            "against": None if a is None else {"max_abs": a.max_abs, "rel": a.rel, "ok": a.ok},
            "informative": not self.constant,
        }


@dataclass
class ParityResult:
    """What ``run_parity`` found.

    Fields: ``checkpoint`` path, ``format`` read, ``variant``, ``dtype`` of the run, ``images`` (file
    names, or 'generated-i'), ``rows`` (one ``Row`` per intermediate in forward order: per-layer rows
    are 'blockNN' and 'attnNN'), ``agreement`` (fraction of images whose top-1 class is the same in both
    twins; None without a head), ``against`` (library name or None) and ``against_agreement`` (its top-1
    agreement with the torch twin), ``conversion`` (the read report as a dict), ``outputs`` (only with
    ``keep_outputs=True``: {'jax' | 'torch' | library: {name: numpy array}}, attention maps [B, N, L, L]),
    ``assumed`` (config fields the file does not state and the run assumed, each as "name=value"),
    ``head`` (None, or what makes the head uninformative: all zeros, or constant rows).
    ``ok`` is True when every row is within its bound; with ``assumed`` fields that proves the twins
    (and the library) equal to each other under those assumptions, not to the model that wrote the file.
    """

    checkpoint: str
    format: str
    variant: str
    dtype: str
    images: list[str]
    rows: list[Row]
    agreement: float | None
    against: str | None = None
    against_agreement: float | None = None
    conversion: dict = field(default_factory=dict)
    outputs: dict[str, dict[str, np.ndarray]] | None = None
    assumed: list[str] = field(default_factory=list)
    head: str | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def verdict(self) -> str:
        """One line: PASS / FAIL, and what a PASS proves when the config had to be assumed."""
        if not self.ok:
            return "FAIL: " + ", ".join(r.name for r in self.rows if not r.ok) + " beyond tolerance"
        informative = [r.name for r in self.rows if not r.constant]
        constant = [r.name for r in self.rows if r.constant]
        rows = (
            f"; informative rows: {', '.join(informative) or 'none'}; uninformative (one value throughout, "
            f"proving nothing): {', '.join(constant)}"
            + (f" ({self.head})" if self.head else "")
            + (" (top-1 agreement too)" if "logits" in constant else "")
            if constant
            else ""
        )
        if not self.assumed:
            return "PASS: every tensor within its tolerance" + rows
        lib = f" and {self.against}" if self.against else ""
        names = [a.partition("=")[0] for a in self.assumed]
        return (
            f"PASS UNDER ASSUMPTIONS ({assumed_summary(names)}): every tensor within its tolerance, which proves "
            f"the twins{lib} equal to each other with these as assumed, not equal to the model that wrote the "
            "file (it does not state them; pass them with --set / --source-image-size, or --strict to refuse)" + rows
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "format": self.format,
            "variant": self.variant,
            "dtype": self.dtype,
            "images": self.images,
            "ok": self.ok,
            "agreement": self.agreement,
            "against": self.against,
            "against_agreement": self.against_agreement,
            "rows": [r.to_dict() for r in self.rows],
            "conversion": self.conversion,
            "assumed": list(self.assumed),
            "head": self.head,
            "verdict": self.verdict,
        }


def load_images(
    folder: str | Path, image_size: tuple[int, int], chans: int, preprocess, max_images: int | None = None
) -> tuple[np.ndarray, list[str]]:
    """The first ``max_images`` (all if None) images of ``folder`` in sorted order, searched recursively as
    ``vit_common.data.images.list_images`` does (the layouts training reads), as float32 [B, C, H, W] through
    the one image path (``vit_common.data.images.load_image`` and ``normalize`` with ``preprocess``); and their
    paths relative to ``folder``.

    Raises:
        FileNotFoundError: no such folder, or a file. ValueError: no image in it, or an unreadable image (named).
    """
    from vit_common.data.images import list_images, load_image, normalize

    folder = Path(folder)
    if not folder.is_dir():
        what = "a file, not a folder" if folder.exists() else "no such folder"
        raise FileNotFoundError(f"{folder}: {what}; expected a folder of images")
    files = list_images(folder)[:max_images]
    x = normalize(np.stack([load_image(p, image_size, chans, preprocess) for p in files]), preprocess)
    return x.transpose(0, 3, 1, 2), [str(p.relative_to(folder)) for p in files]


def _naflex_images(folder: str | Path, cfg, preprocess, max_images: int | None, where: str):
    """``load_images`` for a NaFlex model (``preprocess.max_patches``): a NaFlex batch (patches float32,
    patch_mask, spatial_shapes; ``vit_common.naflex``) of the images at their own aspect ratios, its
    memory checked (``check_model``, naming ``where``) before any image is read."""
    from vit_common.data.images import list_images, open_image
    from vit_common.naflex import check_model, stack_patches
    from vit_common.naflex import preprocess as naflex

    folder, n = Path(folder), preprocess.max_patches
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of images")
    files = list_images(folder)[:max_images]
    check_model(cfg, n, len(files), where)
    items = [naflex(open_image(p), cfg.patch_size[0], n, cfg.in_chans, preprocess) for p in files]
    return stack_patches(items, n), [str(p.relative_to(folder)) for p in files]


def _top1_agreement(a: np.ndarray, b: np.ndarray) -> float | None:
    """Fraction of rows whose argmax agrees; None without classes, or where a logit is NaN or Inf (an
    argmax of those means nothing)."""
    if a.ndim != 2 or a.shape[-1] < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    return float(np.mean(a.argmax(-1) == b.argmax(-1)))


def _against_timm(cfg, state, x, dtype):
    """timm's model of ``cfg`` (``vit_torch.oracles.timm_model``, from the tensors the timm format writes)
    on ``x``; with ``rope_periods='stored'`` it runs the checkpoint's periods (timm recomputes its own)."""
    import torch

    from vit_common.checkpoints.formats import timm as timm_format
    from vit_torch.oracles import timm_model

    enc = timm_format.FORMAT.encode(cfg, state, Path("oracle.safetensors"), timm_format.FORMAT.write_options())
    cfg_t, state_t = enc.cfg, enc.state
    model = timm_model(cfg_t.replace(param_dtype=dtype), state_t).to(getattr(torch, dtype))
    with torch.no_grad():
        if cfg.rope_periods == "stored":  # the original's numbers: timm's model running the file's periods
            model.rope.periods.copy_(torch.from_numpy(np.asarray(state["rope.periods"])))
        prefix = model.num_prefix_tokens > 0  # timm pairs (patch tokens, prefix tokens) only when there are some
        final, inter = model.forward_intermediates(torch.from_numpy(x), return_prefix_tokens=prefix, output_fmt="NLC")
        out = {f"block{i:02d}": torch.cat(t[::-1], dim=1) if prefix else t for i, t in enumerate(inter)}
        out["norm"] = final
        out["logits"] = model.forward_head(final)
    return {k: v.numpy() for k, v in out.items()}


def _against_transformers(cfg, state, x, dtype, source):
    """transformers' model of ``cfg`` (``vit_torch.oracles.hf_model``: the class of the source folder's
    model type where transformers defines the source format, ``source`` being its report) on ``x``."""
    import torch

    from vit_torch.oracles import hf_model, transformers_outputs

    state = {k: np.asarray(v).astype(dtype) for k, v in state.items()}
    model = hf_model(cfg.replace(param_dtype=dtype), state, fmt=source.format, model_type=source.model_type or None)
    with torch.no_grad():
        out = transformers_outputs(model, torch.from_numpy(x), cfg)
    return {k: v.numpy() for k, v in out.items()}


def run_parity(
    checkpoint: str | Path,
    *,
    dtype: str = "float32",
    images: np.ndarray | str | Path | None = None,
    num_generated: int = 4,
    against: str | None = None,
    keep_outputs: bool = False,
    max_images: int | None = None,
    max_patches: int | None = None,
    **load_options: Any,
) -> ParityResult:
    """Load ``checkpoint`` into both twins (and ``against`` 'timm' | 'transformers'), run ``images`` with
    full matmul precision (no TF32) and compare every intermediate.

    ``images``: [B, C, H, W] floats at the model's image size, a folder (``load_images``: its first
    ``max_images``, with the checkpoint's preprocessing, ``vit_common.checkpoints.metadata.read_info``; a
    NaFlex model's as one NaFlex batch of at most ``max_patches`` patches an image, default its declared
    budget, the twins alone compared), or None for ``num_generated`` seeded standard-normal images.

    ``dtype`` 'float32' or 'float64' (JAX x64 is switched on for the call). ``load_options`` go to
    ``vit_common.checkpoints.convert.load_checkpoint`` (image_size, num_classes, fmt, config overrides).

    Raises:
        ValueError / FileNotFoundError: bad checkpoint, dtype or library name, a library with a NaFlex
            model's images, ``max_patches`` for a fixed-size model or beyond the memory limit
            (``vit_common.naflex.check_model``); ImportError if the --against library is not installed.
    """
    import vit_jax
    import vit_jax.runner
    import vit_torch
    import vit_torch.runner
    from vit_common.checkpoints.convert import load_checkpoint
    from vit_common.checkpoints.formats.timm_naflex import source_name
    from vit_common.checkpoints.metadata import with_overrides
    from vit_jax.formats import READERS as JAX_READERS
    from vit_torch.formats import READERS as TORCH_READERS

    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype={dtype!r}: expected 'float32' or 'float64'")
    if against not in (None, "timm", "transformers"):
        raise ValueError(f"against={against!r}: expected 'timm' or 'transformers'")
    ckpt = load_checkpoint(checkpoint, readers={**JAX_READERS, **TORCH_READERS}, **load_options)
    cfg = ckpt.cfg.replace(dtype=dtype, param_dtype=dtype, attn_impl="explicit")
    state = {k: np.asarray(v).astype(dtype) for k, v in ckpt.state.items()}
    if images is None and against == "transformers" and ckpt.info.preprocess.max_patches is not None:
        raise ValueError(
            f"{checkpoint}: --against transformers on a NaFlex model with generated images: refused, "
            "transformers' NaFlex model takes patches, not fixed-size images; drop --against to compare the twins"
        )
    if images is None:
        images = np.random.default_rng(0).standard_normal((num_generated, cfg.in_chans, *cfg.image_size))
        image_names = [f"generated-{i}" for i in range(num_generated)]
    elif isinstance(images, (str, Path)):
        info = ckpt.info
        try:  # refuses max_patches for a fixed-size model
            info = with_overrides(
                info, {"max_patches": max_patches}, None, bool(source_name(ckpt.report.layout, ckpt.cfg))
            )
        except ValueError as e:
            raise ValueError(f"{checkpoint}: {e}") from e
        for w in info.warnings:
            print(f"vit: warning: {checkpoint}: {w}", file=sys.stderr)
        preprocess = info.preprocess
        if preprocess.max_patches is None:
            images, image_names = load_images(images, cfg.image_size, cfg.in_chans, preprocess, max_images)
        elif against is not None:
            raise ValueError(
                f"{checkpoint}: --against {against} with a NaFlex model's images: refused, the library check takes "
                "fixed-size images; drop --against to compare the twins on them"
            )
        else:
            images, image_names = _naflex_images(images, cfg, preprocess, max_images, str(checkpoint))
    else:
        image_names = [f"image-{i}" for i in range(len(images))]
    if isinstance(images, tuple):  # NaFlex: (patches, patch_mask, spatial_shapes)
        x = twin_x = (images[0].astype(dtype), *images[1:])
    else:
        x = np.asarray(images, dtype)
        twin_x = x.transpose(0, 2, 3, 1)
    with vit_jax.runner.full_precision(x64=dtype == "float64"):  # float64 parameters need x64 when built
        _, out_j = vit_jax.runner.intermediates(vit_jax.from_numpy(cfg, state), twin_x)
    _, out_t = vit_torch.runner.intermediates(vit_torch.from_numpy(cfg, state), twin_x)
    out_a = None
    with vit_torch.runner.full_precision():
        if against == "timm":
            out_a = _against_timm(ckpt.cfg, ckpt.state, x, dtype)
        elif against == "transformers":
            out_a = _against_transformers(ckpt.cfg, ckpt.state, x, dtype, ckpt.report)
    rows = []
    for name, ref in out_t.items():
        what = "attention" if name.startswith("attn") else "tensor"
        a = out_a.get(name) if out_a else None
        against_row = None if a is None else compare(name, a, ref, what, dtype)
        constant = bool(ref.size) and bool(np.all(ref == ref.flat[0]))
        rows.append(Row(name, what, dtype, compare(name, out_j[name], ref, what, dtype), against_row, constant))
    outputs = None
    if keep_outputs:
        outputs = {"jax": out_j, "torch": out_t} | ({against: out_a} if out_a else {})
    return ParityResult(
        checkpoint=str(checkpoint),
        format=ckpt.report.format,
        variant=ckpt.report.variant,
        dtype=dtype,
        images=image_names,
        rows=rows,
        agreement=_top1_agreement(out_j["logits"], out_t["logits"]),
        against=against,
        against_agreement=_top1_agreement(out_a["logits"], out_t["logits"]) if out_a and "logits" in out_a else None,
        conversion=ckpt.report.to_dict(),
        outputs=outputs,
        assumed=[f"{k}={getattr(ckpt.report.config, k)!r}" for k in ckpt.report.assumed],
        head=head_note(ckpt.state),
    )


def head_note(state: dict) -> str | None:
    """What makes a classifier head (head.weight [K, D], head.bias [K]) carry no information, or None:
    all-zero weights (every logit is its bias: a head ``vit convert --num-classes`` replaced) or rows
    all equal with one bias (every class scores alike)."""
    w, b = state.get("head.weight"), state.get("head.bias")
    if w is None or not np.size(w):
        return None
    b = np.zeros(len(w)) if b is None else np.asarray(b)
    if not np.any(w):
        return "the head's weights are all zeros: each logit is its bias; the pre_logits row is the real check"
    if np.all(w == w[:1]) and np.all(b == b.flat[0]):
        return "the head's rows are all equal: every class scores alike; the pre_logits row is the real check"
    return None


def format_table(result: ParityResult) -> str:
    """The result as text: where each config field came from, then one line per intermediate, then the
    verdict."""
    lib = result.against
    head = f"{'tensor':<12}{'max abs':>11}{'rel':>11}{'mean abs':>11}{'bound':>12}  ok"
    if lib:
        head += f"   | {lib + ' max abs':>20}{'rel':>11}  ok"
    config = result.conversion.get("config") or {}
    stored = config.get("rope_periods") == "stored"
    provenance = result.conversion.get("provenance", {})
    assumed = result.conversion.get("assumed", [])
    lines = [f"config of {result.checkpoint} ({result.format}): value, then where it came from"]
    lines += [f"  {line}" for line in provenance_table(config, provenance, assumed)]
    lines += assumption_block(assumed, result.conversion.get("assumptions", []))
    lines += [
        f"parity of {result.checkpoint} ({result.format}, {result.variant}), {result.dtype}, "
        f"{len(result.images)} image(s): JAX twin vs torch twin"
        + (f", and {lib} vs torch twin" if lib else "")
        + (" (timm running the file's stored RoPE periods)" if lib == "timm" and stored else ""),
        head,
        "-" * len(head),
    ]
    for r in result.rows:
        t = r.twins
        line = (
            f"{r.name:<12}{t.max_abs:>11.2e}{t.rel:>11.2e}{t.mean_abs:>11.2e}"
            f"{t.kind + ' ' + format(t.bound, '.0e'):>12}  {'ok' if t.ok else 'FAIL'}"
        )
        if lib:
            a = r.against
            line += "   | " + (f"{a.max_abs:>20.2e}{a.rel:>11.2e}  {'ok' if a.ok else 'FAIL'}" if a else f"{'-':>20}")
        lines.append(line + ("  (one value throughout: uninformative)" if r.constant else ""))
    if result.head:
        lines.append(f"NOTE  {result.head}")
    if result.agreement is not None:
        lines.append(
            f"top-1 agreement JAX vs torch: {result.agreement:.0%}"
            + (f"; {lib} vs torch: {result.against_agreement:.0%}" if result.against_agreement is not None else "")
        )
    lines += [f"WARNING  {w}" for w in result.conversion.get("warnings", [])]
    lines.append(result.verdict)
    return "\n".join(lines)


def report_maps(result: ParityResult, layer: int, head: int) -> dict[str, Any]:
    """The ``maps`` input of ``vit_compare.report.write_parity_report``: image 0's attention [L, L] of one
    block and head from each twin (``result`` from ``run_parity(keep_outputs=True)``).

    Raises:
        ValueError: block or head index out of range.
    """
    out_j, out_t = result.outputs["jax"], result.outputs["torch"]
    blocks = sorted(k for k in out_t if k.startswith("attn") and k[4:].isdigit())
    if not -len(blocks) <= layer < len(blocks):
        raise ValueError(f"--layer {layer}: the model has blocks 0..{len(blocks) - 1}")
    name = blocks[layer]
    heads = out_t[name].shape[1]
    if not 0 <= head < heads:
        raise ValueError(f"--head {head}: the model has heads 0..{heads - 1}")
    bound = next(r.twins.bound for r in result.rows if r.name == name)
    return {
        "title": f"{name}, image 0, head {head}",
        "jax": out_j[name][0, head],
        "torch": out_t[name][0, head],
        "bound": bound,
    }
