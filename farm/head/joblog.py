"""The job log beyond state changes: what a shard printed and its traceback (sent by the node with its result or
its error), a head restart as each unfinished job saw it; and following the log as it grows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from farm.core.models import JobState, ShardState
from farm.core.tasks import SHARD_LOG_ATTR, SHARD_TRACEBACK_ATTR
from farm.head.events import JobEvents
from farm.head.store import Store

# What the head keeps of one shard's output or traceback, whatever a node sends (the node keeps 64 KiB already:
# this bounds a node that does not).
MAX_TEXT = 64 * 1024
FOLLOW_POLL_S = 1.0  # a safety net only: every change of a job publishes an event


def record_output(store: Store, job_id: str, index: int, result: object) -> None:
    """A finished shard's output, when it printed anything."""
    _record(store, job_id, index, "output", getattr(result, "log", ""))


def record_worker_output(store: Store, job_id: str, index: int, worker: str, text: object) -> None:
    """What one worker of a training stretch printed, under the worker's name (a stretch runs on several)."""
    if isinstance(text, str) and text.strip():
        _record(store, job_id, index, "output", f"{worker}:\n{text}")


def record_error(store: Store, job_id: str, index: int, error: BaseException) -> None:
    """A failed call's output and full traceback, as they came with its exception (a training worker's)."""
    record_failure(store, job_id, index, getattr(error, SHARD_LOG_ATTR, ""), getattr(error, SHARD_TRACEBACK_ATTR, ""))


def record_failure(store: Store, job_id: str, index: int, output: str, trace: str) -> None:
    """A failed shard's output and full traceback, as its node sent them with its failure."""
    _record(store, job_id, index, "output", output)
    _record(store, job_id, index, "error", trace)


def _record(store: Store, job_id: str, index: int, level: str, text: object) -> None:
    if isinstance(text, str) and text.strip():  # from a node: anything else is dropped
        store.log(job_id, level, _bounded(text.rstrip()), shard=index)


def record_restart(store: Store) -> None:
    """At the head's start, before running shards go back to the queue: each unfinished job's log says so."""
    for job in store.jobs(states=(JobState.QUEUED, JobState.RUNNING)):
        running = [s.index for s in job.shards if s.state is ShardState.RUNNING]
        again = f": shards {', '.join(map(str, running))} were running and go back to the queue" if running else ""
        store.log(job.id, "warning", f"the head restarted{again}")


async def follow(store: Store, events: JobEvents, job_id: str, shard: int | None = None, after: int = 0
                 ) -> AsyncIterator[dict[str, Any]]:
    """The job's log lines after `after`, then each new one as it is written, until the job has ended and its last
    lines are out."""
    store.job(job_id)  # NotFoundError before the stream starts
    with events.subscribe(job_id) as changed:
        while True:
            finished = store.job(job_id).state.finished  # read before the lines: the last ones are written with it
            for line in store.logs(job_id, shard, after):
                after = line["id"]
                yield line
            if finished:
                return
            try:
                await asyncio.wait_for(changed.wait(), timeout=FOLLOW_POLL_S)
            except TimeoutError:
                pass
            changed.clear()


def _bounded(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    half = MAX_TEXT // 2
    return f"{text[:half]}\n[... {len(text) - MAX_TEXT:,} characters dropped by the head ...]\n{text[-half:]}"
