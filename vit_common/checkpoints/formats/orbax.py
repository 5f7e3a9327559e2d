"""Orbax checkpoint folders of the JAX twin (``vit_jax.formats``): parameters, RNG state and the config.

vit_common cannot import jax, so the folder is read and written by the callables ``vit_jax.formats``
provides (``READERS['orbax']``, ``WRITERS['orbax']``); every config field is declared by the stored config,
except those its ``vit_assumed`` entry lists (fields the source of a conversion did not state), which stay
assumed.
"""

from __future__ import annotations

from pathlib import Path

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.protocol import Decoded, Encoded, Format, Source, WriteOptions, writer
from vit_common.checkpoints.formats.provenance import ASSUMED_KEY
from vit_common.checkpoints.formats.source import ORBAX_CONFIG, reader
from vit_common.checkpoints.formats.stored_config import assumed_meta, decode_stored
from vit_common.checkpoints.metadata import PREPROCESS_ASSUMED_KEY, Declared, declared_in_metadata
from vit_common.config import ViTConfig


class Orbax(Format):
    name = "orbax"
    description = "orbax checkpoint folder of the JAX twin (needs jax)"
    folder = True
    framework = "jax"
    signature = "a folder with vit_config.json and state/"

    def detect(self, src: Source) -> bool:
        return src.container == "orbax_folder"

    def read(self, src: Source, opts) -> Decoded:
        if src.container != "orbax_folder":
            raise FormatError(f"{src.path}: not an orbax folder of the JAX twin")
        cfg, state = reader(opts.readers, "orbax", src.path)(src.path)
        stored = (src.config or {}).get(ASSUMED_KEY)
        return decode_stored(cfg, state, "orbax checkpoint of the JAX twin", src.context, "stored config", stored)

    def declared(self, src: Source) -> Declared:
        """The ``preprocess`` and ``classes`` entries of the folder's stored config (``src.config``): JSON
        text, as a safetensors header stores them (``declared_in_metadata``), or the values themselves.

        Raises:
            ValueError: an entry of JSON text that does not parse (names the file and the key).
        """
        stored, where = src.config or {}, str(src.path / ORBAX_CONFIG)
        text = {k: v for k, v in stored.items() if k in ("preprocess", "classes") and isinstance(v, str)}
        parsed = declared_in_metadata(text, where)
        preprocess = parsed.preprocess if "preprocess" in text else stored.get("preprocess")
        classes = parsed.classes if "classes" in text else stored.get("classes")
        why = stored.get(PREPROCESS_ASSUMED_KEY, "") if preprocess is not None else ""
        return Declared(preprocess, where, classes, where, preprocess_assumed=str(why))

    def encode(self, cfg: ViTConfig, state, path: Path, options: WriteOptions, assumed=()) -> Encoded:
        return Encoded(cfg, dict(state), dict(state), meta=assumed_meta(assumed))

    def decode(self, enc: Encoded) -> Decoded:
        stored = (enc.meta or {}).get(ASSUMED_KEY)
        return decode_stored(enc.cfg, enc.tensors, "", "orbax read-back", "stored config", stored)

    def write(self, path: Path, enc: Encoded, writers) -> None:
        writer(writers, "orbax", path)(path, enc.cfg, enc.tensors, enc.meta)


FORMAT = Orbax()
