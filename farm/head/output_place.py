"""Where a job may write its outputs on the head's machine: never into the head's state folder (its tokens, keys and
store), never into the folder of a job that has not ended (it would overwrite that job's shards and manifest), and,
when the head has an output root (--output-root), only under it. Paths are compared resolved (links followed).

A job's folder may be swapped for a link after submit by whoever owns a folder above it (one made the head write
into its own state folder, and `farm jobs delete --outputs` delete root's files elsewhere): so the head opens it
again at each write and delete (`open_folder`), following a link only where nobody but root or the head's own user
could have put it, and checks again where it now leads (`recheck`)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from farm.core.errors import SpecError
from farm.core.models import JobState
from farm.head.settings import HeadSettings
from farm.head.store import Store

MAX_LINKS = 40  # links followed in one path, as the kernel's own limit


def check(output: str, settings: HeadSettings, store: Store) -> None:
    target = Path(output).resolve()
    _check_resolved(output, target, settings)
    for job in store.jobs(limit=10_000, states=(JobState.QUEUED, JobState.RUNNING)):
        theirs = Path(job.output).resolve()
        if _within(target, theirs) or _within(theirs, target):
            raise SpecError(f"output {output} is where job {job.id} ({job.state.value}) writes: choose another")


def recheck(output: str, settings: HeadSettings) -> None:
    """Before a write into a job's folder on this machine: it (or, not made yet, its nearest folder that is) opens
    safely, and still leads outside the state folder and inside the output root (SpecError otherwise)."""
    if output.startswith("s3://"):
        return
    path = Path(output)
    while True:
        try:
            fd = open_folder(path)
            break
        except FileNotFoundError:
            if path.parent == path:
                raise
            path = path.parent
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}")) if os.path.exists("/proc/self/fd") else path.resolve()
    finally:
        os.close(fd)
    _check_resolved(output, real / Path(output).relative_to(path), settings)


def _check_resolved(output: str, target: Path, settings: HeadSettings) -> None:
    if _within(target, settings.state_dir.resolve()):
        raise SpecError(f"output {output} is inside the head's state folder")
    if settings.output_root is not None and not _within(target, settings.output_root.resolve()):
        raise SpecError(f"output {output} is outside the head's output root {settings.output_root}")


def open_folder(path: Path) -> int:
    """An O_DIRECTORY descriptor of the absolute `path`, walked one component at a time without following a link,
    except a link in a folder only root or this user may write (/tmp on macOS, a /home link): one nobody else could
    have swapped. FileNotFoundError when a component is missing; SpecError for a link it will not follow."""
    if not path.is_absolute():
        raise SpecError(f"output {path} is not an absolute path")
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    parts = list(path.parts[1:])
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name in ("", "."):
                continue
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                link = os.lstat(name, dir_fd=fd)
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or not stat.S_ISLNK(link.st_mode):
                    raise
                links += 1
                if links > MAX_LINKS or not _trusted(os.fstat(fd), link):
                    raise SpecError(f"output {path}: {name!r} is a link in a folder others may change: not "
                                    "followed") from None
                target = Path(os.readlink(name, dir_fd=fd))
                if target.is_absolute():  # start again from the root
                    os.close(fd)
                    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
                continue
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _trusted(folder: os.stat_result, link: os.stat_result) -> bool:
    """Whether only root or this process's user could have put `link` in `folder`: the folder is theirs and nobody
    else may write it, or it is sticky (as /tmp) and the link itself is theirs."""
    trusted = (0, os.geteuid())
    if folder.st_uid in trusted and not folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return True
    return bool(folder.st_mode & stat.S_ISVTX) and link.st_uid in trusted


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
