"""Read and write every supported checkpoint format through the canonical state.

Formats (``FORMATS``), detected from the contents, never from the file name:

============== ======================================================= ==========================
name           what                                                    container
============== ======================================================= ==========================
canonical      our file: timm names + ViTConfig in the metadata        .safetensors
timm           timm VisionTransformer state_dict                       .safetensors, .pth/.bin
hf             transformers ViTModel / ViTForImageClassification       folder: config.json +
                                                                       model.safetensors (shards)
                                                                       or pytorch_model.bin
original_vit   google-research/vision_transformer checkpoint           .npz
big_vision     google-research/big_vision ViT checkpoint               .npz
orbax          orbax checkpoint of the JAX twin + its config           folder
============== ======================================================= ==========================

vit_common imports neither framework, so two containers are read and written through callables the
framework adapters provide: ``readers={"torch": vit_torch.formats.read_torch_file, "orbax":
vit_jax.formats.read_orbax}`` and ``writers={"torch": ..., "orbax": ...}`` (``vit_torch.formats.READERS``
etc.). ``needs(path)`` says which one a path needs, so a caller imports only that framework.

Every read checks that each file tensor is used exactly once and each canonical tensor is filled (K05)
and reports what it inferred, dropped and resampled; every write builds all tensors in memory first,
reads them back through the same format (bit-exact, or it raises) and then writes atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from vit_common.config import ViTConfig
from vit_common.formats import canonical, hf, npz, timm
from vit_common.formats.base import Decoded, FormatError, Report, check_canonical
from vit_common.images import Preprocess
from vit_common.metadata import hf_labels, hf_preprocessor_config, info_metadata, read_info
from vit_common.posemb import resample_pos_embed
from vit_common.state import canonical_shapes, nonfinite

FORMATS = {
    "canonical": "our safetensors file: timm names, ViTConfig in the metadata",
    "timm": "timm VisionTransformer state_dict (.safetensors, .pth, .bin)",
    "hf": "Hugging Face transformers ViT folder (config.json + weights)",
    "original_vit": "original ViT (google-research/vision_transformer) .npz",
    "big_vision": "big_vision (google-research/big_vision) ViT .npz",
    "orbax": "orbax checkpoint folder of the JAX twin (needs jax)",
}
ORBAX_CONFIG = "vit_config.json"  # beside the orbax ``state/`` folder: {"format": ..., "vit_config": ...}
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TORCH_SUFFIXES = (".pth", ".pt", ".bin")
# Fields a file cannot change the forward pass with (init values, training and run-time choices).
_RUNTIME_FIELDS = {
    "layer_scale",
    "dropout",
    "attn_dropout",
    "drop_path",
    "dynamic_img_size",
    "dynamic_img_pad",
    "posemb_resample",
    "attn_impl",
    "attn_backend",
    "dtype",
    "param_dtype",
}

Reader = Callable[..., Any]


class Checkpoint(NamedTuple):
    cfg: ViTConfig
    state: dict[str, np.ndarray]
    report: Report


class _Source(NamedTuple):
    kind: str  # 'safetensors' | 'npz' | 'torch' | 'hf_dir' | 'orbax_dir'
    weights: tuple[Path, ...]  # files holding the tensors
    config: dict | None  # HF config.json


# ----------------------------------------------------------------------------------- detection


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise FormatError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise FormatError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _sniff(path: Path) -> _Source:
    """What kind of container ``path`` is, from its contents."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / ORBAX_CONFIG).is_file() and (path / "state").is_dir():
            return _Source("orbax_dir", (path,), None)
        if (path / "config.json").is_file():
            index = path / "model.safetensors.index.json"
            if index.is_file():
                wmap = _read_json(index).get("weight_map")
                if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
                    raise FormatError(f"{index}: no weight_map of file names")
                names = sorted(set(wmap.values()))
                if any(Path(f).name != f or f in (".", "..") for f in names):
                    raise FormatError(f"{index}: weight_map names files outside the folder")
                return _Source("hf_dir", tuple(path / f for f in names), _read_json(path / "config.json"))
            for name in ("model.safetensors", "pytorch_model.bin"):
                if (path / name).is_file():
                    return _Source("hf_dir", (path / name,), _read_json(path / "config.json"))
            raise FormatError(f"{path}: config.json but none of {HF_WEIGHTS}")
        raise FormatError(
            f"{path}: a folder that is neither a Hugging Face ViT folder (config.json + weights) "
            f"nor an orbax checkpoint of the JAX twin ({ORBAX_CONFIG} + state/)"
        )
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
        size = path.stat().st_size
    except OSError as e:
        raise FormatError(f"{path}: cannot read ({e})") from e
    if head[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise FormatError(f"{path}: a damaged zip archive ({e})") from e
        if any(n.endswith("data.pkl") for n in names):
            return _Source("torch", (path,), None)
        if names and all(n.endswith(".npy") for n in names):
            return _Source("npz", (path,), None)
        raise FormatError(f"{path}: a zip archive that is neither .npz nor a PyTorch file")
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return _Source("torch", (path,), None)  # legacy (pre-1.6) torch.save pickle stream
    if len(head) == 9 and 2 <= int.from_bytes(head[:8], "little") <= size - 8 and head[8:9] == b"{":
        parent = path.parent / "config.json"
        config = _read_json(parent) if path.name in HF_WEIGHTS and parent.is_file() else None
        return _Source("safetensors", (path,), config)
    raise FormatError(
        f"{path}: not a checkpoint format vit reads (safetensors, .npz, PyTorch .pth/.bin, "
        f"Hugging Face folder, orbax folder); it starts with {head[:8]!r}"
    )


def needs(path: str | os.PathLike, fmt: str | None = None, *, writing: bool = False) -> str | None:
    """'torch', 'jax' or None: the framework reading (or writing) ``path`` needs.

    For reading, ``path`` must exist (its contents decide). For writing, ``fmt`` or the suffix decides.
    """
    path = Path(path)
    if writing:
        fmt = fmt or output_format(path)
        return "jax" if fmt == "orbax" else "torch" if fmt == "timm" and path.suffix in TORCH_SUFFIXES else None
    src = _sniff(path)
    if src.kind == "orbax_dir":
        return "jax"
    return "torch" if src.kind == "torch" or any(w.suffix == ".bin" for w in src.weights) else None


def output_format(path: str | os.PathLike) -> str:
    """The format a path name asks for when no --to is given.

    Raises:
        ValueError: the name does not say (a folder could be 'hf' or 'orbax').
    """
    suffix = Path(path).suffix
    if suffix == ".safetensors":
        return "canonical"
    if suffix in TORCH_SUFFIXES:
        return "timm"
    if suffix == ".npz":
        return "big_vision"
    raise ValueError(
        f"cannot tell the output format from {str(path)!r}; pass one of {tuple(FORMATS)} "
        "(--to), e.g. hf or orbax for a folder"
    )


# --------------------------------------------------------------------------------------- reading


def _need(readers: Mapping[str, Reader] | None, what: str, path: Path) -> Reader:
    fn = (readers or {}).get(what)
    if fn is None:
        framework = "jax" if what == "orbax" else "torch"
        raise FormatError(
            f"{path}: reading this {what} checkpoint needs {framework}, and the caller gave no "
            f"{what} reader (use vit_{framework}.load_model or `vit convert`)"
        )
    return fn


def _family(src: _Source, tensors: Mapping[str, np.ndarray], meta: Mapping[str, str], path: Path) -> str:
    if src.kind in ("hf_dir", "orbax_dir"):
        return "hf" if src.kind == "hf_dir" else "orbax"
    if src.kind == "npz":
        fam = npz.family_of(tensors)
        if fam is None:
            raise FormatError(
                f"{path}: an .npz without embedding/kernel under any of {npz.PREFIXES}: "
                "not an original-ViT or big_vision checkpoint"
            )
        return fam
    if meta.get("format") == canonical.FORMAT_TAG:
        return "canonical"
    if timm.is_timm(tensors):
        return "timm"
    if hf.is_hf(tensors):
        return "hf"
    sample = ", ".join(sorted(tensors)[:5])
    raise FormatError(
        f"{path}: {len(tensors)} tensors ({sample}{', ...' if len(tensors) > 5 else ''}) match "
        "none of the formats: timm (patch_embed.proj.weight), Hugging Face "
        "(embeddings.patch_embeddings.projection.weight), our file (stored config)"
    )


def _decode(
    path: Path, fmt: str | None, readers, source_image_size, overrides, keep_zero_head: bool
) -> tuple[Decoded, str, int]:
    src = _sniff(path)
    ctx = str(path)
    meta: dict[str, str] = {}
    dropped: list[tuple[str, str]] = []
    if src.kind == "orbax_dir":
        if fmt not in (None, "orbax"):
            raise FormatError(f"{path}: an orbax folder, not {fmt}")
        cfg, state = _need(readers, "orbax", path)(path)
        dec = canonical.decode(cfg, state, "orbax checkpoint of the JAX twin", ctx)
        dec.cfg = dec.cfg.replace(**overrides) if overrides else dec.cfg
        return dec, "orbax", len(state)
    tensors: dict[str, np.ndarray] = {}
    for w in src.weights:
        if w.suffix == ".bin" or src.kind == "torch":
            part, why = _need(readers, "torch", path)(w)
            dropped += why
        elif src.kind == "npz":
            part = npz.load_file(w)
        else:
            part, meta = canonical.read_safetensors(w)
        tensors.update(part)
    family = fmt or _family(src, tensors, meta, path)
    kw = dict(source_image_size=source_image_size, overrides=overrides, context=ctx)
    if family in ("original_vit", "big_vision"):
        kw["keep_zero_head"] = keep_zero_head
    if family == "canonical":
        dec = canonical.decode(canonical.stored_config(meta, ctx), tensors, "safetensors, config in metadata", ctx)
        dec.cfg = dec.cfg.replace(**overrides) if overrides else dec.cfg
    elif family == "timm":
        dec = timm.read(tensors, **kw)
    elif family == "hf":
        dec = hf.read(tensors, src.config, **kw)
    elif family in ("original_vit", "big_vision"):
        dec = npz.read(tensors, **kw)
    else:
        raise FormatError(f"{path}: a {src.kind} container cannot be read as {family}")
    dec.dropped = dropped + dec.dropped
    return dec, family, len(tensors)


def _new_head(cfg: ViTConfig, state: dict[str, np.ndarray], k: int, report: Report) -> ViTConfig:
    old = cfg.num_classes
    dtype = np.asarray(state["patch_embed.proj.weight"]).dtype
    for name in ("head.weight", "head.bias"):
        if name in state:
            report.dropped.append((name, f"--num-classes {k} replaces the {old}-class head"))
            del state[name]
    if k:
        state["head.weight"] = np.zeros((k, cfg.features_dim), dtype)
        state["head.bias"] = np.zeros((k,), dtype)
        report.notes.append(f"new {k}-class head, zero-initialised (big_vision head_zeroinit); fine-tune it")
    return cfg.replace(num_classes=k)


def _resample(cfg: ViTConfig, state: dict[str, np.ndarray], image_size, report: Report) -> ViTConfig:
    new = cfg.replace(image_size=image_size)
    if new.grid == cfg.grid:
        return new
    why = f"image_size {cfg.image_size[0]}x{cfg.image_size[1]} -> {new.image_size[0]}x{new.image_size[1]}"
    if cfg.posemb != "learn":
        report.notes.append(f"{why}: the {cfg.posemb} position embedding needs no resampling")
        return new
    prefix = cfg.num_prefix_tokens if cfg.posemb_prefix else 0
    state["pos_embed"] = resample_pos_embed(state["pos_embed"], cfg.grid, new.grid, prefix, cfg.posemb_resample)
    report.resampled.append(
        f"pos_embed grid {cfg.grid[0]}x{cfg.grid[1]} -> {new.grid[0]}x{new.grid[1]} "
        f"with {cfg.posemb_resample} "
        f"({prefix} prefix row(s) kept) because {why}"
    )
    return new


def load_checkpoint(
    path: str | os.PathLike,
    *,
    fmt: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    source_image_size: int | tuple[int, int] | None = None,
    readers: Mapping[str, Reader] | None = None,
    **overrides: Any,
) -> Checkpoint:
    """Read any supported checkpoint file or folder into (config, canonical state, report).

    Args:
        fmt: force a format (``FORMATS``) instead of detecting it.
        image_size: target image size; the position embedding is resampled to its grid with the config's
            ``posemb_resample`` (the format's default, or an override).
        num_classes: target class count; a different count replaces the head with a zero-initialised one
            (0 drops it). Also resolves files whose stored config disagrees with their head, and keeps an
            all-zero .npz head that is otherwise dropped.
        source_image_size: the size the file was trained at, for files that store none and whose grid is
            not square (timm, .npz).
        readers: {'torch': fn, 'orbax': fn} from the framework adapters, for those containers.
        overrides: ViTConfig fields replacing inferred ones (num_heads, gelu, ln_eps, pool, dtype...).

    Raises:
        FileNotFoundError: no such path.
        FormatError (a ValueError): unknown, truncated or corrupt file; a head that disagrees with the
            stored config (pass num_classes); a needed framework reader is missing.
        StateMismatchError (a ValueError): missing / unexpected / wrong-shape tensors, listed together.
    """
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: expected one of {tuple(FORMATS)}")
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(ViTConfig)})
    if unknown:
        raise ValueError(f"unknown ViTConfig field(s) {unknown} to override")
    if source_image_size is not None:
        source_image_size = ViTConfig(image_size=source_image_size, patch_size=1).image_size
    dec, family, n = _decode(path, fmt, readers, source_image_size, overrides, num_classes is not None)
    if dec.conflicts and num_classes is None:
        k = dec.cfg.num_classes
        raise FormatError(
            f"{path}: {'; '.join(dec.conflicts)}. Pass num_classes={k} (vit convert --num-classes "
            f"{k}) to use the head as stored, or another count to replace it"
        )
    report = Report(
        source=str(path),
        format=family,
        layout=dec.layout,
        tensors_read=n,
        inferred=dec.inferred,
        dropped=list(dec.dropped),
        notes=list(dec.notes),
    )
    cfg, state = dec.cfg, dict(dec.state)
    if num_classes is not None and num_classes != cfg.num_classes:
        cfg = _new_head(cfg, state, num_classes, report)
    if image_size is not None:
        cfg = _resample(cfg, state, image_size, report)
    check_canonical(cfg, state, str(path))
    state = {k: state[k] for k in canonical_shapes(cfg)}  # timm state_dict order
    report.warnings += [
        f"{k}={getattr(cfg, k)!r} {how}: the file does not store it (wrong if the model was made otherwise)"
        for k, how in dec.inferred.items()
        if how.startswith("guessed") and k not in overrides
    ]
    report.warnings += [f"{k} holds NaN or Inf" for k in nonfinite(state)]
    report.config = cfg
    return Checkpoint(cfg, state, report)


