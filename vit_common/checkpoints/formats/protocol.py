"""The ``Format`` protocol every format module implements, and what flows through it.

``Source`` (a container found on disk, its tensors opened) -> ``Format.read`` -> ``Decoded`` (config,
canonical state, provenance); ``Format.encode`` -> ``Encoded`` (the file's tensors) -> ``Format.decode``
(the read-back check) and ``Format.write``. Tensors stream: every map of tensors here is a
``formats.tensors.TensorMap`` (name -> numpy array or ``LazyTensor``), whose shapes and dtypes are known
without loading and whose values are produced when ``np.asarray`` asks, one at a time. A reader opens
its container as views (``source.load_tensors``: memory maps, .npz member by member, shard by shard)
and returns the canonical state its rules compute lazily (``rules.to_canonical``); an encoder returns the
file's tensors lazily (``rules.from_canonical``); a writer asks for them one by one where its container
allows, or ``materialize``s them where its library needs the whole tree (orbax, torch pickles).

``ReadOptions`` and a format's ``WriteOptions`` subclass carry what a caller tells a reader and a
writer. Besides reading and writing, a format answers everything else that depends on it: the
preprocessing and class names its files declare (or the usual choice it assumes), its export file name,
the library that loads it as a reference, and the signature its detection looks for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.formats.provenance import Origin
from vit_common.checkpoints.formats.tensors import Tensor, TensorMap
from vit_common.checkpoints.metadata import Declared, declared_in_metadata, info_metadata
from vit_common.config import ViTConfig
from vit_common.data.images import Preprocess


@dataclass
class Decoded:
    """What a format reader returns: config, canonical state and its part of the report."""

    cfg: ViTConfig
    state: dict[str, Tensor]
    layout: str = ""
    provenance: dict[str, Origin] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # stored metadata vs head shape (see convert.py)
    model_type: str = ""  # the transformers model_type an HF folder declares ('' for other formats)


@dataclass
class Source:
    """A checkpoint file or folder as found on disk, before any format reads it.

    ``container``: 'safetensors', 'npz', 'torch' (.pth/.bin pickle), 'hf_folder' (config.json +
    weights), 'orbax_folder'. ``files``: the files holding tensors (shards in index order).
    ``config``: an HF config.json beside the weights, an orbax folder's vit_config.json, or None.
    ``weight_map``: a sharded folder's tensor -> shard file map. ``tensors`` (views or lazy tensors:
    ``formats.tensors``) and ``meta`` (safetensors header metadata) are filled by
    ``vit_common.checkpoints.formats.source.load_tensors``; ``dropped`` lists what the container held besides weights;
    ``warnings`` what its reading could not check (a torch.save file written without CRC-32s).
    ``name``: the hub model id the caller named (``hf-hub:ORG/NAME``) where ``path`` is its cached folder.
    """

    path: Path
    container: str
    files: tuple[Path, ...]
    config: dict | None = None
    weight_map: dict[str, str] | None = None
    tensors: dict[str, Tensor] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    name: str | None = None

    @property
    def context(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class ReadOptions:
    """What a caller tells a reader: ``source_image_size`` (H, W) the file was trained at (for files that
    store none), ``overrides`` (config fields, recorded as given), ``keep_zero_head`` (.npz), ``readers``
    (framework readers for containers vit_common cannot open: 'torch', 'orbax')."""

    source_image_size: tuple[int, int] | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    keep_zero_head: bool = False
    readers: Mapping[str, Callable[..., Any]] | None = None


@dataclass
class Encoded:
    """A state as a format holds it, before it is written.

    ``cfg`` and ``state``: the config and canonical state the file will hold (they differ from the input
    only where the format needs it: ``notes`` say how). ``tensors``: the file's tensors (lazy where
    they are computed: ``formats.tensors``), in the order they are written. ``config_json``:
    an HF folder's config.json. ``meta``: safetensors header metadata (None where the container has none).
    ``json_files``: other JSON files of a folder format, by name (an HF folder's preprocessor_config.json).
    ``shared``: a safetensors file already on disk holding exactly ``tensors``, whose bytes the written
    file shares (``vit_common.system.io.share_file``) instead of a second copy; None writes them.
    ``shard_size``: the most bytes a weights file of a folder format holds (an HF folder's shards,
    ``--shard-size``); None: one file. ``load_call``: the library code loading the written file, where it
    depends on write options (a timm Eva's q/k/v spelling); '' leaves it to ``Format.load_call``.
    """

    cfg: ViTConfig
    state: dict[str, Tensor]
    tensors: dict[str, Tensor]
    config_json: dict | None = None
    meta: dict[str, str] | None = None
    notes: list[str] = field(default_factory=list)
    json_files: dict[str, dict] = field(default_factory=dict)
    shared: Path | None = None
    shard_size: int | None = None
    load_call: str = ""


Writer = Callable[..., Any]


@dataclass(frozen=True)
class WriteOptions:
    """What a caller tells a format's writer; this base holds nothing (formats without options).

    A format with options subclasses it (``Format.write_options``); each field's metadata gives its
    ``help``, its CLI ``flag`` and optional ``choices``, from which ``vit_cli.flags.add_flags`` makes
    the flag (``vit convert --hf-spelling``, ``--npz-prefix``, ``--scan``).
    """


@dataclass(frozen=True)
class Reference:
    """The library that loads a format's files as a reference (``vit parity --against``, ``vit train``'s
    export check, ``vit_torch.oracles.library_logits``): ``library`` is its import name ('timm',
    'transformers'); ``loader`` how it reads the file: 'state_dict' (the library's model built from the
    config, then ``load_state_dict(strict=True)`` of the file's tensors), 'npz' (timm's ``.npz`` loader,
    ``timm.models.vision_transformer._load_weights``) or 'from_pretrained' (transformers reads the folder
    and its own config.json)."""

    library: str
    loader: str


class Format:
    """One checkpoint format. Each module of ``vit_common.checkpoints.formats`` exports one instance as ``FORMAT``.

    Attributes: ``name`` (what --from/--to take), ``description``, ``suffixes`` (file suffixes written as
    this format when no --to is given; a folder format has none), ``folder`` (written as a folder),
    ``framework`` ('jax', 'torch' or None: what reading and writing need whatever the container),
    ``signature`` (what ``detect`` looks for, named by the error for a file no format detects),
    ``reference`` (the library that loads its files, or None), ``write_options`` (the ``WriteOptions``
    subclass ``encode`` takes), ``assumed_preprocess`` and ``assumed_why`` (the preprocessing a file that
    declares none is read with, and why: the format's usual choice), ``checks_on_write`` (its ``write``
    loads each of ``Encoded.tensors`` exactly once, inside its atomic write: the read-back check then
    compares a computed tensor on the buffer the writer writes, ``vit_common.checkpoints.readback``).
    """

    name: str = ""
    description: str = ""
    suffixes: tuple[str, ...] = ()
    folder: bool = False
    framework: str | None = None
    signature: str = ""
    reference: Reference | None = None
    write_options: type[WriteOptions] = WriteOptions
    assumed_preprocess: Preprocess = Preprocess()
    assumed_why: str = "vit train's default before files recorded it: [-1, 1], bilinear, squash"
    checks_on_write: bool = False

    def detect(self, src: Source) -> bool:
        """Whether ``src`` (tensors loaded) is this format."""
        raise NotImplementedError

    def read(self, src: Source, opts: ReadOptions) -> Decoded:
        """Canonical state, config and provenance of ``src``.

        Raises:
            FormatError: not this format, or what the twins lack (named). StateMismatchError: tensors
                missing, unexpected or of the wrong shape (file names).
        """
        raise NotImplementedError

    def declared(self, src: Source) -> Declared:
        """The preprocessing and class names ``src`` declares (the safetensors header's ``preprocess`` and
        ``classes`` entries, where the container is a safetensors file), from what ``src`` already holds.

        Raises:
            ValueError: a declared entry is not JSON (names the file).
        """
        if src.container != "safetensors":
            return Declared()
        return declared_in_metadata(src.meta, f"{src.path} metadata")

    def record_info(
        self, enc: Encoded, preprocess: Preprocess | None, classes, preprocess_assumed: str = ""
    ) -> list[str]:
        """Put ``preprocess`` and ``classes`` (K names) into ``enc`` where the file holds them (safetensors
        header metadata), the preprocessing marked assumed with why (``preprocess_assumed``, if not empty);
        returns a note for each that the format cannot record."""
        info = info_metadata(preprocess, classes, preprocess_assumed)
        if not info:
            return []
        if enc.meta is not None:
            enc.meta = {**info, **enc.meta}
            return []
        return [f"{self.name} files record no preprocessing or class names: they were not written"]

    def complete_options(self, options: WriteOptions, source: Any) -> WriteOptions:
        """``options`` with what the caller left unset taken from the ``source`` that was read (a
        ``provenance.Report``: an HF folder's ``model_type``); the base format takes nothing from it."""
        return options

    def cannot_hold(self, cfg: ViTConfig) -> list[str]:
        """Every choice of ``cfg`` this format cannot hold (empty: it can), before ``encode``'s rewrites."""
        return []

    def encode(self, cfg: ViTConfig, state: TensorMap, path: Path, options: WriteOptions, assumed=()) -> Encoded:
        """``state`` as this format holds it at ``path`` (its suffix may matter), with ``options`` (an
        instance of ``write_options``) and ``assumed`` (config fields whose values were assumed, recorded
        where the format can); ValueError if it cannot hold the model."""
        raise NotImplementedError

    def decode(self, enc: Encoded) -> Decoded:
        """Read ``enc`` back in memory, as ``read`` would read the written file."""
        raise NotImplementedError

    def write(self, path: Path, enc: Encoded, writers: Mapping[str, Writer]) -> None:
        """Write ``enc`` to ``path`` atomically (through ``vit_common.system.io``), loading ``enc.tensors``
        one at a time where the container allows it."""
        raise NotImplementedError

    def needs(self, path: Path) -> str | None:
        """The framework writing ``path`` in this format needs ('jax', 'torch' or None)."""
        return self.framework

    def writes_folder(self, path: Path) -> bool:
        """Whether writing ``path`` in this format makes a folder (``folder``; timm: by the path)."""
        return self.folder

    def states_as_fact(self, path: Path) -> bool:
        """Whether a file written at ``path`` states every config field as fact to the library that reads
        it, with no way to say that a value was assumed (an HF config.json, a timm hub folder's
        model_args). Formats that store no config (a timm state_dict file) or record assumed fields
        (ours, orbax) do not: their files are written whatever was assumed."""
        return False

    def load_call(self, path: Path, cfg: ViTConfig) -> str:
        """Python code that loads the written file strictly in the library that defines the format."""
        return ""

    def export_name(self, source: Path | None = None) -> str:
        """The name ``vit train`` gives this format's export in a run folder (``model_<name>`` and the first
        suffix); ``source``, the file fine-tuned from, where its suffix decides the container."""
        return f"model_{self.name}{self.suffixes[0] if self.suffixes else ''}"


def writer(writers: Mapping[str, Writer] | None, what: str, path: Path) -> Writer:
    """The framework writer ``what`` ('torch' | 'orbax') from ``writers``; FormatError if not given."""
    fn = (writers or {}).get(what)
    if fn is None:
        framework = "jax" if what == "orbax" else "torch"
        raise FormatError(
            f"{path}: writing {what} needs vit_{framework}.formats.WRITERS, which the caller did not pass"
        )
    return fn
