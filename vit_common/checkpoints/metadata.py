"""What a checkpoint says about its inputs and outputs: preprocessing and class names, with provenance.

The weights alone do not say how images were normalised, resized and cropped, nor what the classes are
called. Where a file records them they are **declared**; otherwise the format's usual choice is
**assumed**, and a warning says so and names the flags that override it. What each format declares and
assumes is the format's own answer (``Format.declared``, ``Format.assumed_preprocess``; e.g. an HF
folder's ``preprocessor_config.json`` and ``id2label``, the safetensors metadata of our and timm files, a
stored ``vit_config.json``); ``read_info`` turns it into a ``ModelInfo``. The helpers here parse and
write those places: ``info_metadata`` / ``hf_labels`` / ``hf_preprocessor_config`` give what the writers
store, so our files read back as declared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_common.data.images import Preprocess
from vit_common.system.io import parse_json, read_json

# transformers' PILImageResampling values (= Pillow's Image.Resampling) of the filters we use.
_HF_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}
OVERRIDE_FLAGS = "--mean/--std/--interpolation/--crop-pct/--crop-mode"


@dataclass(frozen=True)
class Declared:
    """What a file declares, as found: ``preprocess`` (a ``Preprocess`` or its stored dict, None if not
    declared) and ``classes`` (the stored value, checked by ``read_info``; None if not declared), each
    with where it was found (a file, or a file's metadata)."""

    preprocess: Preprocess | dict | None = None
    preprocess_where: str = ""
    classes: Any = None
    classes_where: str = ""


def declared_in_metadata(meta: dict[str, str], where: str) -> Declared:
    """The ``preprocess`` and ``classes`` entries (JSON) of safetensors header metadata ``meta``.

    Raises:
        ValueError: an entry that is not JSON (names ``where`` and the key).
    """
    found: dict[str, Any] = {}
    for key in ("preprocess", "classes"):
        if key in meta:
            found[key] = parse_json(meta[key], f"{where}: metadata {key!r}")  # bounded in size and depth
    return Declared(found.get("preprocess"), where, found.get("classes"), where)


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


def hf_classes(config: dict) -> tuple[str, ...] | None:
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


def read_info(src, fmt) -> ModelInfo:
    """Preprocessing and class names of the checkpoint ``src`` (a ``formats.protocol.Source``, already
    read) of format ``fmt`` (its ``Format``): what ``fmt.declared(src)`` finds, else the format's
    ``assumed_preprocess`` with a warning naming the flags that override it.

    Raises:
        ValueError: the file declares preprocessing or classes that are malformed (names the file).
    """
    found = fmt.declared(src)
    info = ModelInfo(fmt.assumed_preprocess, f"assumed: {fmt.assumed_why}")
    pre = found.preprocess
    if isinstance(pre, Preprocess):
        info.preprocess, info.preprocess_source = pre, f"declared: {found.preprocess_where}"
    elif pre is not None:
        try:
            info.preprocess = Preprocess.from_dict(pre)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{found.preprocess_where}: the stored preprocessing {pre!r} is invalid ({e})") from e
        info.preprocess_source = f"declared: {found.preprocess_where}"
    else:
        info.warnings.append(f"preprocessing {info.preprocess_source}; override with {OVERRIDE_FLAGS}")
    if found.classes is not None:
        info.classes = _classes(found.classes, found.classes_where)
        info.classes_source = f"declared: {found.classes_where}"
    return info


def hf_preprocess_file(folder: Path) -> Preprocess | None:
    """The ``Preprocess`` of ``folder``'s preprocessor_config.json (``hf_preprocess``), None if it has none.

    Raises:
        ValueError: the file is not a JSON object, or its preprocessing cannot be read (names the file).
    """
    p = folder / "preprocessor_config.json"
    if not p.is_file():
        return None
    config = read_json(p)
    if not isinstance(config, dict):
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
