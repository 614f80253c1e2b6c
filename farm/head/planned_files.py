"""How the head opens a job's planned dataset files: one component at a time without following any link, from "/"
or from the dataset's root opened once (the files of one ReadFiles call), and what one call holds open (Opened)."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from farm.core.errors import NotFoundError

_FOLLOW_NONE = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


class LinkRefused(NotFoundError):
    """A planned file that is now a link (or a link on its way), or not a regular file: never followed."""


def open_planned(root: str, path: str, folder: int | None = None) -> tuple[int, os.stat_result]:
    """A file descriptor of the regular file `path` under the absolute `root`, and its stat, opened one component at
    a time from "/" with O_NOFOLLOW (openat on the folder opened before): no link anywhere on the way is followed, so
    what is opened is the file at that very path, which is below the planned root, whatever was swapped in since
    planning (a path checked, then opened by name, raced a swap for a link: issue 30). A FIFO or device is refused
    without blocking on it. `folder`: a descriptor of `root` opened so (open_folder), where the walk starts instead
    (the files of one call: the root's components opened once, not per file)."""
    parts = path.split("/") if path else []
    if folder is None:
        parts = [p for p in root.split("/") if p] + parts
    if not root.startswith("/") or any(p in ("", ".", "..") for p in parts) or not parts:
        raise NotFoundError(f"{path or root!r} is not a plain path under the dataset")
    start = os.open("/", _FOLDER) if folder is None else folder
    try:
        fd = _walk(start, parts, path or root, file=True)
    finally:
        if start != folder:
            os.close(start)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LinkRefused(f"{path or root!r} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def open_folder(root: str) -> int:
    """A descriptor of the folder `root` (absolute), no link on the way followed (open_planned's walk)."""
    parts = [p for p in root.split("/") if p]
    if not root.startswith("/") or any(p in (".", "..") for p in parts):
        raise NotFoundError(f"{root!r} is not a plain path")
    top = os.open("/", _FOLDER)
    try:
        return _walk(top, parts, root, file=False) if parts else os.dup(top)
    finally:
        os.close(top)


def _walk(start: int, parts: list[str], named: str, file: bool) -> int:
    """The descriptor of `parts` below the folder `start` (left open), each component opened with O_NOFOLLOW; the
    last one a file (without blocking on a FIFO) or a folder."""
    fd = start
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                following = os.open(part, _FOLLOW_NONE | (os.O_NONBLOCK if last and file else os.O_DIRECTORY),
                                    dir_fd=fd)
            except OSError as exc:
                # ELOOP: a link opened with O_NOFOLLOW; ENOTDIR: a link (or a file) where a folder was
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise LinkRefused(f"{named!r} is now a link (or has one on its way): not followed") from None
                raise
            if fd != start:
                os.close(fd)
            fd = following
    except BaseException:
        if fd != start:
            os.close(fd)
        raise
    return fd


class Opened:
    """The descriptors one ReadFiles call holds: its root folder's, and its files' that have more to send. Its pool
    tasks may still run once the call has ended (cancelled, broken): what they open then is closed at once, and the
    folder once no task walks from it (closed while one did, its number could by then name another folder)."""

    def __init__(self, folder: int | None) -> None:
        self.folder = folder
        self.files: set[int] = set()
        self.walkers = 0
        self.ended = False
        self.lock = threading.Lock()

    @contextmanager
    def walking(self) -> Iterator[int | None]:
        """The folder to open a file from, held open meanwhile."""
        with self.lock:
            if self.ended:
                raise NotFoundError("the read has ended")
            self.walkers += 1
        try:
            yield self.folder
        finally:
            with self.lock:
                self.walkers -= 1
                self._close_folder()

    def keep(self, fd: int) -> int | None:
        """A file with more to send, closed with the call; None (and closed) if the call has ended."""
        with self.lock:
            if not self.ended:
                self.files.add(fd)
                return fd
        os.close(fd)
        return None

    def close(self, fd: int) -> None:
        with self.lock:
            self.files.discard(fd)
        os.close(fd)

    def end(self) -> None:
        with self.lock:
            self.ended = True
            files, self.files = self.files, set()
            self._close_folder()
        for fd in files:
            os.close(fd)

    def _close_folder(self) -> None:
        if self.ended and not self.walkers and self.folder is not None:
            os.close(self.folder)
            self.folder = None
