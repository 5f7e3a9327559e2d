"""Load a checkpoint into a twin and run it over image batches: the one place the commands turn images
into logits.

Images are numpy float32 [B, H, W, C] (normalised as ``vit_common.data.images.normalize``); logits come
back as numpy float32 [B, K], from ``vit_jax.runner`` / ``vit_torch.runner`` (full float32 precision, no
TF32, the frameworks' settings restored afterwards). ``load`` imports only the framework it is asked for;
``load_both`` reads a file once for both twins.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np


def load(path, framework: str, options=()):
    """``vit_jax.load_model`` or ``vit_torch.load_model`` of ``path`` (any supported format), with
    ``options``: config overrides and the other ``load_checkpoint`` keywords, as (name, value) pairs."""
    return load_with_info(path, framework, options)[0]


def load_with_info(path, framework: str, options=(), preprocess: dict | None = None, classes=None):
    """(model in eval mode, ``vit_common.checkpoints.metadata.ModelInfo``) of the checkpoint at ``path`` in the twin
    ``framework`` ('jax' | 'torch'), ``options`` as ``load``; ``preprocess`` fields and ``classes`` given
    on the command line replace what the file says. The assumed fields (one block: a line naming them,
    then one per field), the conversion's other warnings and assumed preprocessing are printed to
    stderr ("vit: warning: PATH: ...").

    Raises:
        ValueError: an unknown framework; what ``vit_common.checkpoints.convert.load_checkpoint`` raises.
    """
    if framework == "jax":
        from vit_jax import from_numpy
        from vit_jax.formats import READERS
    elif framework == "torch":
        from vit_torch import from_numpy
        from vit_torch.formats import READERS
    else:
        raise ValueError(f"framework={framework!r}: expected 'jax' or 'torch'")
    ckpt, info = _read(path, READERS, options, preprocess, classes)
    return from_numpy(ckpt.cfg, ckpt.state), info


def load_both(path, options=()):
    """(JAX model, torch model) of the checkpoint at ``path``, both from one read of the file (its
    warnings printed once), ``options`` as ``load``; either twin's readers serve (orbax, .pth/.bin).

    Raises:
        ValueError: what ``vit_common.checkpoints.convert.load_checkpoint`` raises.
    """
    import vit_jax
    import vit_torch
    from vit_jax.formats import READERS as JAX_READERS
    from vit_torch.formats import READERS as TORCH_READERS

    ckpt, _ = _read(path, {**JAX_READERS, **TORCH_READERS}, options, None, None)
    return vit_jax.from_numpy(ckpt.cfg, ckpt.state), vit_torch.from_numpy(ckpt.cfg, ckpt.state)


def _read(path, readers, options, preprocess: dict | None, classes):
    """(``load_checkpoint``'s answer, its ``ModelInfo`` with the given ``preprocess`` and ``classes``),
    the assumption block and warnings printed to stderr (``load_with_info``)."""
    from vit_common.checkpoints.convert import load_checkpoint
    from vit_common.checkpoints.formats.timm_naflex import source_name
    from vit_common.checkpoints.metadata import with_overrides

    ckpt = load_checkpoint(path, readers=readers, **dict(options))
    try:
        info = with_overrides(ckpt.info, preprocess or {}, classes, bool(source_name(ckpt.report.layout, ckpt.cfg)))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    block = ckpt.report.assumption_block()
    if block:
        print(f"vit: warning: {path}: {block[0]}", *block[1:], sep="\n", file=sys.stderr)
    for w in [*ckpt.report.warnings, *info.warnings]:
        print(f"vit: warning: {path}: {w}", file=sys.stderr)
    if info.classes is None:
        info.classes = _run_classes(path, ckpt.cfg.num_classes)
        info.classes_source = "declared: the run's config.json" if info.classes else info.classes_source
    info.check(ckpt.cfg.image_size, ckpt.cfg.num_classes, str(path))
    return ckpt, info


def _run_classes(checkpoint, num_classes: int) -> tuple[str, ...] | None:
    """Class names from the config.json of the `vit train` run beside the checkpoint, if any."""
    p = Path(checkpoint)
    cfg_json = (p if p.is_dir() else p.parent) / "config.json"
    if not cfg_json.is_file():
        return None
    from vit_common.system.io import read_json

    try:
        classes = read_json(cfg_json).get("classes")
    except (ValueError, AttributeError, OSError):
        return None
    if isinstance(classes, list) and len(classes) == num_classes and all(isinstance(c, str) for c in classes):
        return tuple(classes)
    return None


def class_names(info, num_classes: int) -> list[str]:
    """The model's class names, or "0".."K-1" when nothing names them."""
    return list(info.classes) if info.classes is not None else [str(k) for k in range(num_classes)]


def logits(model, framework: str, batches: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    """Logits float32 [B, K] per batch [B, H, W, C] of ``model``, the twin ``framework`` ('jax' | 'torch')."""
    if framework == "jax":
        from vit_jax.runner import logits as run
    else:
        from vit_torch.runner import logits as run
    return run(model, batches)
