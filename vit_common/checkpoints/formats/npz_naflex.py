"""big_vision NaFlex ``.npz`` files (``models/proj/image_text/naflex_vit.py``, SigLIP 2 NaFlex) <-> the
layout of big_vision's vit.py that ``vit_common.checkpoints.formats.npz`` reads and writes, numpy only.

naflex_vit differs from vit.py in two tensors: ``embedding/kernel`` is a Dense [P*P*C, D] over patches
flattened (P, P, C) where vit.py has a Conv kernel [P, P, C, D], and ``pos_embedding`` is the table
[Gh, Gw, D] where vit.py stores [1, Gh*Gw, D]; the table is resized to each image's patch grid by
``_pos_emb_resize`` (``jax.image.scale_and_translate(method="bilinear", antialias=True)``:
``posemb_resample='bilinear_aa'``). Both are plain reshapes of the same values, so a file reads and writes
back bit for bit (``naflex_tensors`` reads, ``naflex_vit_tensors`` writes).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.provenance import assumed, derived
from vit_common.checkpoints.formats.rules import unsupported
from vit_common.checkpoints.formats.source import NPZ_PREFIXES
from vit_common.checkpoints.formats.tensors import LazyTensor, Tensor, TensorMap, dtype_of
from vit_common.checkpoints.formats.timm_naflex import patch_side
from vit_common.config import ViTConfig


def is_naflex_vit(tensors: TensorMap) -> bool:
    """Whether an .npz's tensors are big_vision naflex_vit's: a 2-D ``embedding/kernel`` [P*P*C, D]
    under one of the prefixes (vit.py's is a 4-D Conv kernel)."""
    key = next((p + "embedding/kernel" for p in NPZ_PREFIXES if p + "embedding/kernel" in tensors), None)
    return key is not None and np.ndim(tensors[key]) == 2


def naflex_tensors(tensors: TensorMap, prefix: str, overrides: Mapping[str, Any], context: str):
    """(``tensors`` with big_vision naflex_vit's ``embedding/kernel`` [P*P*C, D] and ``pos_embedding``
    [G, G, D] as vit.py's [P, P, C, D] and [1, G*G, D] (lazy reshapes), the image size G*P or None, the
    fields naflex_vit fixes with their origins: C (assumed 3 unless given), ``posemb_resample``
    'bilinear_aa' (its ``_pos_emb_resize``: ``jax.image.scale_and_translate(method="bilinear",
    antialias=True)``) and a dynamic image size.

    Raises:
        FormatError: a LayerNorm on the patches (``patchln_pre`` / ``patchln_post``, named), or a kernel
            whose rows are not P*P*C.
    """
    for name in ("patchln_pre", "patchln_post"):
        if prefix + name + "/scale" in tensors:
            raise FormatError(
                f"{context}: big_vision naflex_vit's {name} (a LayerNorm on the patches) is not implemented"
            )
    key, c = prefix + "embedding/kernel", overrides.get("in_chans", 3)
    kernel = tensors[key]
    rows, d = np.shape(kernel)
    p = patch_side(rows, c) if isinstance(c, int) else 0
    if not p:
        raise FormatError(f"{context}: {key} has {rows} rows, not P*P*C for square patches of C={c}; pass in_chans")
    out = dict(tensors)
    out[key] = LazyTensor((p, p, c, d), dtype_of(kernel), lambda: np.asarray(kernel).reshape(p, p, c, d))
    why = derived("a 2-D embedding/kernel: big_vision naflex_vit, whose _pos_emb_resize is bilinear with antialias")
    fields = {
        "in_chans": (c, assumed("not stored; 3 (embedding/kernel takes P*P*C rows)")),
        "posemb_resample": ("bilinear_aa", why),
        "dynamic_img_size": (True, why),
    }
    table = tensors.get(prefix + "pos_embedding")
    if table is None or np.ndim(table) != 3:
        return out, None, fields
    gh, gw, _ = np.shape(table)
    out[prefix + "pos_embedding"] = LazyTensor(
        (1, gh * gw, d), dtype_of(table), lambda: np.asarray(table).reshape(1, gh * gw, d)
    )
    return out, (gh * p, gw * p), fields


def naflex_vit_load_call(path: Path) -> str:
    """Python code reading the naflex_vit file at ``path`` as big_vision holds its parameters (flax paths
    of ``models/proj/image_text/naflex_vit.py``): no library outside big_vision builds this layout."""
    return f"import numpy as np\nparams = dict(np.load({str(path)!r}))  # big_vision naflex_vit's parameter paths"


def naflex_vit_cannot_hold(cfg: ViTConfig, family: str) -> list[str]:
    """What big_vision naflex_vit's layout cannot hold beyond a big_vision .npz (one reason each)."""
    return unsupported(
        "big_vision naflex_vit",
        {
            f"the {family} family (naflex_vit is big_vision's)": family != "big_vision",
            f"posemb={cfg.posemb!r} (naflex_vit learns its table)": cfg.posemb != "learn",
            f"posemb_resample={cfg.posemb_resample!r} (naflex_vit's _pos_emb_resize is bilinear_aa)": (
                cfg.posemb_resample != "bilinear_aa"
            ),
            "posemb_prefix=True with prefix tokens (naflex_vit's table has patch rows only)": (
                cfg.posemb_prefix and cfg.num_prefix_tokens > 0
            ),
        },
    )


def naflex_vit_tensors(cfg: ViTConfig, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """big_vision .npz tensors in naflex_vit's layout, the inverse of ``naflex_tensors``: ``embedding/kernel``
    [P, P, C, D] -> [P*P*C, D] and ``pos_embedding`` [1, G*G, D] -> [Gh, Gw, D] (lazy reshapes)."""
    (ph, pw), (gh, gw), c, d = cfg.patch_size, cfg.grid, cfg.in_chans, cfg.width
    out = dict(tensors)
    for key, value in tensors.items():
        shape = {"embedding/kernel": (ph * pw * c, d), "pos_embedding": (gh, gw, d)}.get(_leaf(key))
        if shape is not None:
            out[key] = LazyTensor(shape, dtype_of(value), functools.partial(_reshape, value, shape))
    return out


def _leaf(key: str) -> str:
    """``key`` without its .npz prefix (``PREFIXES``)."""
    return next((key[len(p) :] for p in sorted(NPZ_PREFIXES, key=len, reverse=True) if p and key.startswith(p)), key)


def _reshape(value, shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(value).reshape(shape)