def read_checkpoint(path: str | os.PathLike, **kwargs: Any) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """(config, canonical state) of any supported checkpoint; arguments as ``load_checkpoint``.

    The report's warnings (guessed fields, NaN/Inf tensors) are issued as ``UserWarning``s.
    """
    ckpt = load_checkpoint(path, **kwargs)
    for w in ckpt.report.warnings:
        warnings.warn(f"{path}: {w}", UserWarning, stacklevel=2)
    return ckpt.cfg, ckpt.state


# --------------------------------------------------------------------------------------- writing


def encode(
    cfg: ViTConfig,
    state: Mapping[str, np.ndarray],
    fmt: str,
    *,
    spelling: str = "v4",
    prefix: str | None = None,
    scan: bool = False,
) -> tuple[ViTConfig, dict, dict, dict | None, list[str]]:
    """``state`` as ``fmt`` holds it: (config, canonical state as stored, file tensors, HF config.json or
    None, notes). The stored state differs from ``state`` only where the format needs it (notes say how).

    Raises:
        StateMismatchError: ``state`` does not fit ``cfg``.
        ValueError: the format cannot hold this config (names each reason).
    """
    check_canonical(cfg, state, f"writing {fmt}")
    if fmt in ("canonical", "orbax"):
        return cfg, dict(state), dict(state), None, []
    if fmt == "timm":
        cfg, state, notes = timm.prepare(cfg, state)
        return cfg, state, timm.write(cfg, state), None, notes
    if fmt == "hf":
        cfg, state, notes = hf.prepare(cfg, state)
        config, tensors = hf.write(cfg, state, spelling)
        return cfg, state, tensors, config, notes
    if fmt in ("original_vit", "big_vision"):
        cfg, state, notes = npz.prepare(cfg, state, fmt)
        return cfg, state, npz.write(cfg, state, fmt, prefix=prefix, scan=scan), None, notes
    raise ValueError(f"format {fmt!r}: expected one of {tuple(FORMATS)}")


