"""A path on the head's machine that a node sees at the same place: the head's own machine, or a filesystem both mount
(NFS, a cluster's Lustre). The head stamps files of the plan with their size and modification time as it plans (at
most STAMPED of them, evenly spread; none where the spec says `shared: false`); a node compares what it sees at those
paths before it reads, and reads them itself only when they match and it may open them, else through the head's
DataService as for any path of the head's. A modification time is the filesystem server's, so a shared mount shows
every client the same one; a node's own copy made with its times kept (rsync -a) matches too, and holds the same
bytes. A node reads nothing so that its job's code could not open itself: a lender's files are its own, and a stamp
that matched by chance would be met only by a file of the same size modified at the same nanosecond.
"""

from __future__ import annotations

import os

from farm.core.dataset import DatasetPlan, FileStamp
from farm.data.locations import join

SAMPLE = 8  # files of a shard's slice a node compares: a stat each, which on a network filesystem is a round trip
# Files the head stamps, at most, evenly spread (the last always): stamping each of 65,536 images took planning from
# 0.4 s to 0.9 s on the dev box (a stat and a validated stamp a file), where a node compares 8 of its shard's.
STAMPED = 4096


def stamp(path: str) -> FileStamp:
    found = os.stat(path)
    return FileStamp(size=found.st_size, mtime_ns=found.st_mtime_ns)


def stamps(root: str, paths: list[str]) -> list[dict[str, int] | None]:
    """The stamps (FileStamp's fields) of STAMPED files at most, evenly spread, the last among them; None for the
    others: a stat a stamped file, as planning sees it on the head."""
    found: list[dict[str, int] | None] = [None] * len(paths)
    if not paths:
        return found
    step = max(len(paths) / STAMPED, 1.0)
    chosen = {min(int(i * step), len(paths) - 1) for i in range(min(len(paths), STAMPED))} | {len(paths) - 1}
    for i in chosen:
        seen = os.stat(join(root, paths[i]))
        found[i] = {"size": seen.st_size, "mtime_ns": seen.st_mtime_ns}
    return found


def mismatch(plan: DatasetPlan, root: str) -> str | None:
    """Why this machine does not see the plan's files as the head planned them (the first that differs), or None
    when it does. A sample of SAMPLE stamped files of the plan (a shard's slice), the first and last among them: a
    node that mounts another filesystem at that path, or none, differs at the first."""
    stamped = [(f.path, f.stamp) for f in plan.files if f.stamp is not None]
    if not stamped:
        return f"{join(root, plan.files[0].path)}: the plan holds no stamp of its files" if plan.files else None
    step = max(len(stamped) / SAMPLE, 1.0)
    chosen = sorted({min(int(i * step), len(stamped) - 1) for i in range(SAMPLE)} | {len(stamped) - 1})
    for path, planned in (stamped[i] for i in chosen):
        why = _differs(planned, join(root, path))
        if why:
            return why
    return None


def _differs(planned: FileStamp, path: str) -> str | None:
    try:
        seen = stamp(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if seen != planned:
        return (f"{path}: {seen.size:,} bytes modified at {seen.mtime_ns} ns where the head planned "
                f"{planned.size:,} bytes modified at {planned.mtime_ns} ns")
    if not os.access(path, os.R_OK):  # the head's user's file, which this node's account may see but not open
        return f"{path}: not readable here"
    return None
