"""Hugging Face hub model ids as checkpoint sources: ``hf-hub:ORG/NAME`` (optionally ``@REVISION``), spelled
as timm spells them (``timm.create_model("hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")``), so an
id is never confused with a path or a variant name.

An id resolves to the snapshot folder ``huggingface_hub.snapshot_download`` gives: the files of the repo
that a checkpoint folder needs (``HUB_FILES``: config.json, preprocessor_config.json, the safetensors
weights and their index; ``pytorch_model.bin`` only where a repo has no safetensors), taken from its cache
(``HF_HUB_CACHE``) and downloaded into it when the hub can be reached. Offline
(``local_files_only=True``, or ``HF_HUB_OFFLINE=1``) only the cache is read. The folder is then read as
any checkpoint folder (a timm hub folder, a transformers folder).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.system.extras import install_hint

PREFIX = "hf-hub:"
HUB_FILES = ("*.json", "*.safetensors")  # config, preprocessor config, weights, shard index
FALLBACK_FILES = ("pytorch_model.bin",)  # repos without safetensors weights
_REPO = re.compile(r"^[\w.-]+/[\w.-]+$")  # huggingface_hub's repo id: ORG/NAME of letters, digits, - _ .


def is_hub_id(source: str | os.PathLike) -> bool:
    """True if ``source`` is spelled as a hub model id (``hf-hub:...``), whatever follows."""
    return isinstance(source, str) and source.startswith(PREFIX)


def parse_hub_id(source: str) -> tuple[str, str | None]:
    """(repo id ``ORG/NAME``, revision or None) of ``hf-hub:ORG/NAME[@REVISION]``.

    Raises:
        FormatError: not of that form (names the id and the expected spelling).
    """
    body = source[len(PREFIX) :] if is_hub_id(source) else ""
    repo, _, revision = body.partition("@")
    if not _REPO.match(repo) or ".." in repo or repo.endswith(".") or (revision == "" and "@" in body):
        raise FormatError(f"{source!r}: expected a hub model id hf-hub:ORG/NAME (or hf-hub:ORG/NAME@REVISION)")
    return repo, revision or None


def resolve(
    source: str | os.PathLike, *, local_files_only: bool | None = None, cache_dir: str | os.PathLike | None = None
) -> Path:
    """The local path of a checkpoint source: ``source`` itself unless it is a hub id, else the folder
    huggingface_hub gives for it (its cache; a download where the hub can be reached).

    Args:
        local_files_only: True reads only the cache; None leaves it to huggingface_hub (``HF_HUB_OFFLINE``).
        cache_dir: the cache folder (None: huggingface_hub's, ``HF_HUB_CACHE``).

    Raises:
        FormatError: a malformed id, huggingface_hub not installed, or the id neither cached nor reachable
            (one line naming the id, the cache and why).
    """
    if not is_hub_id(source):
        return Path(source)
    repo, revision = parse_hub_id(str(source))
    try:
        import huggingface_hub
        from huggingface_hub import constants
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as e:
        raise FormatError(f"{source}: hub model ids need huggingface_hub ({install_hint('hub')})") from e
    options = dict(repo_type="model", revision=revision, cache_dir=cache_dir)
    if local_files_only is not None:
        options["local_files_only"] = local_files_only
    cache = cache_dir or constants.HF_HUB_CACHE
    try:
        folder = Path(huggingface_hub.snapshot_download(repo, allow_patterns=list(HUB_FILES), **options))
        if not any(folder.glob("*.safetensors")):
            folder = Path(huggingface_hub.snapshot_download(repo, allow_patterns=list(FALLBACK_FILES), **options))
    except LocalEntryNotFoundError as e:
        raise FormatError(
            f"{source}: not in the Hugging Face cache ({cache}) and the hub cannot be reached "
            f"({_first_line(e)}); download it once online, or check the id"
        ) from e
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise FormatError(f"{source}: the hub refused it ({type(e).__name__}: {_first_line(e)})") from e
    return folder


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
