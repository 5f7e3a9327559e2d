"""The check of a trained run's exports: their test-set logits in vit_torch and in the library that
defines each format, against the JAX twin's.

``export_parity`` has the signature of the ``parity`` function ``vit_jax.launch.run_training`` takes: it runs
where torch may be imported, so that vit_jax imports no torch.
"""

from __future__ import annotations

from pathlib import Path


def export_parity(path: Path, exports: dict[str, Path], trainer) -> dict:
    """Test-set logits of the exported files against vit_jax's: ours in vit_torch (top level of the
    result, float32 bound) and each export in the library that defines its format (``library``: timm
    for timm files and .npz, transformers for HF folders; skipped, with the reason, when not installed).
    A NaFlex run's test images are NaFlex batches (the trainer's); the library check, which takes
    fixed-size images, is skipped for its exports with that reason.
    """
    import numpy as np

    from vit_common.tolerance import compare
    from vit_compare.run_model import load_both, logits
    from vit_jax.data import eval_batches

    data = trainer.data
    batches = list(
        eval_batches(data.test, data.num_classes, batch_size=trainer.tcfg.batch_size, transform=trainer.eval_transform)
    )
    mask = np.concatenate([b["mask"] for b in batches]) > 0
    naflex = "patch_mask" in batches[0]
    images = [(b["image"], b["patch_mask"], b["spatial_shapes"]) if naflex else b["image"] for b in batches]
    labels = np.concatenate([b["label"] for b in batches])[mask]
    jax_model, torch_model = load_both(path)
    lj = np.concatenate(list(logits(jax_model, "jax", images)))[mask]
    lt = np.concatenate(list(logits(torch_model, "torch", images)))[mask]

    def check(got: np.ndarray) -> dict:
        c = compare("logits", got, lj, "tensor", "float32")
        agree = float((lj.argmax(-1) == got.argmax(-1)).mean())
        return {
            "images": int(mask.sum()),
            "agreement": agree,
            "max_abs_logit_diff": c.max_abs,
            "rel": c.rel,
            "bound": c.bound,
            "ok": bool(c.ok and agree == 1.0),
        }

    result = check(lt) | {
        "jax_accuracy": float((lj.argmax(-1) == labels).mean()),
        "torch_accuracy": float((lt.argmax(-1) == labels).mean()),
        "library": {},
    }
    from vit_torch.oracles import library_logits

    for fmt, file in exports.items():
        if fmt == "orbax":
            continue
        if naflex:
            why = "the library check takes fixed-size images, not a NaFlex model's batches"
            result["library"][fmt] = {"file": str(file), "skipped": why}
            continue
        try:
            library, logits = library_logits(file, fmt, trainer.cfg.replace(dtype="float32"), images)
        except ImportError as e:
            result["library"][fmt] = {"file": str(file), "skipped": f"{e.name or e} is not installed"}
            continue
        except ValueError as e:
            result["library"][fmt] = {"file": str(file), "skipped": str(e)}
            continue
        result["library"][fmt] = {"file": str(file), "library": library} | check(np.concatenate(logits)[mask])
    return result
