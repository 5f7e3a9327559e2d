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
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_common.data.images import Preprocess
from vit_common.system.io import parse_json, read_json
from vit_common.system.validate import regular_file

# transformers' PILImageResampling values (= Pillow's Image.Resampling) of the filters we use (4 BOX and
# 5 HAMMING are not among them).
_HF_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}

# The image-processor classes of the HF ViT-family folders and the defaults each applies to a key its
# preprocessor_config.json omits: transformers 5.24 models/{vit,deit,siglip,clip,bit,siglip2}/image_processing_*.py
# (the torchvision and the PIL class of each set the same), over BaseImageProcessor's
# (image_processing_utils.py: rescale_factor 1/255, default_to_square True; None where nothing is set).
# IMAGENET_STANDARD_MEAN/STD and OPENAI_CLIP_MEAN/STD: transformers image_utils.py.
_STANDARD = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
_CLIP = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
_BASE = {
    "do_resize": True, "do_rescale": True, "do_normalize": True, "rescale_factor": 1 / 255,
    "default_to_square": True, "do_center_crop": None, "crop_size": None, "do_convert_rgb": None,
}  # fmt: skip
HF_PROCESSORS: dict[str, dict[str, Any]] = {
    "ViTImageProcessor": _BASE | _STANDARD | {"resample": 2, "size": {"height": 224, "width": 224}},
    "DeiTImageProcessor": _BASE | _STANDARD | {
        "resample": 3, "size": {"height": 256, "width": 256}, "crop_size": {"height": 224, "width": 224},
        "do_center_crop": True,
    },
    "SiglipImageProcessor": _BASE | _STANDARD | {
        "resample": 3, "size": {"height": 224, "width": 224}, "default_to_square": False, "do_convert_rgb": True,
    },
    "CLIPImageProcessor": _BASE | _CLIP | {
        "resample": 3, "size": {"shortest_edge": 224}, "default_to_square": False,
        "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True,
    },
    "BitImageProcessor": _BASE | _CLIP | {  # DINOv2's
        "resample": 3, "size": {"shortest_edge": 224}, "default_to_square": False,
        "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True,
    },
    "DINOv3ViTImageProcessor": _BASE | {  # models/dinov3_vit; IMAGENET_DEFAULT_MEAN/STD
        "resample": 2, "size": {"height": 224, "width": 224},
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
    },
    # NaFlex: no size; each image resized keeping its aspect ratio to at most max_num_patches patches
    "Siglip2ImageProcessor": _BASE | _STANDARD | {
        "resample": 2, "size": None, "patch_size": 16, "max_num_patches": 256,
    },
}  # fmt: skip
# The classes that rescale before they resize, so resize floats (DINOv3's overrides ``_preprocess``).
HF_RESCALE_BEFORE_RESIZE = ("DINOv3ViTImageProcessor",)
# The class of a file that names none, by the folder's model_type (image_processing_auto.py's mapping,
# which has no entry for clip_vision_model, siglip_vision_model or dinov2_with_registers either).
HF_MODEL_PROCESSORS = {
    "vit": "ViTImageProcessor", "vit_mae": "ViTImageProcessor", "vit_msn": "ViTImageProcessor",
    "ijepa": "ViTImageProcessor", "deit": "DeiTImageProcessor", "siglip": "SiglipImageProcessor",
    "clip": "CLIPImageProcessor", "dinov2": "BitImageProcessor", "siglip2": "Siglip2ImageProcessor",
}  # fmt: skip
# transformers NaFlex folders: a folder without preprocessor_config.json takes their processor's defaults.
HF_NAFLEX_MODEL_TYPES = ("siglip2", "siglip2_vision_model")
HF_KEYS_READ = (
    "do_resize", "size", "default_to_square", "resample", "do_center_crop", "crop_size", "do_rescale",
    "rescale_factor", "do_normalize", "image_mean", "image_std", "do_convert_rgb",
)  # fmt: skip
# The keys of a NaFlex processor (Siglip2ImageProcessor): it reads no size or crop, but these two.
HF_NAFLEX_KEYS = ("patch_size", "max_num_patches")
_GEOMETRY_KEYS = ("size", "default_to_square", "do_center_crop", "crop_size")
# Keys that name the class or its processor (read by ``_processor_type``, or nothing to compute).
HF_KEYS_NAMING = ("image_processor_type", "feature_extractor_type", "processor_class", "_processor_class")
# Keys the processors take that change no pixel at these values (else refused by name): padding off, the
# output layout channels-first, runtime options; ``crop_pct``, which these classes keep unused.
HF_KEYS_WITHOUT_EFFECT = {  # key: (whether the value changes no pixel, what the project does instead)
    "do_pad": (lambda v, c: not v, "the project pads no batch"),
    "pad_size": (lambda v, c: not c.get("do_pad"), "the project pads no batch"),
    "data_format": (lambda v, c: v in (None, "channels_first"), "each twin lays its input out itself"),
    "input_data_format": (lambda v, c: v is None, "images are decoded by Pillow"),
    "return_tensors": (lambda v, c: True, ""),
    "device": (lambda v, c: True, ""),
    "disable_grouping": (lambda v, c: True, ""),
    "image_seq_length": (lambda v, c: True, ""),
    "crop_pct": (lambda v, c: True, ""),
}
OVERRIDE_FLAGS = "--mean/--std/--interpolation/--crop-pct/--crop-mode"
# The metadata entry (our, timm .safetensors; orbax's stored config) saying the preprocessing was assumed.
PREPROCESS_ASSUMED_KEY = "preprocess_assumed"


