"""Generate ``vit_common/checkpoints/formats/timm_architectures.json``: what each timm ViT architecture
name implies, read off the model timm builds for it, so that a reader without timm (a JAX-only install)
assumes nothing a timm hub folder's ``architecture`` fixes (``vit_common.checkpoints.formats.timm_names``).

Every name whose entry point is in ``timm.models.vision_transformer`` or ``timm.models.deit`` is built on
the meta device (``vit_torch.timm_models.timm_model_config``); the table holds each config's function
fields that differ from ``ViTConfig``'s defaults, and for each name the twins do not implement, timm's
reason. Run it again when the pinned timm changes::

    python -m vit_torch.timm_architectures            # writes the table (about 2 minutes on 2 cores)
    python -m vit_torch.timm_architectures --check    # exit 1 if the table differs from the installed timm
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.timm_names import TABLE_PATH, entry
from vit_common.system import io
from vit_torch.timm_models import timm_model_config

MODULES = ("timm.models.vision_transformer", "timm.models.deit")


def architecture_names() -> list[str]:
    """timm's model names whose entry point builds a ``VisionTransformer`` (sorted)."""
    import timm

    return sorted(n for n in timm.list_models() if timm.models.model_entrypoint(n).__module__ in MODULES)


def table(names: list[str] | None = None) -> dict[str, Any]:
    """{"timm_version", "architectures": {name: fields}, "not_implemented": {name: reason}} for ``names``
    (default: ``architecture_names()``)."""
    import timm

    found, lacking = {}, {}
    for name in names if names is not None else architecture_names():
        try:
            found[name] = entry(timm_model_config(name))
        except FormatError as e:
            lacking[name] = str(e)
    return {"timm_version": timm.__version__, "architectures": found, "not_implemented": lacking}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vit_torch.timm_architectures", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the table instead of writing it")
    args = parser.parse_args(argv)
    new = table()
    text = json.dumps(new, indent=1, sort_keys=True) + "\n"
    if args.check:
        same = TABLE_PATH.read_text() == text
        print(f"{TABLE_PATH}: {'matches' if same else 'differs from'} timm {new['timm_version']}")
        return 0 if same else 1
    with io.overwriting():  # the table is this command's to replace; atomically, a stopped run keeps the old one
        io.write_text(TABLE_PATH, text)
    print(f"{TABLE_PATH}: {len(new['architectures'])} architectures, timm {new['timm_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
