"""Whose results an output folder holds: a job refuses a folder that holds another job's results unless the submitter
asked to overwrite them (then they are removed first), so that two jobs never mix their shards in one folder.
(farm.head.output_place keeps a job out of an unfinished job's folder and out of the head's own.) Nothing is created
here: the folder appears with the job's first result."""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from farm.core.errors import ConflictError, SpecError
from farm.data.locations import join
from farm.data.results import Results
from farm.head.output_place import open_folder

# What a job writes into its folder (every kind's results, the manifest, unfinished writes), by exact name: found to
# tell a folder of results, and removed on overwrite. Anything else in the folder is the user's and stays (their own
# *.parquet files too).
RESULT_NAMES = re.compile(r"shard-\d{5,}\.[a-z]+|\.shard-\d{5,}\..+|_?manifest\.json|\._?manifest\.json\..+"
                          r"|results\.jsonl|results\.csv|model\.pt")
CHECKPOINTS = "checkpoints"


def check_free(output: Path) -> None:
    """ConflictError when `output` holds another job's results (what `claim` refuses without --overwrite). Also read by
    a client on the head's machine, before its model check: a refusal then takes no seconds."""
    try:
        fd = open_folder(output)
    except (FileNotFoundError, NotADirectoryError, PermissionError):  # nothing there to refuse
        return
    try:
        results = _results(fd)
    finally:
        os.close(fd)
    if results:
        raise ConflictError(f"output {output} already holds another job's results ({results[0]}, ...): choose "
                            "another output, or overwrite them (farm submit --overwrite)")


def claim(output: Path, overwrite: bool) -> None:
    """Let a new job write into `output`: ConflictError when it holds results and `overwrite` is off; with it, they
    are removed."""
    try:
        fd = open_folder(output)
    except (FileNotFoundError, NotADirectoryError, PermissionError):  # not a folder we can read: the first write says
        return
    try:
        results = _results(fd)
        if not results:
            return
        if not overwrite:
            raise ConflictError(f"output {output} already holds another job's results ({results[0]}, ...): choose "
                                "another output, or overwrite them (farm submit --overwrite)")
        try:
            for name in results:
                _unlink(name, fd)
        except OSError as exc:
            raise SpecError(f"output {output}: cannot remove the results there: {exc.strerror}") from None
    finally:
        os.close(fd)


def remove_results(output: str) -> None:
    """Remove a deleted job's results (`farm jobs delete --outputs`): in a folder what a job writes there (its
    checkpoints too), then the folder if nothing else is left in it; in a bucket its shards and manifest. The folder
    is opened once without following a link others could have swapped in (farm.head.output_place.open_folder), and
    everything is removed through that descriptor: never through a link."""
    results = Results(output)
    if not results.local:
        for name, _ in results.files():
            results.fs.rm_file(join(results.root, name))
        return
    folder = Path(output)
    try:
        parent = open_folder(folder.parent)
    except (OSError, SpecError):  # gone, or behind a link we do not follow: nothing of ours to remove
        return
    try:
        try:
            fd = os.open(folder.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError:  # never made, or a link now
            return
        try:
            for name in _results(fd):
                _unlink(name, fd)
            try:
                if stat.S_ISDIR(os.lstat(CHECKPOINTS, dir_fd=fd).st_mode):
                    shutil.rmtree(CHECKPOINTS, dir_fd=fd, ignore_errors=True)
            except FileNotFoundError:
                pass
        finally:
            os.close(fd)
        try:
            os.rmdir(folder.name, dir_fd=parent)
        except OSError:  # the user's own files stay, and with them the folder
            pass
    finally:
        os.close(parent)


def _results(fd: int) -> list[str]:
    """The names of Farm's own regular files in the folder open as `fd`."""
    try:
        with os.scandir(fd) as entries:
            return sorted(e.name for e in entries
                          if RESULT_NAMES.fullmatch(e.name) and e.is_file(follow_symlinks=False))
    except OSError:
        return []


def _unlink(name: str, fd: int) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