@dataclass(frozen=True)
class Declared:
    """What a file declares, as found: ``preprocess`` (a ``Preprocess`` or its stored dict, None if not
    declared) and ``classes`` (the stored value, checked by ``read_info``; None if not declared), each
    with where it was found (a file, or a file's metadata). ``no_budget``: the file holds a NaFlex model
    and declares no patch budget (a big_vision naflex_vit .npz). ``preprocess_assumed``: why the
    preprocessing was assumed where the file records it so (a conversion of a source that did not state it;
    empty: the file states it)."""

    preprocess: Preprocess | dict | None = None
    preprocess_where: str = ""
    classes: Any = None
    classes_where: str = ""
    no_budget: bool = False
    preprocess_assumed: str = ""


def declared_in_metadata(meta: dict[str, str], where: str) -> Declared:
    """The ``preprocess`` and ``classes`` entries (JSON) of safetensors header metadata ``meta``.

    Raises:
        ValueError: an entry that is not JSON (names ``where`` and the key).
    """
    found: dict[str, Any] = {}
    for key in ("preprocess", "classes"):
        if key in meta:
            found[key] = parse_json(meta[key], f"{where}: metadata {key!r}")  # bounded in size and depth
    why = meta.get(PREPROCESS_ASSUMED_KEY, "") if "preprocess" in found else ""
    return Declared(found.get("preprocess"), where, found.get("classes"), where, preprocess_assumed=str(why))


