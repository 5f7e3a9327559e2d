"""The registry of checkpoint formats: one module of ``vit_common.checkpoints.formats`` per format, each
exporting one ``Format`` object (``formats.protocol.Format``).

``REGISTRY`` maps a format's name to its object, in detection order (the first whose ``detect`` accepts a
file reads it). Adding a format is one module, one line here and its tests: the object answers everything
that depends on the format (detection, reading, writing, its write options and their flags, the
preprocessing and class names it declares or assumes, its export file name, the library that loads it as
a reference). ``vit_common.checkpoints.convert`` dispatches every read and write through this table; the
format modules never import it, so the registry sits above them.
"""

from __future__ import annotations

from vit_common.checkpoints.formats import (
    big_vision,
    canonical,
    dinov3_original,
    eva_originals,
    hf,
    hf_dinov3,
    hf_families,
    orbax,
    original_vit,
    timm,
)
from vit_common.checkpoints.formats.protocol import Format

REGISTRY: dict[str, Format] = {
    f.name: f
    for f in (
        orbax.FORMAT,
        canonical.FORMAT,
        hf_families.FORMAT,
        hf_dinov3.FORMAT,
        hf.FORMAT,
        dinov3_original.FORMAT,
        eva_originals.FORMAT,
        timm.FORMAT,
        original_vit.FORMAT,
        big_vision.FORMAT,
    )
}
