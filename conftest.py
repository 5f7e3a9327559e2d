"""The test fixtures of tests/ and parity_tests/, in one place: small configs, random canonical states,
seeded images, an independent writer of the .npz layouts, and builders of timm and transformers models
with random weights (the reference libraries: the file formats' own authors). `vit train` runs inside the
tests compile into a per-session cache, not the user's (~/.cache/vit-twins/jax), unless
JAX_COMPILATION_CACHE_DIR already names one. XLA:CPU compiles at optimisation level 0 in the test processes
and the ones they start, as the training-run tests' children always did (half the compile time, which is
most of a tiny model's run), unless XLA_FLAGS already sets a level.

Fixtures that need a framework import it inside, so numpy-only tests never import jax or torch. Helpers
that take arguments are fixtures returning a function (``random_state(cfg, seed=1)``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vit_common.config import ViTConfig
from vit_common.state import random_state as _random_state

# Before any test imports JAX: XLA reads its flags when its backend starts.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

# Class token + 1000-class head at 224 px. The ViT paper, timm and HF agree for Ti/16, S/16, B/16, L/16,
# B/32, B/8, H/14; the other rows counted with timm's VisionTransformer (timm 1.0.31, built on the meta
# device with the same width/depth/heads/mlp_dim).
GOLDEN_PARAMS = {
    "mu/16": 76_712,
    "Ti/16": 5_717_416,
    "S/16": 22_050_664,
    "M/16": 38_837_736,
    "B/16": 86_567_656,
    "B/32": 88_224_232,
    "B/8": 86_576_872,
    "L/16": 304_326_632,
    "So400m/14": 413_597_656,
    "H/14": 632_045_800,
    "g/14": 1_012_611_432,
    "G/14": 1_844_440_680,
}
# The two model sizes of the tests (fixtures small_cfg and tiny_cfg; a variant: ``tiny_cfg.replace(...)``).
SMALL = dict(image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)
TINY = dict(image_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)
# The same small model in timm's and transformers' keyword arguments (4 heads: head_dim 8).
TIMM_SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)
HF_SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8
)


@pytest.fixture(scope="session", autouse=True)
def _session_compile_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as m:
        if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            m.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax_cache")))
        yield


@pytest.fixture
def golden_params() -> dict[str, int]:
    """Parameter count per variant name (class token, 1000-class head, 224 px)."""
    return dict(GOLDEN_PARAMS)


@pytest.fixture(scope="session")
def small_cfg() -> ViTConfig:
    """A 2-block, width-32 ViT on 32x32 images, patch 8 (16 patches), 10 classes: fast everywhere."""
    return ViTConfig(**SMALL)


@pytest.fixture(scope="session")
def tiny_cfg() -> ViTConfig:
    """A 1-block, width-16 ViT on 8x8 RGB images, patch 4 (4 patches), 2 heads, 3 classes (``TINY``): the
    model of the tests that train or run a command."""
    return ViTConfig(**TINY)


def _image_folder(
    root, classes, n: int = 3, size: tuple[int, int] = (8, 8), corrupt: str | None = None, band: bool = False
):
    """``root`` holding a folder per class of ``n`` RGB PNGs of (H, W) = ``size``, image i of class k
    all 40 k + i (so classes differ); with ``band``, seeded dark noise (0..59) instead with a bright band
    (+150) over columns 8 k .. 8 k + 7 (a pattern a model can learn); ``corrupt``: a relative path written
    as a broken GIF. Returns root."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for k, c in enumerate(classes):
        (root / c).mkdir(parents=True)
        for i in range(n):
            if band:
                img = rng.integers(0, 60, (*size, 3)).astype(np.uint8)
                img[:, 8 * k : 8 * k + 8] += 150
            else:
                img = np.full((*size, 3), 40 * k + i, np.uint8)
            Image.fromarray(img).save(root / c / f"{i}.png")
    if corrupt:
        (root / corrupt).write_bytes(b"GIF89a broken")
    return root


def _tiny_dataset(n_train: int = 16, n_test: int = 4, seed: int = 0):
    from vit_common.data.datasets import ArraySource, Dataset

    rng = np.random.default_rng(seed)

    def src(n):
        return ArraySource(rng.integers(0, 256, (n, 8, 8, 1), dtype=np.uint8), np.arange(n) % 3)

    return Dataset("tiny", src(n_train), src(n_test), ("a", "b", "c"), (8, 8), 1)