@dataclass
class ModelInfo:
    """Preprocessing and class names of a checkpoint, each with where it came from.

    ``preprocess_source`` / ``classes_source`` start with 'declared', 'assumed' or 'given' (a flag);
    ``classes`` is None when nothing names them. ``warnings`` say what was assumed. ``no_budget``: a
    NaFlex model whose file declares no patch budget (a big_vision naflex_vit .npz); ``preprocess`` is
    then the format's usual values without ``max_patches``, which ``with_overrides`` needs given.
    """

    preprocess: Preprocess
    preprocess_source: str
    classes: tuple[str, ...] | None = None
    classes_source: str = "none: the file names no classes"
    warnings: list[str] = field(default_factory=list)
    no_budget: bool = False

    def describe(self, size: tuple[int, int]) -> str:
        """The preprocessing in words (``Preprocess.describe``), a patch budget not declared said so."""
        budget = "a patch budget not declared (--max-patches N)" if self.no_budget else None
        return self.preprocess.describe(size, budget)

    def check(self, image_size: tuple[int, int], num_classes: int, where: str) -> None:
        """Refuse what ``vit predict`` / ``vit evaluate`` could not use with a model taking (H, W) =
        ``image_size`` and ``num_classes`` classes, before it is written or used: class names not one a
        class; a transformers geometry whose output is not (H, W) (a crop larger or smaller than the
        model's input); an evaluation resize of more pixels than Pillow's decompression-bomb limit
        (``PIL.Image.MAX_IMAGE_PIXELS``; for a shorter-side resize S, S x S, the least it can be).

        Raises:
            ValueError: one line naming ``where``, the value and what it contradicts.
        """
        from PIL import Image

        if self.classes is not None and len(self.classes) != num_classes:
            raise ValueError(
                f"{where}: {len(self.classes)} class names ({self.classes_source}) for a model with {num_classes} "
                "classes: expected one name a class (--classes replaces them)"
            )
        h, w = image_size
        pp = self.preprocess
        if pp.resize_size is None:
            resize = (math.floor(h / pp.crop_pct), math.floor(w / pp.crop_pct))
            what = f"crop_pct={pp.crop_pct} at {h}x{w}"
        else:
            resize = pp.resize_size * (3 - len(pp.resize_size))
            what = f"resize_size={list(pp.resize_size)}"
            out = pp.crop_size or pp.resize_size
            if tuple(out) != (h, w):
                raise ValueError(
                    f"{where}: the preprocessing ({what}, crop_size={pp.crop_size and list(pp.crop_size)}; "
                    f"{self.preprocess_source}) gives {'x'.join(map(str, out))} images; the model takes {h}x{w}"
                )
        if resize[0] * resize[1] > Image.MAX_IMAGE_PIXELS:
            raise ValueError(
                f"{where}: the preprocessing ({what}; {self.preprocess_source}) resizes every image to "
                f"{resize[0]}x{resize[1]} pixels or more: expected at most Pillow's {Image.MAX_IMAGE_PIXELS}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "preprocess": self.preprocess.to_dict(),
            "preprocess_source": self.preprocess_source,
            "classes": list(self.classes) if self.classes is not None else None,
            "classes_source": self.classes_source,
            "warnings": list(self.warnings),
            "no_budget": self.no_budget,
        }