def _read_back(
    fmt: str,
    cfg: ViTConfig,
    state: Mapping[str, np.ndarray],
    tensors: Mapping[str, np.ndarray],
    config: dict | None,
) -> list[str]:
    """Decode the encoded tensors in memory; raise if any tensor differs, return what the format loses."""
    if fmt in ("canonical", "orbax"):
        return []
    kw = dict(source_image_size=cfg.image_size, context=f"{fmt} read-back")
    unguessable = []
    if fmt == "timm":
        try:
            dec = timm.read(tensors, **kw)
        except FormatError as e:  # a width without a head-count guess: such a file needs num_heads to be read
            if "num_heads" not in str(e):
                raise
            dec = timm.read(tensors, overrides={"num_heads": cfg.num_heads}, **kw)
            unguessable = [
                f"{fmt} files do not record num_heads={cfg.num_heads!r} (and width {cfg.width} gives no "
                f"guess); pass num_heads={cfg.num_heads!r} when reading the file"
            ]
    elif fmt == "hf":
        dec = hf.read(tensors, config, **kw)
    else:
        dec = npz.read(tensors, keep_zero_head=True, **kw)
    bad = [
        k
        for k, v in state.items()
        if k not in dec.state
        or np.asarray(v).dtype != dec.state[k].dtype
        or not np.array_equal(np.asarray(v), dec.state[k])
    ]
    if bad or set(dec.state) != set(state):
        raise AssertionError(f"{fmt} writer does not read back bit-exact: {bad or set(dec.state) ^ set(state)}")
    lost = unguessable
    for name, value in cfg.to_dict().items():
        back = dec.cfg.to_dict()[name]
        if name not in _RUNTIME_FIELDS and back != value:
            lost.append(
                f"{fmt} files do not record {name}={value!r} (it reads back as {back!r}); pass "
                f"{name}={value!r} when reading the file"
            )
    return lost


