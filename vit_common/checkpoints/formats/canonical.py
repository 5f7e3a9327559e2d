"""Our own file: the canonical state as safetensors, with the ViTConfig in the header metadata.

Every config field is declared by the stored config. The tensors carry timm's names, so timm loads the
file strictly too whenever its ``VisionTransformer`` can build the config (``load_call`` says how).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from vit_common.checkpoints.formats import timm
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Format, Source, WriteOptions
from vit_common.checkpoints.formats.provenance import ASSUMED_KEY
from vit_common.checkpoints.formats.stored_config import (
    FORMAT_TAG,
    assumed_meta,
    config_from_json,
    decode_stored,
    stored_config,
)
from vit_common.checkpoints.formats.timm_state import timm_cannot_hold
from vit_common.config import ViTConfig
from vit_common.state import canonical_shapes, check_state
from vit_common.system import io


class Canonical(Format):
    name = "canonical"
    description = "our safetensors file: timm names, ViTConfig in the metadata"
    suffixes = (".safetensors",)
    signature = f"safetensors metadata format={FORMAT_TAG!r} with the stored config"

    def detect(self, src: Source) -> bool:
        return src.container == "safetensors" and src.meta.get("format") == FORMAT_TAG

    def read(self, src: Source, opts) -> Decoded:
        if src.meta.get("format") != FORMAT_TAG or "vit_config" not in src.meta:
            stored_config(src.meta, src.context)  # raises, naming the tag found
        cfg, notes = config_from_json(src.meta["vit_config"], src.context)
        dec = decode_stored(
            cfg, src.tensors, "safetensors, config in metadata", src.context, "stored config", src.meta.get(ASSUMED_KEY)
        )
        dec.notes += notes
        return dec

    def encode(self, cfg: ViTConfig, state, path: Path, options: WriteOptions, assumed=()) -> Encoded:
        meta = {"format": FORMAT_TAG, "vit_config": cfg.to_json()} | assumed_meta(assumed)
        return Encoded(cfg, dict(state), {k: state[k] for k in canonical_shapes(cfg)}, None, meta)

    def decode(self, enc: Encoded) -> Decoded:
        cfg, _ = config_from_json(enc.meta["vit_config"], "canonical read-back")
        return decode_stored(cfg, enc.tensors, "", "canonical read-back", "stored config", enc.meta.get(ASSUMED_KEY))

    def write(self, path: Path, enc: Encoded, writers) -> None:
        io.save_safetensors(path, enc.tensors, enc.meta)

    def export_name(self, source: Path | None = None) -> str:
        return "model.safetensors"

    def load_call(self, path: Path, cfg: ViTConfig) -> str:
        return timm.FORMAT.load_call(path, cfg) if not timm_cannot_hold(cfg) else ""  # these tensors, as they are


FORMAT = Canonical()


def save_canonical(
    path: str | os.PathLike, cfg: ViTConfig, state: Mapping[str, np.ndarray], extra: Mapping[str, str] = ()
) -> None:
    """Write our own file: canonical tensors plus ``cfg`` as JSON in the metadata, and the ``extra``
    metadata entries (preprocessing and class names, ``vit_common.checkpoints.metadata.info_metadata``).

    Raises:
        StateMismatchError: if ``state`` does not fit ``cfg`` (nothing is written).
    """
    check_state(canonical_shapes(cfg), state)
    io.save_safetensors(path, state, {**dict(extra), "format": FORMAT_TAG, "vit_config": cfg.to_json()})
