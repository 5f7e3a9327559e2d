"""Make docs/attention_digits.png: a tiny ViT trained briefly on scikit-learn's digits, then `vit attention`.

A stand-in until the trained mnist5k model from `vit train` exists; nothing is downloaded (the 1,797
8x8 digits ship with scikit-learn). Steps:

1. digits (0..16) -> uint8 8x8 images -> ``vit_cli.attention.fit_image`` to 32x32 (bicubic, as the
   command does) -> (x - 0.5) / 0.5, the command's default normalisation;
2. ViT 32 px, patch 4 (8x8 grid), width 64, depth 4, 4 heads, class token; AdamW 1e-3, batch 64,
   EPOCHS epochs on the first 1,500 digits; accuracy on the other 297 is printed;
3. the weights are saved as our canonical file, one held-out digit as an 8x8 PNG, and
   ``vit attention DIGIT --checkpoint CKPT --out DIR`` draws its maps; the figure is copied to docs/.

Run from the repository root: ``python docs/attention_demo.py`` (690 training steps; 13 minutes measured on
two CPU cores shared with other jobs, held-out accuracy 0.919).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx
from PIL import Image
from sklearn.datasets import load_digits

from vit_cli.attention import fit_image
from vit_cli.main import main
from vit_common.config import ViTConfig
from vit_common.formats.canonical import save_canonical
from vit_jax import VisionTransformer, to_numpy

CFG = ViTConfig(image_size=32, patch_size=4, in_chans=1, num_classes=10, width=64, depth=4, num_heads=4,
                mlp_dim=128)
EPOCHS, BATCH, TRAIN = 30, 64, 1500
RUN, FIGURE = Path("runs/attention_demo"), Path("docs/attention_digits.png")
SHOWN = 1509  # index of the held-out digit drawn in the README


def _images(digits: np.ndarray) -> np.ndarray:
    """[B, 8, 8] values 0..16 -> [B, 32, 32, 1] float32 normalised as the command does."""
    pix = np.round(digits * (255 / 16)).astype(np.uint8)
    return np.stack([fit_image(Image.fromarray(d), CFG.image_size, 1) for d in pix]) * 2.0 - 1.0


@nnx.jit
def _step(model, opt, x, y):
    def loss_fn(m):
        return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss


def main_demo() -> int:
    digits = load_digits()
    x, y = _images(digits.images), digits.target
    model = VisionTransformer(CFG, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adamw(1e-3, weight_decay=1e-4), wrt=nnx.Param)
    rng = np.random.default_rng(0)
    for epoch in range(EPOCHS):
        order = rng.permutation(TRAIN)
        losses = [float(_step(model, opt, x[i], y[i])) for i in np.split(order, range(BATCH, TRAIN, BATCH))]
        print(f"epoch {epoch}: loss {np.mean(losses):.3f}")
    model.eval()
    acc = float((np.asarray(jax.jit(model.__call__)(x[TRAIN:])).argmax(-1) == y[TRAIN:]).mean())
    print(f"held-out accuracy {acc:.3f} on {len(y) - TRAIN} digits")
    RUN.mkdir(parents=True, exist_ok=True)
    save_canonical(RUN / "model.safetensors", CFG, to_numpy(model))
    digit = RUN / f"digit{y[SHOWN]}.png"
    Image.fromarray(np.round(digits.images[SHOWN] * (255 / 16)).astype(np.uint8)).save(digit)
    ckpt, out = RUN / "model.safetensors", RUN / "attention"
    argv = ["attention", str(digit), "--checkpoint", str(ckpt), "--out", str(out)]
    print("+ vit " + " ".join(argv))
    code = main(argv)
    shutil.copyfile(out / f"{digit.stem}_attention.png", FIGURE)
    print(f"wrote {FIGURE}")
    return code


if __name__ == "__main__":
    sys.exit(main_demo())
