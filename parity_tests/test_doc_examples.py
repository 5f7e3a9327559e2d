"""The documentation's examples run: every ```python and ```bash block of README.md and of every page of
the manual (``docs/**/*.md``, ``PAGES``), read when the tests run, so a block or a page someone adds is run
too. Here, not in tests/, because the blocks use both twins, timm and transformers.

A block preceded by ``<!-- not run: REASON -->`` (an HTML comment: a reader does not see it) is skipped
with that reason; every other block runs, page by page in each page's order, in a folder of its own that
holds what the pages' file names stand for, made by the libraries that write such files, at test width:

  ============================================ =======================================================
  the pages' name                              made here
  ============================================ =======================================================
  vit_base_patch16_224.safetensors,            timm.create_model(NAME, depth=1) state_dicts (timm's
  vit_tiny_patch16_224.safetensors,            names and widths, one block), saved with safetensors;
  vit_small_patch16_224.safetensors            the S/16 one at 32 px (it is fine-tuned: 224 px takes
                                               minutes on a CPU)
  b16.safetensors                              our file (save_checkpoint) of the B/16 one
  ViT-B_16.npz                                 an original ViT .npz (our writer: no library of that
                                               codebase is installed) of the B/16 one
  finetuned.safetensors                        our timm export (save_checkpoint 'timm') of the Ti one
  vit_base_patch16_clip_224.laion2b/           timm.models.save_for_hf of vit_base_patch16_clip_224
                                               at depth 1
  hf-hub:timm/vit_base_patch16_224.augreg2_... those folders in a Hugging Face cache laid out as
  hf-hub:timm/vit_base_patch16_clip_224.openai huggingface_hub lays one out (HF_HUB_CACHE, offline)
  photos/, data/                               image folders: 2 classes of 6 PNGs, 48 px
  cifar10-saved                                datasets' save_to_disk of 2 classes of 6 images, 32 px
  digit7.png                                   test digit 700 of mnist5k, as docs/attention.md
  runs/mnist5k                                 one shortened demo run, shared by every block
  ============================================ =======================================================

and with these substitutions (``SUBSTITUTIONS``; the training commands shortened by flags added at the
end, where the last flag wins):

  - every ``vit train``: ``--epochs 1 --no-progress --no-parity --tensorboard off`` (``TRAIN_FLAGS``); one
    without ``--init`` also gets a width-32 depth-1 model (``MODEL_FLAGS``), one on a stand-in folder
    (12 images) batches of 4 (``vit train`` refuses a batch larger than the training images); the bare
    ``vit train`` (the demo) is the shared run, so it runs only where runs/mnist5k is missing, as
    docs/attention.md says
  - ``vit train-parity --steps 10``: 2 steps
  - ``timm.create_model("vit_tiny_patch16_224", ...)``: ``depth=1``, as the file it loads
  - ``train_iterator(..., batch_size=256, ..., workers=8)``: batches of 4, no worker processes

Shell blocks run with ``bash -e`` (the first failing command fails the block), ``vit`` and ``python``
being this interpreter's; Python blocks run as scripts (``python BLOCK.py``, so ``__name__`` is
``"__main__"`` and worker processes can start from them), in the same environment.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- not run: (?P<reason>.+?) -->$")
LANGUAGES = ("python", "bash")  # what runs; a fence without a language is sample output

TRAIN_FLAGS = "--epochs 1 --no-progress --no-parity --tensorboard off --data-workers 0"
MODEL_FLAGS = "--width 32 --depth 1 --num-heads 2 --mlp-dim 64"
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    (r"train-parity --steps 10\b", "train-parity --steps 2"),
    (r'timm\.create_model\("vit_tiny_patch16_224", ', 'timm.create_model("vit_tiny_patch16_224", depth=1, '),
    (r"batch_size=256\b", "batch_size=4"),
    (r"workers=8\b", "workers=0"),
)
TIMM_FILES = ("vit_base_patch16_224", "vit_tiny_patch16_224", "vit_small_patch16_224")
HUB_IDS = {
    "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k": "vit_base_patch16_224",
    "timm/vit_base_patch16_clip_224.openai": "vit_base_patch16_clip_224",
}


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    reason: str | None  # why it is not run, from the marker before it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{self.language}"


def page_blocks(page: str, text: str) -> tuple[list[Block], list[str]]:
    """Every fenced block of ``text``, the page ``page``, and the problems of its markers (one not followed
    by a block, or an empty reason)."""
    lines, blocks, problems = text.splitlines(), [], []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(before.strip())
        blocks.append(Block(page, i + 1, m[1], "\n".join(lines[i + 1 : end]), mark["reason"].strip() if mark else None))
        i = end + 1
    marked = {b.line for b in blocks if b.reason is not None}
    for n, line in enumerate(lines, 1):
        if line.strip().startswith("<!-- not run"):
            following = next((k for k in range(n, len(lines)) if lines[k].strip()), None)
            if following is None or following + 1 not in marked:
                problems.append(f"{page}:{n}: {line.strip()!r} is not a marker right before a block")
    return blocks, problems


BLOCKS: list[Block] = []
PROBLEMS: list[str] = []
for _path in PAGES:
    _blocks, _problems = page_blocks(_path.relative_to(ROOT).as_posix(), _path.read_text())
    BLOCKS += _blocks
    PROBLEMS += _problems
RUN = [b for b in BLOCKS if b.language in LANGUAGES]


def test_every_page_is_read():
    """The pages include README and the manual's pages with examples (a glob that found nothing would
    pass every test below)."""
    pages = {b.page for b in RUN}
    assert {"README.md", "docs/formats.md", "docs/training.md", "docs/attention.md"} <= pages, pages


def test_every_block_runs_or_carries_the_reason_it_does_not():
    """Every fenced block is Python or shell (which run, unless marked with a reason) or sample output;
    every marker sits right before a block and gives a reason."""
    assert PROBLEMS == []
    assert [b.id for b in BLOCKS if b.language not in (*LANGUAGES, "")] == [], "a block no test runs"
    assert all(b.reason for b in RUN if b.reason is not None)


def shell_text(block: Block) -> str:
    """``block``'s commands with the substitutions and the training flags."""
    text = substituted(block.text).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        command = re.sub(r"\s+#.*$", "", line) if line.lstrip().startswith("vit ") else line
        if re.match(r"\s*vit train(\s|$)", command):
            args = command.split()[2:]
            flags = TRAIN_FLAGS + ("" if "--init" in args else " " + MODEL_FLAGS)
            flags += " --batch-size 4" if re.search(r"--dataset (imagefolder|arrayrecord|hf|tfds):", command) else ""
            command = f"{command} {flags}"
            if not args:  # the demo: the shared run
                command = f"test -f runs/mnist5k/model.safetensors || {command}"
        out.append(command)
    return "\n".join(out)