@pytest.fixture(scope="session")
def tiny_dataset():
    """``tiny_dataset(n_train=16, n_test=4, seed=0)``: a Dataset of seeded uint8 8x8 one-channel images
    [N, 8, 8, 1], labels i % 3 of classes a, b, c (``_tiny_dataset``), for the training steps' tests."""
    return _tiny_dataset


@pytest.fixture(scope="session")
def image_folder():
    """``image_folder(root, classes, n=3, size=(8, 8), corrupt=None, band=False)``: an image folder
    dataset of uniform (or banded) PNGs (``_image_folder``)."""
    return _image_folder


@pytest.fixture(scope="session")
def random_state():
    """``vit_common.state.random_state(cfg, seed=0, scale=1.0, dtype=np.float32)``: a canonical state of
    seeded normal tensors (no two equal, so a swapped or transposed tensor cannot go unnoticed)."""
    return _random_state


def _assert_same_state(a: dict, b: dict) -> None:
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape, (k, x.dtype, y.dtype, x.shape, y.shape)
        assert x.tobytes() == y.tobytes(), k


@pytest.fixture
def assert_same_state():
    """``assert_same_state(a, b)``: bit-exact equality of two states (keys, dtypes, shapes, bytes)."""
    return _assert_same_state


def _images(batch: int, hw, chans: int = 3, dtype=np.float32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, chans, *hw)).astype(dtype)


@pytest.fixture
def images():
    """``images(batch, (H, W), chans=3, dtype=np.float32, seed=0)``: seeded normal images [B, C, H, W]."""
    return _images


# (H, W) of the NaFlex tests' images: aspect ratios from 1:6 to 4:1, smaller and larger than their budgets
NAFLEX_SIZES = ((20, 120), (64, 16), (33, 33), (90, 50), (8, 8), (41, 77), (100, 25))


def _naflex_images(folder: Path, sizes=NAFLEX_SIZES) -> str:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(sizes):
        for split in ("train", "val"):
            (folder / split / "abc"[i % 3]).mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), np.uint8)).save(folder / split / "abc"[i % 3] / f"{i}.png")
    return f"imagefolder:{folder}"


@pytest.fixture
def naflex_images():
    """``naflex_images(folder, sizes=NAFLEX_SIZES)``: an image folder of 3 classes (image i in class i % 3),
    each seeded random RGB image of ``sizes`` in train and val; returns its dataset spec."""
    return _naflex_images


# ------------------------------------------------------------------------------ .npz layouts


def _npz_block(cfg: ViTConfig, s: dict, i: int, counters: str) -> dict[str, np.ndarray]:
    d, n = cfg.width, cfg.num_heads
    hd = d // n
    ln1, mha, ln2, mlp = (
        ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
        if counters == "old"
        else ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
    )
    b = f"blocks.{i}."
    qkv_w, qkv_b = s[b + "attn.qkv.weight"], s[b + "attn.qkv.bias"]
    out = {
        f"{ln1}/scale": s[b + "norm1.weight"],
        f"{ln1}/bias": s[b + "norm1.bias"],
        f"{ln2}/scale": s[b + "norm2.weight"],
        f"{ln2}/bias": s[b + "norm2.bias"],
        f"{mha}/out/kernel": s[b + "attn.proj.weight"].T.reshape(n, hd, d),  # (N, D/N, D)
        f"{mha}/out/bias": s[b + "attn.proj.bias"],
        f"{mlp}/Dense_0/kernel": s[b + "mlp.fc1.weight"].T,
        f"{mlp}/Dense_0/bias": s[b + "mlp.fc1.bias"],
        f"{mlp}/Dense_1/kernel": s[b + "mlp.fc2.weight"].T,
        f"{mlp}/Dense_1/bias": s[b + "mlp.fc2.bias"],
    }
    for j, name in enumerate(("query", "key", "value")):
        out[f"{mha}/{name}/kernel"] = qkv_w[j * d : (j + 1) * d].T.reshape(d, n, hd)  # (D, N, D/N)
        out[f"{mha}/{name}/bias"] = qkv_b[j * d : (j + 1) * d].reshape(n, hd)
    return out


