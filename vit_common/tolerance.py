"""The one tolerance table and the comparison every parity check uses.

A comparison reports ``max_abs`` = max |a - b| and ``rel`` = max_abs / max |reference|; a bound is
either relative ("rel") or absolute ("abs"). Float32 bounds assume full-precision matmuls
(``jax_default_matmul_precision="highest"``, TF32 off in torch) on GPU; CPU is always full precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# (what, dtype) -> (kind, bound)
TOLERANCES: dict[tuple[str, str], tuple[str, float]] = {
    ("tensor", "float64"): ("rel", 1e-10),  # logits and every intermediate
    ("tensor", "float32"): ("rel", 1e-5),
    ("attention", "float64"): ("abs", 1e-12),
    ("attention", "float32"): ("abs", 1e-6),  # probabilities are in [0, 1]
    ("gradient", "float64"): ("rel", 1e-9),
    ("gradient", "float32"): ("rel", 1e-4),
    ("tensor", "bfloat16"): ("rel", 2e-2),  # bf16 compute against a float64 reference
    # Twin training (vit_compare/training.py): parameters and Adam moments after K optimizer steps.
    ("train", "float64"): ("rel", 1e-10),
    # float32: Adam divides each gradient by its own root mean square, so a gradient that is zero but for
    # rounding gets an update of the lr's size from noise: the key part of qkv.bias in a ViT without RoPE
    # (softmax ignores a bias added to every key). With RoPE the bias is rotated by each key's position and
    # its gradient is real: float64, depth 2, width 32, key over query bias gradient 4.9e-15 without RoPE,
    # 0.38 (cat), 0.64 (mixed), 0.73 (dinov3) (tests/test_rope.py). Measured on a depth-2 width-16 ViT
    # (benchmarks/train_parity_table.py): 7.5e-4 after step 1, 2.7e-4 after 10, the worst tensor a qkv.bias.
    ("train", "float32"): ("rel", 1e-2),
    # bf16 compute, or a first moment stored in bf16 (big_vision): optax rounds b1 * m to bf16 before adding
    # (1 - b1) g, torch lerps in the parameter dtype, so where the two terms cancel the stored moments part
    # by several bf16 steps (measured on a depth-2 width-16 model, float64, 10 steps: parameters 1.2e-2,
    # first moment 4.7e-2).
    ("train", "bfloat16"): ("rel", 1e-1),
    # float64 parameters against how far they moved since step 0 (max |JAX - torch| / max |torch - start|):
    # roundoff is relative to the weights, so the measure grows as |w| / |move|. Measured 1.3e-10 at step 1
    # of a width-192 depth-2 model from timm weights at lr 2e-3 (|w| / |move| about 10); 1e-8 leaves 100x
    # for smaller learning rates, while two recipes that part (decay scaled or not by the lr) differ by 1e-3
    # and more of the move. float32 has no such bound: a gradient that is zero but for rounding moves a key
    # bias (of a ViT without RoPE) by the lr's size in each twin differently (see "train" float32).
    ("train_update", "float64"): ("rel", 1e-8),
    # Evaluation preprocessing against transformers' image processors (parity_tests/test_preprocess_transformers.py),
    # in uint8 levels: |ours - theirs| * std / rescale_factor. Its PIL backend makes the same Pillow resize
    # and float operations: equal. Its torchvision backend resizes with torchvision's antialiased kernels,
    # measured on skimage's photos at 224 px: 1 level (bilinear), 3 (bicubic), 4 (lanczos); its nearest
    # (NEAREST_EXACT) and its zero padding of a crop larger than the image (floor on the top/left side,
    # where the PIL backend puts the ceiling) depart from the PIL backend itself and are not bounded here.
    ("pixels_pil", "uint8"): ("abs", 0.0),
    ("pixels_torchvision", "uint8"): ("abs", 4.0),
    # DINOv3ViTImageProcessor resizes floats (rescale before resize): Pillow's 'F' resize (float64 weights
    # and sums) against torchvision's antialiased bilinear in float32, whose sample positions round in
    # float32; measured on skimage's photos at 224 px: 3.6e-3 levels (the uint8 resize: 1.0).
    ("pixels_float_resize", "uint8"): ("abs", 1e-2),
    # bf16 compute (float32 parameters and moments) against a float64 run of the same weights and batches:
    # ||params - params_f64|| / ||params_f64|| over all parameters at once (vit_compare/training.py).
    # Measured on a depth-2 width-16 model at lr 1e-2 (the test's): 4.8e-3 (JAX) and 4.3e-3 (torch) after
    # 5 steps, growing ~1e-3 a step: a bound for a few steps. Per tensor no bound holds: without RoPE a key
    # bias's gradient is zero but for rounding, and Adam makes it a step of the lr's size.
    ("train_vs_float64", "bfloat16"): ("rel", 1e-2),
}


@dataclass(frozen=True)
class Comparison:
    """One tensor compared against its reference: the one comparison type of the project.

    ``max_abs`` = max |a - ref|, ``rel`` = max_abs / max |ref| (max_abs where ref is all zero),
    ``mean_abs`` = mean |a - ref|, ``scale`` = max |ref|; ``kind`` ('rel' | 'abs') and ``bound`` are the
    tolerance table's for (what, dtype). Every number is inf when either tensor holds NaN or Inf.
    """

    name: str
    max_abs: float
    rel: float
    kind: str
    bound: float
    mean_abs: float = 0.0
    scale: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.rel if self.kind == "rel" else self.max_abs) <= self.bound

    def to_dict(self) -> dict[str, float | str | bool]:
        """name, max_abs, mean_abs, scale, kind, bound, rel and ok, JSON-able."""
        keys = ("name", "max_abs", "mean_abs", "scale", "kind", "bound", "rel")
        return {k: getattr(self, k) for k in keys} | {"ok": self.ok}

    def __str__(self) -> str:
        return (
            f"{self.name}: max_abs={self.max_abs:.3e} rel={self.rel:.3e} "
            f"({self.kind} bound {self.bound:.0e}) {'ok' if self.ok else 'FAIL'}"
        )


def tolerance(what: str, dtype: str) -> tuple[str, float]:
    """(kind, bound) for comparing ``what`` ('tensor', 'attention', 'gradient') computed in ``dtype``.

    Raises:
        KeyError: no bound is defined for the pair.
    """
    return TOLERANCES[(what, dtype)]


def compare(name: str, a, b, what: str, dtype: str) -> Comparison:
    """Compare ``a`` against the reference ``b`` under the table's bound for (what, dtype).

    A NaN or Inf in either compares as max_abs = rel = inf: never within a tolerance.

    Raises:
        ValueError: shapes differ.
    """
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a64.shape != b64.shape:
        raise ValueError(f"{name}: shapes differ, {a64.shape} vs {b64.shape}")
    kind, bound = tolerance(what, dtype)
    if not (np.isfinite(a64).all() and np.isfinite(b64).all()):
        inf = math.inf  # NaN or Inf is never within a tolerance
        return Comparison(name, inf, inf, kind, bound, inf, inf)
    diff = np.abs(a64 - b64)
    max_abs = float(np.max(diff)) if a64.size else 0.0
    scale = float(np.max(np.abs(b64))) if b64.size else 0.0
    rel = max_abs / scale if scale > 0 else max_abs
    return Comparison(name, max_abs, rel, kind, bound, float(np.mean(diff)) if a64.size else 0.0, scale)