def _classes(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise ValueError(f"{where}: classes {value!r} is not a list of strings")
    return tuple(value)


def _processor_type(config: dict, model_type: Any) -> str:
    """The image-processor class ``config`` names, as ``AutoImageProcessor.from_pretrained`` finds it
    (transformers 5.24 ``models/auto/image_processing_auto.py``): ``image_processor_type`` without the
    backend suffix ('Fast': torchvision, 'Pil': PIL; both compute the same), else
    ``feature_extractor_type`` ('XFeatureExtractor' -> 'XImageProcessor'), else the folder's model_type.

    Raises:
        ValueError: a type the project does not read, or none found (named).
    """
    name = config.get("image_processor_type")
    if name is None and isinstance(config.get("feature_extractor_type"), str):
        name = config["feature_extractor_type"].replace("FeatureExtractor", "ImageProcessor")
    if name is None:
        name = HF_MODEL_PROCESSORS.get(model_type) if isinstance(model_type, str) else None
        if name is None:
            raise ValueError(
                f"no image_processor_type, and model_type={model_type!r} names none "
                f"(the project reads {', '.join(sorted(HF_MODEL_PROCESSORS))})"
            )
    if isinstance(name, str):
        name = name.removesuffix("Fast").removesuffix("Pil")
    if name not in HF_PROCESSORS:
        raise ValueError(f"image_processor_type={name!r} (the project reads {', '.join(HF_PROCESSORS)})")
    return name


def _pixels(value: Any, key: str, default_to_square: bool) -> tuple[int, ...]:
    """A transformers size value as ``Preprocess`` holds it: (S,) for a shortest edge, (H, W) for both
    sides; an int as ``image_processing_utils.get_size_dict`` reads it (``default_to_square``: a square,
    else a shortest edge), a list as (height, width).

    Raises:
        ValueError: another key set (longest_edge, max_height/max_width, min/max_pixels) or bad numbers.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        out = (value, value) if default_to_square else (value,)
    elif isinstance(value, list) and len(value) == 2:
        out = tuple(value)
    elif isinstance(value, dict) and set(value) == {"height", "width"}:
        out = (value["height"], value["width"])
    elif isinstance(value, dict) and set(value) == {"shortest_edge"} and key == "size":
        out = (value["shortest_edge"],)
    else:
        shapes = "{height, width} or {shortest_edge}" if key == "size" else "{height, width}"
        raise ValueError(f"{key}={value!r} (the project resizes to {shapes})")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in out):
        raise ValueError(f"{key}={value!r}: expected positive integers")
    return out


def hf_preprocess(config: dict, where: str, model_type: Any = None, patch_size: Any = None) -> Preprocess:
    """The ``Preprocess`` of a transformers image-processor config (preprocessor_config.json), as its
    processor class computes it: the class's own defaults (``HF_PROCESSORS``) for each key the file
    omits or sets to null, then resize (``size``: {height, width} both sides, {shortest_edge} the shorter
    one, an int as the class's ``default_to_square`` says), centre crop (``do_center_crop``,
    ``crop_size``), rescale (``do_rescale``, ``rescale_factor``), normalise (``do_normalize``,
    ``image_mean``, ``image_std``). ``model_type`` (the folder's config.json) names the class where the
    file does not. ``do_convert_rgb`` needs nothing: the project always converts to the model's channels
    (transformers without it refuses a grey or RGBA image). ``crop_pct`` is not read by these classes
    (transformers 5.24 keeps it unused), so it is not read here either. ``Siglip2ImageProcessor`` (NaFlex)
    reads no size or crop but ``max_num_patches`` (``Preprocess.max_patches``) and ``patch_size``, which
    must be the model's ``patch_size`` (an int or (P, P); None: not checked).

    Raises:
        ValueError: anything the project cannot compute, by name (an unknown processor type or key,
            ``do_resize`` false, ``do_pad`` true, a resample other than nearest/lanczos/bilinear/bicubic,
            a size form it cannot resize to, a shortest-edge resize without a crop (images of varying
            size), ``do_center_crop`` without ``crop_size``, malformed values, a NaFlex patch size other
            than the model's); the message names ``where``.
    """
    try:
        name = _processor_type(config, model_type)
        naflex = "max_num_patches" in HF_PROCESSORS[name]
        read = (*(k for k in HF_KEYS_READ if k not in _GEOMETRY_KEYS), *HF_NAFLEX_KEYS) if naflex else HF_KEYS_READ
        unknown = sorted(set(config) - set(read) - set(HF_KEYS_NAMING) - set(HF_KEYS_WITHOUT_EFFECT))
        unknown = [k for k in unknown if not (naflex and k in _GEOMETRY_KEYS and config[k] is None)]  # unused
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))}: not a key the project reads for {name}")
        for key, (ok, instead) in HF_KEYS_WITHOUT_EFFECT.items():
            if key in config and not ok(config[key], config):
                raise ValueError(f"{key}={config[key]!r} ({instead})")
        got = HF_PROCESSORS[name] | {k: v for k, v in config.items() if k in read and v is not None}
        for key in ("do_resize", "do_center_crop", "do_rescale", "do_normalize", "do_convert_rgb", "default_to_square"):
            if got[key] is not None and not isinstance(got[key], bool):
                raise ValueError(f"{key}={got[key]!r}: expected true or false")
        if not got["do_resize"]:
            raise ValueError("do_resize=false (images would enter at their own sizes; the project resizes)")
        resample = got["resample"]
        if isinstance(resample, bool) or resample not in _HF_RESAMPLE:
            raise ValueError(f"resample={resample!r} (the project resamples with {_HF_RESAMPLE})")
        mean, std, rescale = _normalization(got)
        if naflex:
            return Preprocess(
                mean, std, _HF_RESAMPLE[resample], rescale_factor=rescale, max_patches=_naflex_patches(got, patch_size)
            )
        resize = _pixels(got["size"], "size", got["default_to_square"])
        crop = None
        if got["do_center_crop"]:
            if got["crop_size"] is None:
                raise ValueError("do_center_crop=true without crop_size")
            crop = _pixels(got["crop_size"], "crop_size", True)
        elif len(resize) == 1:
            raise ValueError(f"size={got['size']!r} without a centre crop (images of varying size)")
        mode = "center" if len(resize) == 1 else "squash"
        return Preprocess(
            mean, std, _HF_RESAMPLE[resample], 1.0, mode, rescale_factor=rescale, resize_size=resize,
            crop_size=crop, rescale_before_resize=name in HF_RESCALE_BEFORE_RESIZE,
        )  # fmt: skip
    except (TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"{where}: cannot read the preprocessing ({e})") from e


def _normalization(got: dict) -> tuple[tuple, tuple, float]:
    """(mean, std, rescale_factor) of a processor's settings ``got`` (one value for every channel kept as one)."""
    if got["do_normalize"]:
        mean, std = (tuple(v) if isinstance(v, list) else (v,) for v in (got["image_mean"], got["image_std"]))
        if len(set(mean)) == len(set(std)) == 1:  # one value for every channel
            mean, std = mean[:1], std[:1]
    else:
        mean, std = (0.0,), (1.0,)
    return mean, std, got["rescale_factor"] if got["do_rescale"] else 1.0


def _naflex_patches(got: dict, patch_size: Any) -> int:
    """A NaFlex processor's ``max_num_patches``, its ``patch_size`` checked against the model's (``hf_preprocess``)."""
    for key in HF_NAFLEX_KEYS:
        if isinstance(got[key], bool) or not isinstance(got[key], int) or got[key] < 1:
            raise ValueError(f"{key}={got[key]!r}: expected a positive integer")
    model = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    if model is not None and tuple(model) != (got["patch_size"], got["patch_size"]):
        raise ValueError(f"patch_size={got['patch_size']}: the model's patches are {'x'.join(map(str, model))} pixels")
    return got["max_num_patches"]


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
    if isinstance(src.config, dict) and src.config.get("model_type") in HF_NAFLEX_MODEL_TYPES:
        info.preprocess = hf_preprocess({"image_processor_type": "Siglip2ImageProcessor"}, "")
        info.preprocess_source = "assumed: no preprocessor_config.json; transformers Siglip2ImageProcessor defaults"
    pre = found.preprocess
    if isinstance(pre, Preprocess):
        info.preprocess, info.preprocess_source = pre, f"declared: {found.preprocess_where}"
    elif pre is not None:
        try:
            info.preprocess = Preprocess.from_dict(pre)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{found.preprocess_where}: the stored preprocessing {pre!r} is invalid ({e})") from e
        info.preprocess_source = f"declared: {found.preprocess_where}"
    if found.preprocess_assumed:
        info.preprocess_source = f"assumed: {found.preprocess_assumed}"
    if not info.preprocess_source.startswith("declared"):
        info.warnings.append(f"preprocessing {info.preprocess_source}; override with {OVERRIDE_FLAGS}")
    info.no_budget = found.no_budget and info.preprocess.max_patches is None
    if found.classes is not None:
        info.classes = _classes(found.classes, found.classes_where)
        info.classes_source = f"declared: {found.classes_where}"
    return info


def hf_preprocess_file(folder: Path, model_type: Any = None, patch_size: Any = None) -> Preprocess | None:
    """The ``Preprocess`` of ``folder``'s preprocessor_config.json (``hf_preprocess``; ``model_type`` and
    ``patch_size`` what the folder's config.json names), None if it has none.

    Raises:
        ValueError: the file is not a JSON object, not a regular file (a FIFO, a device), or its
            preprocessing cannot be read (names the file).
    """
    p = folder / "preprocessor_config.json"
    if not os.path.lexists(p):
        return None
    regular_file(p, "preprocessor config")  # a FIFO or device named, not taken for a missing file
    config = read_json(p)
    if not isinstance(config, dict):
        raise ValueError(f"{p}: not a readable JSON object")
    return hf_preprocess(config, str(p), model_type, patch_size)


def hf_patch_size(config: dict | None) -> Any:
    """The patch size a transformers config.json names (its own, else its ``vision_config``'s), None if none."""
    config = config or {}
    vision = config.get("vision_config")
    return config.get("patch_size", vision.get("patch_size") if isinstance(vision, dict) else None)


def with_overrides(
    info: ModelInfo, preprocess: dict[str, Any], classes: list[str] | None, naflexvit: bool = False
) -> ModelInfo:
    """``info`` with preprocessing fields and class names given on the command line (provenance 'given').
    A crop_pct or crop_mode without resize_size/crop_size asks for timm's rule: a transformers geometry
    the file declares is dropped for it. ``max_patches`` changes a NaFlex model's patch budget only, and
    gives one to a NaFlex model whose file declares none (``ModelInfo.no_budget``) and to a timm NaFlexVit
    (``naflexvit``: ``timm_naflex.source_name`` of its report), whose fixed-size preprocessing it makes a
    NaFlex one (the declared mean, std, interpolation and rescale factor; no resize or crop), for timm's
    ``pretrained_cfg`` has no key for the budget.

    Raises:
        ValueError: an invalid field value (named); max_patches for a fixed-size model (one whose
            preprocessing has none); no max_patches for a NaFlex model whose file declares none.
    """
    given = {k: v for k, v in preprocess.items() if v is not None}
    if naflexvit and given.get("max_patches") is not None and info.preprocess.max_patches is None:
        p = info.preprocess
        naflex = Preprocess(
            mean=p.mean,
            std=p.std,
            interpolation=p.interpolation,
            rescale_factor=p.rescale_factor,
            max_patches=given["max_patches"],
        )
        where = f"{info.preprocess_source}, as a NaFlexVit's (no resize or crop)"
        info = ModelInfo(naflex, where, info.classes, info.classes_source, list(info.warnings))
    if info.no_budget and given.get("max_patches") is None:
        raise ValueError(
            "a NaFlex model whose file declares no patch budget (a big_vision naflex_vit .npz): expected "
            "max_patches (--max-patches N), the most patches each image is resized to"
        )
    if given.get("max_patches") is not None and info.preprocess.max_patches is None and not info.no_budget:
        raise ValueError(
            f"max_patches={given['max_patches']} for a fixed-size model (preprocessing {info.preprocess_source}): "
            "expected a NaFlex model, one whose preprocessing resizes to a patch budget (SigLIP 2 NaFlex)"
        )
    if {"crop_pct", "crop_mode"} & set(given) and not {"resize_size", "crop_size"} & set(given):
        given |= {"resize_size": None, "crop_size": None}  # timm's size / crop_pct rule asked for
    out = ModelInfo(info.preprocess, info.preprocess_source, info.classes, info.classes_source, list(info.warnings))
    if given:
        out.preprocess = info.preprocess.replace(**given)
        out.preprocess_source = f"given ({', '.join(sorted(given))}) over {info.preprocess_source}"
        if set(given) >= {"mean", "std"}:
            out.warnings = [w for w in out.warnings if not w.startswith("preprocessing ")]
    if classes is not None:
        out.classes, out.classes_source = tuple(classes), "given: --classes"
    return out


def info_metadata(
    preprocess: Preprocess | None, classes: tuple[str, ...] | list[str] | None, preprocess_assumed: str = ""
) -> dict[str, str]:
    """Safetensors metadata entries that record preprocessing and class names (our and timm files);
    ``preprocess_assumed`` (why the source's preprocessing was assumed) is recorded with it, so that
    readers keep it assumed (``declared_in_metadata``)."""
    meta = {}
    if preprocess is not None:
        meta["preprocess"] = json.dumps(preprocess.to_dict(), sort_keys=True)
        if preprocess_assumed:
            meta[PREPROCESS_ASSUMED_KEY] = preprocess_assumed
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


def hf_preprocessor_config(
    preprocess: Preprocess, image_size: tuple[int, int], channels: int, patch_size: int | None = None
) -> tuple[dict[str, Any], list[str]]:
    """(preprocessor_config.json, notes) of a transformers image processor doing what ``preprocess``
    does at ``image_size`` (H, W) for C = ``channels``: every key stated, so ``hf_preprocess`` reads it
    back equal for a transformers geometry (``Preprocess.resize_size``). ViTImageProcessor for a resize to
    both sides without a crop, DeiTImageProcessor with a crop, CLIPImageProcessor for a shorter-side resize
    and crop, DINOv3ViTImageProcessor for any of them with ``rescale_before_resize``. timm's rule
    (``size / crop_pct``) becomes the sizes it gives at (H, W); a note says where the pixels can differ:
    transformers centres a crop at ``floor((in - out) / 2)``, timm at Python's ``round``, one pixel apart
    where ``in - out`` is 3 mod 4 (always known for 'squash'; on the longer side of some images for
    'center'). A NaFlex preprocessing (``max_patches``) is Siglip2ImageProcessor's, for square patches of
    ``patch_size`` pixels; without ``patch_size`` (a fixed-size folder) its budget is left out, with a
    note, and the rest written for (H, W).

    Raises:
        ValueError: mean/std that do not fit C; timm's 'center' rule for a
            non-square size (timm ``ResizeKeepRatio``, which no transformers processor computes); a
            transformers geometry whose output is not (H, W).
    """
    h, w = image_size
    preprocess.channel_stats(channels)  # raises if mean/std do not fit C
    mean, std = (list(v) * (channels if len(v) == 1 else 1) for v in (preprocess.mean, preprocess.std))
    resample = {v: k for k, v in _HF_RESAMPLE.items()}[preprocess.interpolation]
    stats = {"do_rescale": preprocess.rescale_factor != 1, "rescale_factor": preprocess.rescale_factor}
    stats |= {"do_normalize": True, "image_mean": mean, "image_std": std}
    if preprocess.max_patches is not None and patch_size is None:
        config, notes = hf_preprocessor_config(preprocess.replace(max_patches=None), image_size, channels)
        note = f"preprocessor_config.json: the NaFlex patch budget (max_patches={preprocess.max_patches}) is left out"
        return config, [f"{note}; this folder's model takes fixed-size images", *notes]
    if preprocess.max_patches is not None:
        naflex = {"patch_size": patch_size, "max_num_patches": preprocess.max_patches}
        return {
            "image_processor_type": "Siglip2ImageProcessor",
            "do_resize": True,
            "resample": resample,
        } | stats | naflex, []
    notes: list[str] = []
    resize, crop = preprocess.resize_size, preprocess.crop_size
    if resize is None:  # timm's rule, at this size
        sh, sw = math.floor(h / preprocess.crop_pct), math.floor(w / preprocess.crop_pct)
        if preprocess.crop_mode == "center":
            if h != w:
                raise ValueError(
                    f"crop_mode 'center' at {h}x{w}: timm resizes to cover both sides (ResizeKeepRatio), which "
                    "no transformers image processor computes"
                )
            resize, crop = (sh,), (h, w)
            notes.append(
                f"preprocessor_config.json: transformers floors the crop offset where timm rounds it, so the "
                f"{h}x{w} crop sits one pixel before timm's along a side {sh} resized exceeds it by 3 mod 4 "
                "pixels (the longer side of some images)"
            )
        else:
            resize, crop = (sh, sw), (h, w) if (sh, sw) != (h, w) else None
            if any((a - b) % 4 == 3 for a, b in ((sh, h), (sw, w))):
                notes.append(
                    f"preprocessor_config.json: the {h}x{w} crop of {sh}x{sw} sits one pixel before timm's "
                    "(transformers floors the offset, timm rounds it)"
                )
    out = crop or resize
    if len(out) != 2 or tuple(out) != (h, w):
        raise ValueError(f"the preprocessing gives {list(out)} images; the model takes {h}x{w}")
    size = {"shortest_edge": resize[0]} if len(resize) == 1 else {"height": resize[0], "width": resize[1]}
    name = "CLIPImageProcessor" if len(resize) == 1 else "DeiTImageProcessor" if crop else "ViTImageProcessor"
    if preprocess.rescale_before_resize:
        name = HF_RESCALE_BEFORE_RESIZE[0]
    config: dict[str, Any] = {
        "image_processor_type": name,
        "do_resize": True,
        "size": size,
        "resample": resample,
        "do_center_crop": crop is not None,
        **stats,
        "do_convert_rgb": True,
    }
    if crop is not None:
        config["crop_size"] = {"height": crop[0], "width": crop[1]}
    return config, notes
