"""The job log beyond state changes: what a shard printed (live while it runs, the rest with its result or its
error) and its traceback, a head restart as each unfinished job saw it; and following the log as it grows."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from farm.core.models import JobState, ShardState
from farm.core.tasks import SHARD_LOG_ATTR, SHARD_TRACEBACK_ATTR, VERBOSE
from farm.head.events import JobEvents
from farm.head.store import Store
from farm.proto.v1 import agent_pb2

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


def record_failure(store: Store, job_id: str, index: int, output: str, trace: str, farm_trace: str = "") -> None:
    """A failed shard's output and traceback (from the user's first frame), as its node sent them with its failure;
    the traceback with Farm's own frames as well, at level `verbose` (farm logs --verbose shows it)."""
    _record(store, job_id, index, "output", output)
    _record(store, job_id, index, "error", trace)
    if farm_trace.strip() != trace.strip():
        _record(store, job_id, index, VERBOSE, farm_trace)


def _record(store: Store, job_id: str, index: int, level: str, text: object) -> None:
    if isinstance(text, str) and text.strip():  # from a node: anything else is dropped
        store.log(job_id, level, _bounded(text.rstrip()), shard=index)


class LiveOutput:
    """What running attempts print, as their nodes send it (WorkOutput), under the shard, while it runs: a print at
    model construction shows in `farm logs --follow` at once, not when the shard ends. Only the node an attempt was
    given may send its output, and an attempt's live text is bounded as a shard's output is (MAX_TEXT), whatever a
    node sends; the rest of its output comes with its result or its error. Attempts are known from their start,
    the last KEPT of them: a piece that arrives just after its result (another channel) still counts."""

    KEPT = 4096

    def __init__(self, store: Store, notify: Callable[[str], None]) -> None:
        self.store = store
        self.notify = notify
        self.attempts: OrderedDict[str, _Live] = OrderedDict()

    def started(self, ticket: str, job_id: str, index: int, node_id: str) -> None:
        self.attempts[ticket] = _Live(job_id, index, node_id)
        while len(self.attempts) > self.KEPT:
            self.attempts.popitem(last=False)

    def record(self, node_id: str, output: agent_pb2.WorkOutput) -> None:
        live = self.attempts.get(output.ticket) if output.ticket else None
        if live is None or live.node_id != node_id or live.left <= 0 or not output.text:
            return
        text = output.text[:live.left]
        live.left -= len(text)
        if self.store.job_state(live.job_id).finished:  # a cancelled attempt still printing
            return
        self.store.log(live.job_id, "output", text.rstrip("\n") if live.left else f"{text}\n[... live output "
                       f"stops here: the head keeps {MAX_TEXT:,} characters of an attempt's ...]", shard=live.index)
        self.notify(live.job_id)


@dataclass
class _Live:
    job_id: str
    index: int
    node_id: str
    left: int = MAX_TEXT  # characters the head still takes from this attempt


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