def save_checkpoint(
    path: str | os.PathLike,
    cfg: ViTConfig,
    state: Mapping[str, np.ndarray],
    fmt: str | None = None,
    *,
    writers: Mapping[str, Callable] | None = None,
    spelling: str = "v4",
    prefix: str | None = None,
    scan: bool = False,
    preprocess: Preprocess | None = None,
    classes: Sequence[str] | None = None,
) -> Report:
    """Write ``state`` as ``fmt`` (default: from the suffix, see ``output_format``), atomically.

    Options: ``spelling`` of HF keys ('v4' as save_pretrained writes, or 'v5'); ``prefix`` and ``scan``
    for .npz layouts. ``preprocess`` and ``classes`` (K names) are recorded where the format can hold
    them (``vit_common.metadata``): safetensors metadata of our and timm files, an HF folder's
    preprocessor_config.json and id2label; other formats get a note. Nothing is written unless the whole
    conversion succeeds; an existing folder is replaced only if it is a checkpoint folder itself.

    Raises:
        StateMismatchError / ValueError: the state does not fit, or the format cannot hold the config.
        FormatError: a writer this format needs (torch, orbax) was not given.
    """
    path = Path(path)
    fmt = fmt or output_format(path)
    cfg2, state2, tensors, config, notes = encode(cfg, state, fmt, spelling=spelling, prefix=prefix, scan=scan)
    report = Report(config=cfg2, notes=notes, written=str(path), written_format=fmt)
    report.warnings += _read_back(fmt, cfg2, state2, tensors, config)
    if (
        path.is_dir()
        and any(path.iterdir())
        and not ((path / "config.json").is_file() or (path / ORBAX_CONFIG).is_file())
    ):
        raise FormatError(f"{path}: an existing folder that is not a checkpoint; refusing to replace it")
    torch_file = fmt == "timm" and path.suffix in TORCH_SUFFIXES
    info = info_metadata(preprocess, classes)
    if info and (torch_file or fmt in ("original_vit", "big_vision", "orbax")):
        report.notes.append(f"{fmt} files record no preprocessing or class names: they were not written")
    if fmt == "hf" and classes is not None and cfg2.num_classes:
        config |= hf_labels(classes, cfg2.num_classes)
    if torch_file or fmt == "orbax":
        what = "orbax" if fmt == "orbax" else "torch"
        fn = (writers or {}).get(what)
        if fn is None:
            raise FormatError(
                f"{path}: writing {what} needs vit_{'jax' if what == 'orbax' else 'torch'}."
                f"formats.WRITERS, which the caller did not pass"
            )
        fn(path, cfg2, tensors) if fmt == "orbax" else fn(path, tensors)
    elif fmt == "canonical":
        canonical.save_canonical(path, cfg2, tensors, info)
    elif fmt == "timm":
        canonical.save_safetensors(path, tensors, {"format": "pt", **info})
    elif fmt == "hf":

        def write_folder(tmp: Path) -> None:
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            canonical.save_safetensors(tmp / "model.safetensors", tensors, {"format": "pt"})
            if preprocess is not None:
                pre = hf_preprocessor_config(preprocess, cfg2.image_size, cfg2.in_chans)
                (tmp / "preprocessor_config.json").write_text(json.dumps(pre, indent=2, sort_keys=True) + "\n")

        canonical.atomic_write_dir(path, write_folder)
    else:

        def write_npz(tmp: str) -> None:
            with open(tmp, "wb") as fh:
                np.savez(fh, **tensors)

        canonical.atomic_write(path, write_npz)
    return report


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    from_fmt: str | None = None,
    to_fmt: str | None = None,
    readers=None,
    writers=None,
    write_options: Mapping[str, Any] = (),
    **read_options: Any,
) -> Report:
    """Read ``src`` (see ``load_checkpoint`` for ``read_options``) and write ``dst``; one report for both.

    Preprocessing and class names that ``src`` declares (``vit_common.metadata``) are written where
    ``dst``'s format holds them; assumed ones are not (the destination would declare a guess), nor class
    names for a replaced head.

    Raises:
        ValueError: ``dst`` is ``src`` (the source would be replaced by its own conversion); and what
            ``load_checkpoint`` and ``save_checkpoint`` raise.
    """
    if Path(dst).resolve() == Path(src).resolve():
        raise ValueError(f"{dst} is the source file itself: write the conversion somewhere else")
    ckpt = load_checkpoint(src, fmt=from_fmt, readers=readers, **read_options)
    info = read_info(src, ckpt.report.format)
    declared = dict(
        preprocess=info.preprocess if info.preprocess_source.startswith("declared") else None,
        classes=info.classes if info.classes is not None and len(info.classes) == ckpt.cfg.num_classes else None,
    )
    out = save_checkpoint(dst, ckpt.cfg, ckpt.state, to_fmt, writers=writers, **declared, **dict(write_options))
    report = ckpt.report
    report.notes += out.notes
    report.warnings += out.warnings
    report.written, report.written_format = out.written, out.written_format
    return report
