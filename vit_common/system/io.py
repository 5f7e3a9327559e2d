"""The one place that writes files: every file and folder the project writes goes through here (the two
written in place, a folder's lock and a metrics log, through ``vit_common.system.in_place`` beside it).

Writes are atomic: the content is written to a temporary file (or folder) beside the target and renamed
into place only when it is complete, so a crash, a full disk or an exception leaves either the old file or
nothing, never a partial one. New files get the usual mode (0666 / 0777 less the umask), not mkstemp's
0600. Format-specific writers (safetensors, .npz, torch.save, orbax, PNG) hand a callback to
``atomic_write`` / ``atomic_write_dir``; JSON and text have helpers of their own.

Nothing of the user's is replaced, and nothing is left beside the user's files to say what is ours: an existing
destination is replaced only when its own content proves it ours, where its format has a place for that (``owned``): a
``.safetensors`` file whose header metadata says so, a PNG with our text chunk (``PNG_TEXT``), a JSON object with our
key (``OWNER_KEY``; ``write_json`` puts it in every object it writes), or a checkpoint folder whose JSON file with our
key lists everything the folder holds (``folder_mark``: an HF folder's config.json, an orbax folder's
vit_config.json), or a file this process wrote that nobody changed since (kept in memory only, so a command may
rewrite and append to its own outputs). Across commands a file whose format has no such place (.npz, .pth, .npy, text,
a log) is never provably ours. Anything else raises ``DestinationError`` naming the path, unless the caller
deliberately replaces a file (``overwriting()``, the commands' ``--overwrite``); a folder holding things we did not
write is never replaced. Temporaries are named ``TMP_PREFIX`` + the writer's process id, so the next write into a
folder removes those a killed process left behind. A failed write (a full disk, a quota) raises ``OSError`` naming the
destination, which is left as it was. The two files vit writes in place rather than atomically (a folder's lock, a
metrics log) are ``vit_common.system.in_place``'s; ``check_apart`` refuses an output that is, lies inside or holds an
input.

Reading JSON is here too, so that every JSON file is parsed the same way and every error names its path.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from vit_common.system import tensor_files
from vit_common.system.validate import regular_file

TMP_PREFIX = ".vit-tmp-"  # + "<pid>-<name>-<random>": every temporary file or folder we create
LOCK = ".vit-lock"  # in a folder a command is writing: an flock held while it runs, holding its pid
OWNER_KEY = "vit_twins"  # the key (JSON, PNG text chunk, safetensors metadata) that marks a file as ours
OWNER = "written by vit-twins"  # its value in a file; in a folder's JSON: {"files": [the folder's entries]}
PNG_TEXT = {OWNER_KEY: OWNER}  # the text chunk of every PNG we write (matplotlib savefig metadata=, Pillow pnginfo)
OUR_SAFETENSORS = ("vit-twins/", OWNER_KEY)  # a "format" metadata prefix or a metadata key we write
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_FULL_DISK = 1 << 20  # bytes free below which a writer's failure is taken as a full disk
_HEADER_LIMIT = 100 << 20  # safetensors' own limit on its JSON header (bytes)
_JSON_LIMIT = 64 << 20  # bytes of a JSON file read to look for our key (ours are far smaller)
_OVERWRITE = contextvars.ContextVar("vit_overwrite", default=False)
_WRITTEN: dict[str, tuple[int, int, int, int]] = {}  # this process's writes: real path -> identity


class DestinationError(FileExistsError):
    """A destination holds something vit did not write (or cannot prove it wrote); nothing was changed."""


@contextlib.contextmanager
def overwriting(allowed: bool = True) -> Iterator[None]:
    """Within this block, existing files that are not provably ours may be replaced (``--overwrite``).
    Folders holding things we did not write are still refused."""
    token = _OVERWRITE.set(allowed)
    try:
        yield
    finally:
        _OVERWRITE.reset(token)


def umask() -> int:
    """This process's umask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
    try:
        with contextlib.suppress(PermissionError):  # another user's process: alive
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def remove_stale_temporaries(folder: str | os.PathLike) -> None:
    """Remove the temporaries (``TMP_PREFIX``) in ``folder`` whose writing process is gone (e.g. killed
    during a write). Others' temporaries and unreadable entries are left alone."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(TMP_PREFIX):
            continue
        pid = entry.name[len(TMP_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue


def _tmp_prefix(path: Path) -> str:
    return f"{TMP_PREFIX}{os.getpid()}-{path.name}-"


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """A file's (device, inode, size, modification time): any later change by anyone else alters it."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def remember_written(path: Path) -> None:
    """Record ``path``, just written by this process, as ours (in memory: nothing is written)."""
    _WRITTEN[os.path.realpath(path)] = _identity(path)


