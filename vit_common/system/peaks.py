"""Datasheet peak FLOP/s of accelerators, for model FLOP utilisation (MFU) in training and benchmarks.

MFU = model FLOP/s / (peak FLOP/s per device x devices). Model FLOPs of a training step are
``TRAIN_FLOPS_FACTOR`` x the forward FLOPs (``ViTConfig.flops``) x images: the backward pass costs
twice the forward (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1; PaLM,
Chowdhery et al. 2022, appendix B), the optimizer update left out.

Peaks are dense (no structured sparsity) per device, by a substring of the device kind as JAX names it
(``jax.devices()[0].device_kind``: "NVIDIA H100 80GB HBM3", "TPU v5 lite") and the compute dtype.
Sources: NVIDIA's H100/H200 SXM datasheet (989 TFLOP/s bf16/fp16 dense, 67 fp32), A100 datasheet (312,
19.5), L4 datasheet (121 bf16 dense, 30.3 fp32); Google Cloud TPU system-architecture pages (per chip,
bf16: v4 275, v5e 197, v5p 459, v6e (Trillium) 918). TPUs publish no float32 peak (their matrix units
take bf16 passes), and CPUs have none here: MFU is then left out unless a peak is given.
"""

from __future__ import annotations

TRAIN_FLOPS_FACTOR = 3

# Device-kind substring -> {dtype: peak FLOP/s}; the first substring found wins, so the longer names
# ("v5 lite") come before the ones they contain ("v5").
DATASHEET_PEAKS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
    "L4": {"bfloat16": 121e12, "float16": 121e12, "float32": 30.3e12},
    "TPU v6 lite": {"bfloat16": 918e12},
    "TPU v5 lite": {"bfloat16": 197e12},
    "TPU v5": {"bfloat16": 459e12},
    "TPU v4": {"bfloat16": 275e12},
}


def datasheet_peak(device_kind: str, dtype: str) -> float | None:
    """Peak FLOP/s of one device of ``device_kind`` computing in ``dtype``, or None when the table does
    not know it."""
    for key, peaks in DATASHEET_PEAKS.items():
        if key in device_kind:
            return peaks.get(dtype)
    return None
