"""What a checkpoint says about its inputs and outputs: preprocessing and class names, with provenance.

The weights alone do not say how images were normalised, resized and cropped, nor what the classes are
called. Where a file records them they are **declared**; otherwise the format's usual choice is
**assumed**, and a warning says so and names the flags that override it:

=============== ================================================================ ==========================
format          preprocessing                                                    class names
=============== ================================================================ ==========================
canonical       safetensors metadata ``preprocess`` (JSON), else assumed [-1, 1]  metadata ``classes``
timm            safetensors metadata as ours when we wrote the file, else        as ours, else none
                assumed ImageNet mean/std, bicubic, crop 0.9 (DeiT, most timm)
hf              ``preprocessor_config.json`` (image_mean/std, resample, size,     ``config.json`` id2label
                crop), else assumed transformers ViTImageProcessor defaults       (LABEL_i = none)
original_vit,   assumed [-1, 1], bilinear resize to the size (big_vision          none
big_vision      ``value_range(-1, 1)``, the original ViT's evaluation)
orbax           ``vit_config.json`` ``preprocess``, else assumed [-1, 1]          ``classes``
=============== ================================================================ ==========================

``info_metadata`` / ``hf_files`` give what the writers store, so our files read back as declared.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_common.data.images import PRESETS, Preprocess

# transformers' PILImageResampling values (= Pillow's Image.Resampling) of the filters we use.
_HF_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}
_ASSUMED = {
    "canonical": (Preprocess(), "vit train's default before files recorded it: [-1, 1], bilinear, squash"),
    "orbax": (Preprocess(), "vit train's default before files recorded it: [-1, 1], bilinear, squash"),
    "timm": (
        PRESETS["imagenet"],
        "timm files store none; ImageNet mean/std, bicubic, crop 0.9 as DeiT and most timm weights (timm "
        "augreg and original-ViT ports use --mean 0.5 --std 0.5)",
    ),
    "hf": (PRESETS["hf_vit"], "no preprocessor_config.json; transformers ViTImageProcessor defaults"),
    "original_vit": (PRESETS["big_vision"], "the original ViT's evaluation: [-1, 1], bilinear resize"),
    "big_vision": (PRESETS["big_vision"], "big_vision value_range(-1, 1), bilinear resize"),
}
OVERRIDE_FLAGS = "--mean/--std/--interpolation/--crop-pct/--crop-mode"


@dataclass
class ModelInfo:
    """Preprocessing and class names of a checkpoint, each with where it came from.

    ``preprocess_source`` / ``classes_source`` start with 'declared', 'assumed' or 'given' (a flag);
    ``classes`` is None when nothing names them. ``warnings`` say what was assumed.
    """

    preprocess: Preprocess
    preprocess_source: str
    classes: tuple[str, ...] | None = None
    classes_source: str = "none: the file names no classes"
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "preprocess": self.preprocess.to_dict(),
            "preprocess_source": self.preprocess_source,
            "classes": list(self.classes) if self.classes is not None else None,
            "classes_source": self.classes_source,
            "warnings": list(self.warnings),
        }


def _json_object(path: Path) -> dict | None:
    from vit_common.system.io import read_json

    try:
        data = read_json(path)  # bounded in size and depth; a FIFO or device is not opened
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _safetensors_metadata(path: Path) -> dict[str, str]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError):
        return {}


def _classes(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise ValueError(f"{where}: classes {value!r} is not a list of strings")
    return tuple(value)


def hf_preprocess(config: dict, where: str) -> Preprocess:
    """The ``Preprocess`` of a transformers image-processor config (preprocessor_config.json).

    ``size`` {"height", "width"} resizes both sides (squash), {"shortest_edge": S} the shorter one; with
    ``do_center_crop`` the crop (``crop_size``) over the resize gives crop_pct; ``crop_pct`` is read
    where a processor stores it. ``do_normalize`` False means mean 0, std 1.

    Raises:
        ValueError: a rescale other than 1/255, an unknown resample filter or malformed values (named).
    """
    try:
        if config.get("do_rescale", True) and abs(float(config.get("rescale_factor", 1 / 255)) * 255 - 1) > 1e-6:
            raise ValueError(f"rescale_factor={config.get('rescale_factor')!r} (only 1/255 is supported)")
        resample = config.get("resample", 2)
        if resample not in _HF_RESAMPLE:
            raise ValueError(f"resample={resample!r} (supported: {_HF_RESAMPLE})")
        if config.get("do_normalize", True):
            mean, std = config.get("image_mean", [0.5] * 3), config.get("image_std", [0.5] * 3)
        else:
            mean, std = [0.0], [1.0]
        size = config.get("size") or {"height": 224, "width": 224}
        crop_mode = "center" if isinstance(size, dict) and "shortest_edge" in size else "squash"
        crop_pct = 1.0
        if config.get("crop_pct"):
            crop_pct = float(config["crop_pct"])
        elif config.get("do_center_crop") and isinstance(config.get("crop_size"), dict):
            edge = size.get("shortest_edge") or size.get("height")
            crop_pct = float(config["crop_size"].get("height")) / float(edge)
        return Preprocess(tuple(mean), tuple(std), _HF_RESAMPLE[resample], min(crop_pct, 1.0), crop_mode)
    except (TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"{where}: cannot read the preprocessing ({e})") from e


def _hf_classes(config: dict) -> tuple[str, ...] | None:
    labels = config.get("id2label")
    if not isinstance(labels, dict) or not labels:
        return None
    try:
        ordered = [str(labels[k]) for k in sorted(labels, key=int)]
    except ValueError:
        return None
    if ordered == [f"LABEL_{i}" for i in range(len(ordered))]:
        return None  # transformers' placeholder names
    return tuple(ordered)


def read_info(path: str | os.PathLike, family: str) -> ModelInfo:
    """Preprocessing and class names of the checkpoint at ``path``, read as ``family`` (the format name
    ``vit_common.checkpoints.convert.load_checkpoint`` reports).

    Raises:
        ValueError: the file declares preprocessing or classes that are malformed (names the file).
    """
    path = Path(path)
    declared: dict[str, Any] = {}
    where = str(path)
    if path.is_file() and path.suffix == ".safetensors":
        meta = _safetensors_metadata(path)
        for key in ("preprocess", "classes"):
            if key in meta:
                from vit_common.system.io import parse_json

                declared[key] = parse_json(meta[key], f"{path}: metadata {key!r}")
        where = f"{path} metadata"
    folder = path if path.is_dir() else path.parent
    if family == "hf":
        pre = _hf_preprocess_file(folder)
        if pre is not None:
            declared["preprocess"], where = pre, str(folder / "preprocessor_config.json")
        config = _json_object(folder / "config.json") or {}
        if "classes" not in declared and _hf_classes(config) is not None:
            declared["classes"] = list(_hf_classes(config))
    if family == "orbax":
        stored = _json_object(folder / "vit_config.json") or {}
        declared.update({k: stored[k] for k in ("preprocess", "classes") if k in stored})
        where = str(folder / "vit_config.json")
    default, why = _ASSUMED.get(family, _ASSUMED["canonical"])
    info = ModelInfo(default, f"assumed: {why}")
    pre = declared.get("preprocess")
    if isinstance(pre, Preprocess):
        info.preprocess, info.preprocess_source = pre, f"declared: {where}"
    elif pre is not None:
        try:
            info.preprocess = Preprocess.from_dict(pre)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: the stored preprocessing {pre!r} is invalid ({e})") from e
        info.preprocess_source = f"declared: {where}"
    else:
        info.warnings.append(f"preprocessing {info.preprocess_source}; override with {OVERRIDE_FLAGS}")
    if "classes" in declared:
        info.classes = _classes(declared["classes"], where)
        info.classes_source = f"declared: {folder / 'config.json' if family == 'hf' else where}"
    return info


def _hf_preprocess_file(folder: Path) -> Preprocess | None:
    p = folder / "preprocessor_config.json"
    if not p.is_file():
        return None
    config = _json_object(p)
    if config is None:
        raise ValueError(f"{p}: not a readable JSON object")
    return hf_preprocess(config, str(p))


def with_overrides(info: ModelInfo, preprocess: dict[str, Any], classes: list[str] | None) -> ModelInfo:
    """``info`` with preprocessing fields and class names given on the command line (provenance 'given').

    Raises:
        ValueError: an invalid field value (named).
    """
    given = {k: v for k, v in preprocess.items() if v is not None}
    out = ModelInfo(info.preprocess, info.preprocess_source, info.classes, info.classes_source, list(info.warnings))
    if given:
        out.preprocess = info.preprocess.replace(**given)
        out.preprocess_source = f"given ({', '.join(sorted(given))}) over {info.preprocess_source}"
        if set(given) >= {"mean", "std"}:
            out.warnings = [w for w in out.warnings if not w.startswith("preprocessing ")]
    if classes is not None:
        out.classes, out.classes_source = tuple(classes), "given: --classes"
    return out


def info_metadata(preprocess: Preprocess | None, classes: tuple[str, ...] | list[str] | None) -> dict[str, str]:
    """Safetensors metadata entries that record preprocessing and class names (our and timm files)."""
    meta = {}
    if preprocess is not None:
        meta["preprocess"] = json.dumps(preprocess.to_dict(), sort_keys=True)
    if classes is not None:
        meta["classes"] = json.dumps(list(classes))
    return meta


def hf_labels(classes: tuple[str, ...] | list[str] | None, num_classes: int) -> dict[str, Any]:
    """config.json ``id2label`` / ``label2id`` for K = ``num_classes`` (transformers' LABEL_i without names).

    Raises:
        ValueError: names that are not K distinct strings.
    """
    names = [f"LABEL_{i}" for i in range(num_classes)] if classes is None else [str(c) for c in classes]
    if len(names) != num_classes or len(set(names)) != len(names):
        raise ValueError(f"class names {names!r}: expected {num_classes} distinct names")
    return {"id2label": {str(i): n for i, n in enumerate(names)}, "label2id": {n: i for i, n in enumerate(names)}}


def hf_preprocessor_config(preprocess: Preprocess, image_size: tuple[int, int], channels: int) -> dict[str, Any]:
    """preprocessor_config.json of a transformers image processor doing what ``preprocess`` does at
    ``image_size`` (H, W) for C = ``channels``: ViTImageProcessor for a squash resize with crop_pct 1,
    DeiTImageProcessor-style resize + centre crop (``size``/``crop_size``, and ``crop_pct``) otherwise."""
    h, w = image_size
    preprocess.channel_stats(channels)  # raises if mean/std do not fit C
    mean, std = (list(v) * (channels if len(v) == 1 else 1) for v in (preprocess.mean, preprocess.std))
    resample = {v: k for k, v in _HF_RESAMPLE.items()}[preprocess.interpolation]
    config: dict[str, Any] = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "resample": resample,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": mean,
        "image_std": std,
        "size": {"height": h, "width": w},
    }
    if preprocess.crop_pct < 1 or preprocess.crop_mode == "center":
        sh, sw = int(h / preprocess.crop_pct), int(w / preprocess.crop_pct)
        config["image_processor_type"] = "DeiTImageProcessor"
        config["size"] = {"shortest_edge": sh} if preprocess.crop_mode == "center" else {"height": sh, "width": sw}
        config["do_center_crop"] = True
        config["crop_size"] = {"height": h, "width": w}
        config["crop_pct"] = preprocess.crop_pct
    return config