def _written_here(path: Path) -> bool:
    recorded = _WRITTEN.get(os.path.realpath(path))
    return recorded is not None and recorded == _identity(path)


def folder_mark(obj: Mapping[str, Any], files: list[str]) -> dict[str, Any]:
    """``obj`` (a folder's JSON object: an HF config.json, an orbax vit_config.json) with our key listing
    ``files``, every entry the writer puts in the folder (this JSON file included): what proves the folder
    ours and replaceable whole (``owned_folder``)."""
    return {**obj, OWNER_KEY: {"files": sorted(files)}}


def _our_safetensors(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if not 2 <= n <= min(_HEADER_LIMIT, os.fstat(fh.fileno()).st_size - 8):
                return False
            meta = json.loads(fh.read(n)).get("__metadata__") or {}
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False
    return isinstance(meta, dict) and (
        str(meta.get("format", "")).startswith(OUR_SAFETENSORS[0]) or OUR_SAFETENSORS[1] in meta
    )


def _our_png(path: Path) -> bool:
    """Whether the PNG at ``path`` has our tEXt chunk before its image data (chunks per the PNG spec:
    4-byte big-endian length, 4-byte type, data, 4-byte CRC; tEXt data is keyword NUL text)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(8) != _PNG_SIGNATURE:
                return False
            while True:
                head = fh.read(8)
                if len(head) < 8:
                    return False
                n, kind = int.from_bytes(head[:4], "big"), head[4:]
                if kind in (b"IDAT", b"IEND"):
                    return False
                if kind == b"tEXt" and n <= 1 << 16:
                    keyword, _, text = fh.read(n).partition(b"\0")
                    if keyword == OWNER_KEY.encode() and text == OWNER.encode():
                        return True
                    fh.seek(4, os.SEEK_CUR)
                else:
                    fh.seek(n + 4, os.SEEK_CUR)
    except OSError:
        return False


def _json_mark(path: Path) -> Any:
    """The value of our key in the JSON object at ``path`` (None if it is not one, or has none)."""
    try:
        if os.stat(path).st_size > _JSON_LIMIT:
            return None
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data.get(OWNER_KEY) if isinstance(data, dict) else None


def owned(path: str | os.PathLike) -> bool:
    """Whether the regular file at ``path`` is provably ours from its own content: a safetensors header
    with our format tag or key, a PNG with our text chunk, a JSON object with our key; or a file this
    process wrote that is unchanged since."""
    path = Path(path)
    if not path.is_file() or path.is_symlink():
        return False
    if _written_here(path):
        return True
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return False
    if head == _PNG_SIGNATURE:
        return _our_png(path)
    return _our_safetensors(path) or (head.lstrip()[:1] == b"{" and _json_mark(path) == OWNER)


def _marked(path: Path, entries: list[str]) -> tuple[str, dict] | None:
    """(name, our key's value) of the JSON file among ``entries`` that lists ``path``'s files, if any."""
    for name in entries:
        mark = _json_mark(path / name) if name.endswith(".json") else None
        if isinstance(mark, dict) and isinstance(mark.get("files"), list) and name in mark["files"]:
            return name, mark
    return None


def _walk(path: Path, sub: str) -> list[str]:
    """Every entry under ``path / sub`` (links not followed), as paths relative to ``path``."""
    out = []
    for root, dirs, files in os.walk(path / sub):
        out += [Path(root, n).relative_to(path).as_posix() for n in dirs + files]
    return out


def _foreign_entries(path: Path) -> list[str] | None:
    """What a folder holds that no JSON file of ours in it lists (None: no such file, so all of it): its
    own entries, and inside the sub-folders it lists what the mark's ``tree`` (``record_tree``) does not
    (a sub-folder without a recorded tree counts as foreign: its files are not known to be ours)."""
    entries = sorted(e.name for e in os.scandir(path) if not e.name.startswith(TMP_PREFIX) and e.name != LOCK)
    found = _marked(path, entries)
    if found is None:
        return None
    files, tree = found[1]["files"], found[1].get("tree")
    foreign = [e for e in entries if e not in files]
    for sub in (e for e in entries if e in files and (path / e).is_dir() and not (path / e).is_symlink()):
        foreign += [sub] if not isinstance(tree, list) else [p for p in _walk(path, sub) if p not in set(tree)]
    return foreign


def record_tree(path: str | os.PathLike) -> None:
    """Add to the mark of the folder ``path`` (``folder_mark``) every entry under the sub-folders it
    lists (``tree``, relative paths), so that a later rewrite can tell a file the user put inside one
    (``_foreign_entries``). A folder without sub-folders is left as it is."""
    path = Path(path)
    found = _marked(path, sorted(os.listdir(path)))
    subs = [] if found is None else [f for f in found[1]["files"] if (path / f).is_dir()]
    if subs:
        obj = read_json(path / found[0])
        obj[OWNER_KEY]["tree"] = sorted(p for sub in subs for p in _walk(path, sub))
        write_json(path / found[0], obj, indent=1)


def owned_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a checkpoint folder we wrote that holds nothing else (``folder_mark``)."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and _foreign_entries(path) == []


def check_destination(path: str | os.PathLike, *, folder: bool = False) -> None:
    """Raise unless writing ``path`` (a file, or with ``folder`` a folder) would replace only what is ours.

    Call it before long work so that a refusal comes first; the writers check again.

    Raises:
        DestinationError: ``path`` is a file that is not ours (and ``overwriting()`` is off), a folder
            holding things we did not write, or (for a folder) a file.
        IsADirectoryError: a file is to be written where a folder is.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return
    if folder:
        if not path.is_dir() or path.is_symlink():
            raise DestinationError(f"{path}: exists and is not a folder; refusing to replace it")
        entries = sorted(e.name for e in os.scandir(path) if not e.name.startswith(TMP_PREFIX))
        foreign = _foreign_entries(path) if entries else []
        if foreign is None or foreign:
            held = foreign or entries
            raise DestinationError(
                f"{path}: a folder holding things vit did not write as a checkpoint "
                f"({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}); "
                "refusing to replace it: write to a new or empty folder"
            )
        return
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(f"{path} is a folder: expected a file path")
    if _OVERWRITE.get() or owned(path):
        return
    raise DestinationError(f"{path}: exists and vit cannot tell it wrote it; pass --overwrite to replace it")


def check_writable(path: str | os.PathLike, flag: str | None = None, *, folder: bool = False) -> None:
    """Raise unless ``path`` can be written: a file to write, or with ``folder`` a folder to make or write
    into. Its nearest existing ancestor (an existing folder ``path`` itself) must be a folder this process
    may create files in, so that an unusable destination is refused before the work, not after it.
    Nothing is created.

    Raises:
        NotADirectoryError: that ancestor is not a folder; PermissionError: it is not writable. Both
            name ``flag`` (when given), ``path`` and the ancestor.
    """
    here = Path(path).absolute() if folder else Path(path).absolute().parent
    while not here.exists() and not here.is_symlink() and here != here.parent:
        here = here.parent
    name = f"{flag} {path}" if flag else str(path)
    if not here.is_dir():
        raise NotADirectoryError(f"{name}: cannot be written ({here} is not a folder); choose another path")
    if not os.access(here, os.W_OK | os.X_OK):
        raise PermissionError(f"{name}: cannot be written (folder {here} is not writable); choose another path")


FOLDER_OVERHEAD = 256 << 10  # bytes a checkpoint folder needs beside its arrays (metadata, index, block rounding)


def make_folders(folder: str | os.PathLike) -> list[Path]:
    """Make ``folder`` and its missing parents; returns the folders made, innermost first."""
    made = [p for p in (Path(folder), *Path(folder).parents) if not os.path.lexists(p)]
    Path(folder).mkdir(parents=True, exist_ok=True)
    return made


def remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (``make_folders``', in order) that is empty: a failed command's leftovers."""
    for folder in folders:
        with contextlib.suppress(OSError):  # rmdir refuses a folder that holds anything
            folder.rmdir()


def check_free_space(folder: str | os.PathLike, nbytes: int) -> None:
    """Raise before a write of about ``nbytes`` (plus ``FOLDER_OVERHEAD``) into ``folder`` that cannot fit
    in the space its file system has free for this user (``os.statvfs``'s ``f_bavail``).

    Raises:
        OSError: ENOSPC, saying how much is needed and how much is free (``atomic_write`` /
            ``atomic_write_dir`` name the destination).
    """
    st = os.statvfs(folder)
    free, need = st.f_bavail * st.f_frsize, nbytes + FOLDER_OVERHEAD
    if free < need:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: needs {_size(need)}, {_size(free)} free")


def _size(nbytes: int) -> str:
    """MiB with one decimal from 10 MiB on, else KiB with one (so that a need just above what is free
    never reads as equal to it)."""
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes >= 10 << 20 else f"{nbytes / (1 << 10):.1f} KiB"


def _failed(path: Path, e: BaseException, existed: bool) -> BaseException:
    """``e`` as one line naming the destination if it is an OSError (a full disk, a quota, a permission, a
    mapped input that shrank) or the writing library's own error on a full disk; other errors as they are."""
    if not isinstance(e, OSError):
        try:
            full = os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize < _FULL_DISK
        except OSError:
            full = False
        if not isinstance(e, Exception) or not full:
            return e
        e = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if isinstance(e, DestinationError) or e.errno is None:
        return e
    kept = "the old file is unchanged" if existed else "nothing was written"
    why = e.strerror or os.strerror(e.errno)
    why += ": an input read memory-mapped shrank while it was read" if e.errno == errno.EFAULT else ""
    failed = OSError(f"{path}: could not be written ({why}); {kept}")
    failed.errno = e.errno
    return failed


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` (which creates the file) beside ``path``, then rename it into place.

    Parent folders are created; stale temporaries in the parent are removed first. Nothing is left at
    ``path``, beside it or in folders made for it if ``write`` raises; an existing file there stays as it was.

    Raises:
        DestinationError, IsADirectoryError: see ``check_destination`` (checked before ``write`` runs).
        OSError: the write failed (e.g. ENOSPC, EDQUOT); the message names ``path``.
    """
    path = Path(path)
    check_destination(path)
    existed = os.path.lexists(path)
    made = make_folders(path.parent)
    remove_stale_temporaries(path.parent)
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.unlink(tmp)  # write() creates it: ext4 writes a truncated file out to disk when it is closed
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
        remember_written(path)
    except BaseException as e:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        remove_empty(made)
        failed = _failed(path, e, existed)
        if failed is e:
            raise
        raise failed from e


def atomic_write_dir(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp_dir)`` on a fresh folder beside ``path``, then put it in place of ``path``.

    ``write`` must put a JSON file marked by ``folder_mark`` in the folder, listing everything it wrote
    there (so that a later write may replace the folder whole; an AssertionError otherwise). An existing
    ``path`` is replaced only after ``write`` succeeded, and only if it is empty or a checkpoint folder we
    wrote that holds nothing else; nothing is left behind if ``write`` raises.

    Raises:
        DestinationError: see ``check_destination(path, folder=True)`` (checked before ``write`` runs).
        OSError: the write failed (e.g. ENOSPC); the message names ``path``.
    """
    path = Path(path)
    check_destination(path, folder=True)
    existed = path.exists()
    made = make_folders(path.parent)
    remove_stale_temporaries(path.parent)
    tmp = old = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent))
        write(tmp)
        record_tree(tmp)
        if not owned_folder(tmp):
            raise AssertionError(f"{path}: the writer did not list what it wrote in a JSON file (io.folder_mark)")
        os.chmod(tmp, 0o777 & ~umask())
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path), suffix=".old", dir=path.parent))
            os.replace(path, old / "x")
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
        remember_written(path)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / "x").exists() and not path.exists():
            os.replace(old / "x", path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        remove_empty(made)
        failed = _failed(path, e, existed)
        if failed is e:
            raise
        raise failed from e


def check_apart(output: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None]) -> None:
    """Raise if ``output`` is one of ``inputs`` ({what, e.g. '--init': path}), lies inside one (a folder),
    or holds one (writing it would replace or remove an input). Links are resolved; inputs that are None
    are skipped.

    Raises:
        ValueError: naming the output, the input and how they overlap.
    """
    out = Path(output).resolve()
    for what, path in inputs.items():
        if path is None:
            continue
        src = Path(path).resolve()
        if out == src:
            how = "is"
        elif src in out.parents:
            how = "lies inside"
        elif out in src.parents:
            how = "holds"
        else:
            continue
        raise ValueError(f"{output}: the output {how} {what} {path}; write the output somewhere else")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def json_text(obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """``obj`` as JSON text ending in a newline (the form every JSON file the project writes has)."""
    return json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n"


def write_json(
    path: str | os.PathLike, obj: Any, *, indent: int | None = 2, sort_keys: bool = False, mark: bool = True
) -> None:
    """Write ``obj`` as JSON atomically (``json_text``). An object gets our key (``OWNER_KEY``: ``OWNER``,
    unless it already has one, e.g. ``folder_mark``'s) so that the file proves itself ours; ``mark=False``
    for a file whose schema another library owns (an HF folder's preprocessor_config.json)."""
    if mark and isinstance(obj, dict) and OWNER_KEY not in obj:
        obj = {**obj, OWNER_KEY: OWNER}
    write_text(path, json_text(obj, indent=indent, sort_keys=sort_keys))


JSON_BYTES = 16 << 20  # a bookkeeping JSON file (config, metadata, metrics line) at most: 16 MiB
JSON_DEPTH = 64  # nesting at most (ours is 3 deep; a config.json nested 100,000 deep was a RecursionError)


def parse_json(text: str | bytes, where: str, *, limit: int = JSON_BYTES) -> Any:
    """``text`` parsed as JSON, bounded in size (``limit`` bytes) and nesting (``JSON_DEPTH``).

    Raises:
        ValueError: not JSON, larger or deeper than the bounds; the message starts with ``where``
            (the file, or file:line).
    """
    if len(text) > limit:
        raise ValueError(f"{where}: {len(text):,} bytes of JSON, more than the {limit:,} a bookkeeping file may hold")
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested deeper than {JSON_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{where}: not readable JSON ({e})") from None
    level, depth = [obj], 0
    while level:
        depth += 1
        if depth > JSON_DEPTH:
            raise ValueError(f"{where}: JSON nested deeper than {JSON_DEPTH} levels")
        level = [v for o in level if isinstance(o, (dict, list)) for v in (o.values() if isinstance(o, dict) else o)]
    return obj


def read_json(path: str | os.PathLike, *, limit: int = JSON_BYTES) -> Any:
    """The parsed content of a JSON file: a regular file (FIFOs, devices and links to them refused before
    opening), at most ``limit`` bytes read, nested at most ``JSON_DEPTH`` deep.

    Raises:
        ValueError: the file cannot be read (missing, a FIFO or device: see ``regular_file``), is larger
            or deeper than the bounds, or is not JSON; the message names the path.
    """
    try:
        with open(regular_file(path), "rb") as fh:
            data = fh.read(limit + 1)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from e
    return parse_json(data, str(path), limit=limit)


def save_safetensors(
    path: str | os.PathLike, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` (numpy arrays, or lazy tensors ``np.asarray`` loads) as a safetensors file,
    atomically, one tensor in memory at a time (``tensor_files.write_safetensors``: the bytes
    ``safetensors.numpy.save_file`` writes; views such as a transpose are made contiguous as written).

    Raises:
        ValueError: a dtype safetensors cannot hold, metadata that is not str -> str.
        DestinationError, OSError: as ``atomic_write``.
    """

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            tensor_files.write_safetensors(fh, tensors, metadata)

    atomic_write(path, write)


def share_file(src: str | os.PathLike, path: str | os.PathLike, *, final: str | os.PathLike | None = None) -> str:
    """Put the file ``src`` at ``path`` without copying its bytes, atomically (``atomic_write``): a hard
    link, or where the filesystem refuses one (another device, no hard links) a symbolic link relative to
    ``final``'s folder (``final``: where ``path`` ends up, when it is written inside a temporary folder;
    default ``path``). Returns 'hard link' or 'symbolic link'.

    Raises:
        DestinationError, OSError: as ``atomic_write``.
    """
    src, how = Path(src), []

    def link(tmp: str) -> None:
        try:
            os.link(src, tmp)
            how.append("hard link")
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            os.symlink(os.path.relpath(src.resolve(), Path(final or path).resolve().parent), tmp)
            how.append("symbolic link")

    atomic_write(path, link)
    return how[0]


def save_npz(path: str | os.PathLike, arrays: Mapping[str, Any]) -> None:
    """Write ``arrays`` as an uncompressed .npz (no pickled objects), atomically, member by member
    (``tensor_files.write_npz``: as ``np.savez`` writes it, one array in memory at a time)."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            tensor_files.write_npz(fh, arrays)

    atomic_write(path, write)