def _npz_layout_arrays(
    cfg: ViTConfig, s: dict, *, layout: str, prefix: str = "", scan: bool = False, posemb_key: str | None = None
) -> dict[str, np.ndarray]:
    counters = "old" if layout == "vit" else "new"
    if posemb_key is None:
        posemb_key = "Transformer/posembed_input/pos_embedding" if layout == "vit" else "pos_embedding"
    d = cfg.width
    out = {
        "embedding/kernel": s["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # OIHW -> HWIO
        "embedding/bias": s["patch_embed.proj.bias"],
        "Transformer/encoder_norm/scale": s["norm.weight"],
        "Transformer/encoder_norm/bias": s["norm.bias"],
    }
    if "cls_token" in s:
        out["cls"] = s["cls_token"]
    if "pos_embed" in s:
        out[posemb_key] = s["pos_embed"]
    blocks = [_npz_block(cfg, s, i, counters) for i in range(cfg.depth)]
    if scan:
        out |= {f"Transformer/encoderblock/{k}": np.stack([b[k] for b in blocks]) for k in blocks[0]}
    else:
        out |= {f"Transformer/encoderblock_{i}/{k}": v for i, b in enumerate(blocks) for k, v in b.items()}
    if "attn_pool.latent" in s:
        n, hd = cfg.num_heads, d // cfg.num_heads
        kv_w, kv_b = s["attn_pool.kv.weight"], s["attn_pool.kv.bias"]
        m = "MAPHead_0/MultiHeadDotProductAttention_0"
        out |= {
            "MAPHead_0/probe": s["attn_pool.latent"],
            f"{m}/query/kernel": s["attn_pool.q.weight"].T.reshape(d, n, hd),
            f"{m}/query/bias": s["attn_pool.q.bias"].reshape(n, hd),
            f"{m}/key/kernel": kv_w[:d].T.reshape(d, n, hd),
            f"{m}/key/bias": kv_b[:d].reshape(n, hd),
            f"{m}/value/kernel": kv_w[d:].T.reshape(d, n, hd),
            f"{m}/value/bias": kv_b[d:].reshape(n, hd),
            f"{m}/out/kernel": s["attn_pool.proj.weight"].T.reshape(n, hd, d),
            f"{m}/out/bias": s["attn_pool.proj.bias"],
            "MAPHead_0/LayerNorm_0/scale": s["attn_pool.norm.weight"],
            "MAPHead_0/LayerNorm_0/bias": s["attn_pool.norm.bias"],
            "MAPHead_0/MlpBlock_0/Dense_0/kernel": s["attn_pool.mlp.fc1.weight"].T,
            "MAPHead_0/MlpBlock_0/Dense_0/bias": s["attn_pool.mlp.fc1.bias"],
            "MAPHead_0/MlpBlock_0/Dense_1/kernel": s["attn_pool.mlp.fc2.weight"].T,
            "MAPHead_0/MlpBlock_0/Dense_1/bias": s["attn_pool.mlp.fc2.bias"],
        }
    if "pre_logits.fc.weight" in s:
        out |= {"pre_logits/kernel": s["pre_logits.fc.weight"].T, "pre_logits/bias": s["pre_logits.fc.bias"]}
    if "head.weight" in s:
        out |= {"head/kernel": s["head.weight"].T, "head/bias": s["head.bias"]}
    return {prefix + k: np.ascontiguousarray(v) for k, v in out.items()}


def _write_npz_layout(path, cfg: ViTConfig, s: dict, *, extra: dict | None = None, **kw) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, **_npz_layout_arrays(cfg, s, **kw), **(extra or {}))


@pytest.fixture
def npz_layouts():
    """The .npz layouts of the original ViT and big_vision, spelled independently of
    ``vit_common.checkpoints.formats.npz`` (plain numpy, one line per parameter) from the parameter paths the real
    files hold: google-research/vision_transformer checkpoints (pre-linen counters LayerNorm_0 /
    MultiHeadDotProductAttention_1 / LayerNorm_2 / MlpBlock_3, ``Transformer/posembed_input/pos_embedding``
    with a class row, optional ``opt/target/``) and big_vision ``models/vit.py`` (linen counters, top-level
    ``pos_embedding`` without class row, ``params/`` or ``params/img/``, ``MAPHead_0``, scan stacking).

    ``.arrays(cfg, state, layout='vit'|'big_vision', prefix='', scan=False, posemb_key=None)`` -> dict;
    ``.write(path, cfg, state, extra=None, **same)`` writes it (plus ``extra`` arrays) as an .npz.
    """
    return SimpleNamespace(arrays=_npz_layout_arrays, write=_write_npz_layout)


# ------------------------------------------------------------------ reference libraries and twins


def _perturb(module, seed: int = 0, scale: float = 0.02):
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module.eval()


