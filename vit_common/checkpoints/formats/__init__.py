"""The registry of checkpoint formats: one module per format, each exporting one ``Format`` object.

``REGISTRY`` maps a format's name to its object, in detection order (the first whose ``detect`` accepts a
file reads it). Adding a format is one module, one line here and its tests. ``vit_common.checkpoints.convert``
dispatches every read and write through this table; ``source`` finds the container beneath.
"""

from __future__ import annotations

from vit_common.checkpoints.formats import big_vision, canonical, hf, orbax, original_vit, timm
from vit_common.checkpoints.formats.base import Format

REGISTRY: dict[str, Format] = {
    f.name: f
    for f in (
        orbax.FORMAT,
        canonical.FORMAT,
        hf.FORMAT,
        timm.FORMAT,
        original_vit.FORMAT,
        big_vision.FORMAT,
    )
}

__all__ = ["REGISTRY", "Format"]
