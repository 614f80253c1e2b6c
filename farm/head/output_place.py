"""Where a job may write its outputs on the head's machine: never into the head's state folder (its tokens, keys and
store), never into the folder of a job that has not ended (it would overwrite that job's shards and manifest), and,
when the head has an output root (--output-root), only under it. Paths are compared resolved (links followed)."""

from __future__ import annotations

from pathlib import Path

from farm.core.errors import SpecError
from farm.core.models import JobState
from farm.head.settings import HeadSettings
from farm.head.store import Store


def check(output: str, settings: HeadSettings, store: Store) -> None:
    target = Path(output).resolve()
    if _within(target, settings.state_dir.resolve()):
        raise SpecError(f"output {output} is inside the head's state folder")
    if settings.output_root is not None and not _within(target, settings.output_root.resolve()):
        raise SpecError(f"output {output} is outside the head's output root {settings.output_root}")
    for job in store.jobs(limit=10_000, states=(JobState.QUEUED, JobState.RUNNING)):
        theirs = Path(job.output).resolve()
        if _within(target, theirs) or _within(theirs, target):
            raise SpecError(f"output {output} is where job {job.id} ({job.state.value}) writes: choose another")


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
