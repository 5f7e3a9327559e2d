"""The two files vit writes in place rather than atomically (``vit_common.system.io`` writes every other
one): a folder's lock (``folder_lock``), held while a command writes the folder, and an appended log
(``open_log``: a metrics log, which grows while a run lasts). Both are never opened through a symbolic
link (``O_NOFOLLOW``) and only if they are regular files; a lock file is removed only if it is the one
this process holds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from vit_common.system.io import (
    LOCK,
    DestinationError,
    check_destination,
    make_folders,
    remember_written,
    remove_empty,
    umask,
)


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str) -> Iterator[Path]:
    """Hold ``folder``'s lock (``io.LOCK``, an ``fcntl.flock`` the kernel releases when the holder ends,
    killed or not) while the block runs, so that two commands never write one folder at once. The lock
    file holds the holder's process id and is removed on release, with the folder and the parents made for
    it that are left empty (a refused or plan-only command leaves no folder behind).

    Raises:
        DestinationError: another process holds the lock (the message names its pid); raised at once.
    """
    folder = Path(folder)
    made = make_folders(folder)
    while True:
        fd = _open_lock(folder / LOCK)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            remove_empty(made)
            raise DestinationError(
                f"{folder}: in use by another {what} (pid {holder}); wait for it to end or use another folder"
            ) from None
        try:  # the lock file a releasing holder removed is not the one to hold: take the new one
            if os.stat(folder / LOCK, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield folder
    finally:
        with contextlib.suppress(OSError):  # only the lock file this process holds, not one put in its place
            if os.stat(folder / LOCK, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                os.unlink(folder / LOCK)
        os.close(fd)
        remove_empty(made)


def _open_lock(path: Path) -> int:
    """``path`` opened for reading and writing, created if missing, never through a link (``O_NOFOLLOW``)
    and only if it is a regular file (a FIFO or device is closed unread).

    Raises:
        DestinationError: ``path`` is a symbolic link (dangling or not) or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666 & ~umask())
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise DestinationError(
            f"{path}: a symbolic link where vit keeps its lock file; vit never writes through links: remove it"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DestinationError(f"{path}: not a regular file where vit keeps its lock file: remove it")
    return fd


class Log:
    """A text file open for appending lines (a metrics log): the one write that is not atomic, since it
    grows while a run lasts. Each ``flush`` remembers the file as this process's (in memory), so the same
    command may open it again; ``close`` flushes. A context manager."""

    def __init__(self, path: Path):
        self.path, self.failed = path, False  # failed: a flush raised
        try:  # never through a link planted where the log goes
            self._fh = open(
                path, "a", encoding="utf-8", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW, 0o666)
            )
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise DestinationError(f"{path}: a symbolic link; vit never writes through links: remove it") from None

    def write(self, text: str) -> int:
        return self._fh.write(text)

    def fileno(self) -> int:
        """The file descriptor (for ``os.fsync``)."""
        return self._fh.fileno()

    def flush(self) -> None:
        try:
            self._fh.flush()
        except OSError:
            self.failed = True
            raise
        remember_written(self.path)

    def close(self) -> None:
        """Flush and close. After a flush that failed (a full disk: its error went to the writer), what it
        could not write is dropped without a second error."""
        if self._fh.closed:
            return
        failed = self.failed
        try:
            self.flush()
        except OSError:
            if not failed:
                raise
        finally:
            with contextlib.suppress(OSError):  # the file is closed even when its last flush fails
                self._fh.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_log(path: str | os.PathLike) -> Log:
    """``path`` opened for appending whole lines (``Log``); parent folders are created.

    Raises:
        DestinationError: ``path`` exists and is not a log this process wrote, and the caller did not say
            to append to it (``overwriting()``, ``--overwrite``: a log holds no mark of ours).
    """
    path = Path(path)
    check_destination(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return Log(path)