def substituted(text: str) -> str:
    for pattern, replacement in SUBSTITUTIONS:
        text = re.sub(pattern, replacement, text)
    return text


def _timm_model(name: str, **kwargs):
    import timm
    import torch

    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, depth=1, **kwargs).eval()


def _image_folder(root: Path, size: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for k, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 80, (size, size, 3), dtype=np.uint8) + np.uint8(120 * k)
            Image.fromarray(pixels).save(root / name / f"{i}.png")


def _hub_cache(cache: Path, repo_id: str, folder: Path) -> None:
    """``folder``'s files as huggingface_hub caches a repo: blobs, a snapshot of links, refs/main."""
    import hashlib

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / commit).mkdir(parents=True)
    for p in sorted(folder.iterdir()):
        blob = hashlib.sha256(p.read_bytes()).hexdigest()
        shutil.copyfile(p, repo / "blobs" / blob)
        (repo / "snapshots" / commit / p.name).symlink_to(Path("..", "..", "blobs", blob))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def _environment(base: Path) -> dict[str, str]:
    bin_dir = base / "bin"
    bin_dir.mkdir()
    for name, command in (("vit", f'"{sys.executable}" -m vit_cli.main'), ("python", f'"{sys.executable}"')):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "HF_HUB_CACHE": str(base / "hub"),
        "HF_HUB_OFFLINE": "1",
        "JAX_COMPILATION_CACHE_DIR": str(base / "jax_cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "XLA_FLAGS": "--xla_backend_optimization_level=0",
    }


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """(folder holding what the pages' names stand for, the environment blocks run in); see the module
    docstring's table."""
    import timm
    from PIL import Image
    from safetensors.torch import save_file

    from vit_common.checkpoints.convert import load_checkpoint, save_checkpoint
    from vit_common.data.datasets import load_dataset

    base = tmp_path_factory.mktemp("docs")
    work = base / "work"
    work.mkdir()
    env = _environment(base)
    for name in TIMM_FILES:
        model = _timm_model(name, **({"img_size": 32} if name == "vit_small_patch16_224" else {}))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, work / f"{name}.safetensors")
    b16 = load_checkpoint(work / "vit_base_patch16_224.safetensors", strict=True, num_heads=12, pool="token",
                          gelu="exact", ln_eps=1e-6, source_image_size=224)  # fmt: skip
    save_checkpoint(work / "b16.safetensors", b16.cfg, b16.state)
    save_checkpoint(work / "ViT-B_16.npz", b16.cfg, b16.state, "original_vit")
    ti = load_checkpoint(work / "vit_tiny_patch16_224.safetensors", strict=True, num_heads=3, pool="token",
                         gelu="exact", ln_eps=1e-6, source_image_size=224)  # fmt: skip
    save_checkpoint(work / "finetuned.safetensors", ti.cfg, ti.state, "timm")
    timm.models.save_for_hf(
        _timm_model("vit_base_patch16_clip_224"), work / "vit_base_patch16_clip_224.laion2b", safe_serialization=True
    )
    for repo_id, name in HUB_IDS.items():
        timm.models.save_for_hf(_timm_model(name), base / repo_id, safe_serialization=True)
        _hub_cache(base / "hub", repo_id, base / repo_id)
    _image_folder(work / "photos", 48)
    _image_folder(work / "data", 48)
    _cifar10_saved(work / "cifar10-saved")
    digits = load_dataset("mnist5k", (28, 28), 1)
    Image.fromarray(digits.test.images[700, ..., 0]).save(work / "digit7.png")
    run = subprocess.run(
        ["bash", "-ec", shell_text(Block("", 0, "bash", "vit train", None))],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return work, env


def _cifar10_saved(path: Path) -> None:
    import datasets

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(12)]
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"])})
    data = datasets.Dataset.from_dict({"img": images, "label": [i % 2 for i in range(12)]}, features=features)
    data.save_to_disk(str(path))


def _copy(src: Path, dst: Path) -> None:
    """A folder of its own for a block: the pages' files hard-linked (no block changes them), the run
    folder copied (``--resume`` appends to it)."""
    shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns("runs"))
    shutil.copytree(src / "runs", dst / "runs", symlinks=True)


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_block_runs(block, workspace, tmp_path):
    if block.reason is not None:
        pytest.skip(f"not run: {block.reason}")
    work, env = workspace
    here = tmp_path / "work"
    _copy(work, here)
    if block.language == "bash":
        command = ["bash", "-ec", shell_text(block)]
    else:
        script = tmp_path / "block.py"
        script.write_text(substituted(block.text))
        command = [sys.executable, str(script)]
    run = subprocess.run(command, cwd=here, env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"{block.id} exited {run.returncode}:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