@pytest.fixture
def perturb():
    """``perturb(module, seed=0, scale=0.02)``: add seeded noise to every parameter (so zero biases, unit
    norms and LayerScale gammas all carry information a converter could lose); returns it in eval mode."""
    return _perturb


@pytest.fixture
def timm_vit():
    """``timm_vit(distilled=False, seed=0, **kwargs)``: timm's ``VisionTransformer`` (or DeiT's
    ``VisionTransformerDistilled``) with ``TIMM_SMALL`` sizes overridden by ``kwargs``, random weights
    perturbed, in eval mode."""

    def build(distilled: bool = False, seed: int = 0, **kwargs):
        import torch
        from timm.models.deit import VisionTransformerDistilled
        from timm.models.vision_transformer import VisionTransformer

        torch.manual_seed(seed)
        cls = VisionTransformerDistilled if distilled else VisionTransformer
        return _perturb(cls(**{**TIMM_SMALL, **kwargs}), seed)

    return build


@pytest.fixture
def hf_vit():
    """``hf_vit(architecture, seed=0, add_pooling_layer=None, **config)``: a transformers model by class
    name (ViTModel, ViTForImageClassification, DeiT...) with ``HF_SMALL`` sizes and 5 labels, ``config``
    on top, random weights perturbed, in eval mode."""

    def build(architecture: str, seed: int = 0, add_pooling_layer: bool | None = None, **config):
        import torch
        import transformers

        cls = getattr(transformers, architecture)
        config_cls = transformers.DeiTConfig if architecture.startswith("DeiT") else transformers.ViTConfig
        torch.manual_seed(seed)
        cfg = config_cls(**{**HF_SMALL, "num_labels": 5, **config})
        kw = {} if add_pooling_layer is None else {"add_pooling_layer": add_pooling_layer}
        return _perturb(cls(cfg, **kw), seed)

    return build


def _twin_logits(path, images_nchw: np.ndarray, **load_options) -> tuple[np.ndarray, np.ndarray]:
    import vit_jax
    import vit_jax.runner
    import vit_torch
    import vit_torch.runner
    from vit_common.checkpoints.convert import load_checkpoint
    from vit_jax.formats import READERS as JAX_READERS
    from vit_torch.formats import READERS as TORCH_READERS

    ckpt = load_checkpoint(path, readers={**JAX_READERS, **TORCH_READERS}, **load_options)
    x = images_nchw.transpose(0, 2, 3, 1)
    (lj,) = vit_jax.runner.logits(vit_jax.from_numpy(ckpt.cfg, ckpt.state), [x])
    (lt,) = vit_torch.runner.logits(vit_torch.from_numpy(ckpt.cfg, ckpt.state), [x])
    return lj, lt


@pytest.fixture
def twin_logits():
    """``twin_logits(path, images_nchw, **load_options)`` -> (JAX twin logits, torch twin logits) of the
    checkpoint at ``path`` (any format, read once with both frameworks' readers)."""
    return _twin_logits


@pytest.fixture
def assert_twins_match():
    """``assert_twins_match(path, images_nchw, reference, **load_options)``: both twins' float32 logits
    equal ``reference`` (the library that wrote the file) within the tolerance table's float32 bound."""
    from vit_common.tolerance import compare

    def check(path, images_nchw: np.ndarray, reference: np.ndarray, **load_options) -> None:
        lj, lt = _twin_logits(path, images_nchw, **load_options)
        for name, got in (("jax", lj), ("torch", lt)):
            c = compare(f"{name} logits", got, reference, "tensor", "float32")
            assert c.ok, c

    return check


def _hub_cache(cache, repo_id: str, folder, revision: str = "main") -> Path:
    """Put the files of ``folder`` into a Hugging Face cache at ``cache`` as huggingface_hub lays one out
    (``models--ORG--NAME/blobs/<sha256>``, ``snapshots/<commit>/<file>`` a relative link to its blob,
    ``refs/<revision>`` the commit) and return the snapshot folder. The commit is the sha1 of the file
    names and contents, so the same files give the same commit."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    commit = hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for p in files:
        blob = hashlib.sha256(p.read_bytes()).hexdigest()
        shutil.copyfile(p, repo / "blobs" / blob)
        (snapshot / p.name).symlink_to(Path("..", "..", "blobs", blob))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache():
    """``hub_cache(cache, repo_id, folder, revision='main') -> snapshot folder``: ``folder``'s files in a
    Hugging Face cache laid out as huggingface_hub lays one out (no network)."""
    return _hub_cache
