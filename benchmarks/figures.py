"""Regenerate the manual's figures from the demo run: ``python -m benchmarks.figures [--run runs/mnist5k]``.

  docs/mnist5k_curves.png     the run's curves.png (loss and accuracy against step, train and test),
                              written by ``vit train``
  docs/attention_mnist5k.png  ``vit attention`` of test digit 700 of mnist5k (a 7) with the run's
                              model.safetensors: the image, each head of the last block, their mean
                              and the rollout

The run folder is trained first with the demo's defaults (``vit train --out RUN``, about 3 minutes on
a 2-core CPU) unless it already holds a finished run. Prints the prediction ``vit attention`` makes,
which docs/attention.md quotes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
DIGIT = 700  # the held-out test digit docs/attention.md shows (a 7)


def vit(*argv: str) -> None:
    """Run the ``vit`` command of this interpreter; exit with its code if it fails."""
    rc = subprocess.run([sys.executable, "-m", "vit_cli.main", *argv]).returncode
    if rc:
        sys.exit(rc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--run", type=Path, default=Path("runs/mnist5k"), help="the demo's run folder (default: %(default)s)"
    )
    args = p.parse_args(argv)
    if not (args.run / "model.safetensors").exists():
        vit("train", "--out", str(args.run))
    shutil.copyfile(args.run / "curves.png", DOCS / "mnist5k_curves.png")

    from PIL import Image

    from vit_common.data.datasets import load_dataset

    with tempfile.TemporaryDirectory() as tmp:
        digit = Path(tmp) / "digit7.png"
        Image.fromarray(load_dataset("mnist5k", (28, 28), 1).test.images[DIGIT, ..., 0]).save(digit)
        vit("attention", str(digit), "--checkpoint", str(args.run / "model.safetensors"), "--out", tmp)
        shutil.copyfile(Path(tmp) / "digit7_attention.png", DOCS / "attention_mnist5k.png")
        summary = json.loads((Path(tmp) / "digit7_attention.json").read_text())
    print(f"wrote {DOCS / 'mnist5k_curves.png'} and {DOCS / 'attention_mnist5k.png'}")
    print("prediction:", json.dumps(summary.get("prediction", summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
