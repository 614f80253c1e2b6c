"""Auto-sized shards on the head: what the pure sizing (farm.scheduler.sizing) reads, taken from a job's record and
its running shards, and its cuts made into shard records.

A job with `shards: auto` starts with no shards: its rows [0, items) are cut as devices free up. The rows cut so far
are [0, frontier): every shard record holds a part of them, and the job is complete once the frontier reaches its
items (and finished once every shard has succeeded). A cut from the uncut rest is a new shard after the job's last;
a cut from a pending shard (one that never ran, or was taken back from a lost node) keeps that shard's index for its
front and makes its rest a new pending shard: a record's range changes only while nothing runs it, so a late result
of an earlier run (ignored: the dispatcher owns no such run) can never be written for rows it did not read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from farm.core.models import BackendName, Node, ShardState
from farm.head.store import Job, Store
from farm.scheduler import Assignment, ShardRequest, calibration
from farm.scheduler.sizing import Cut, Range, RunningShard, SizedRound, size_round

# Bytes a row of a line file (JSON Lines, CSV, text) is taken to hold before the job's first shard has said.
BYTES_PER_ROW_GUESS = 256.0


def frontier(job: Job) -> int:
    return max((s.stop for s in job.shards), default=0)


def complete(job: Job) -> bool:
    """Every row of the job is in some shard."""
    return frontier(job) >= job.items


def pool(job: Job, running: set[int]) -> list[Range]:
    """The job's rows that run nowhere: its pending shards not running (in row order), then the uncut rest."""
    ranges = [Range(start=s.start, stop=s.stop, index=s.index) for s in sorted(job.shards, key=lambda s: s.start)
              if s.state is ShardState.PENDING and s.index not in running]
    if frontier(job) < job.items:
        ranges.append(Range(start=frontier(job), stop=job.items))
    return ranges


def units_per_item(job: Job, in_bytes: bool) -> float | None:
    """For a dataset whose ranges count bytes: the job's bytes per row so far (a guess before any shard finished);
    None where ranges count rows."""
    if not in_bytes:
        return None
    done = [s for s in job.shards if s.state is ShardState.SUCCEEDED and s.items > 0]
    rows = sum(s.items for s in done)
    return sum(s.size for s in done) / rows if rows else BYTES_PER_ROW_GUESS


def running_by_device(job: Job, started: Mapping[int, float], ratio: float | None = None,
                      now: float | None = None) -> dict[tuple[str, str], list[RunningShard]]:
    """This job's running shards per (node, device), in rows, with how long each has run (`started`: shard index →
    time.monotonic() at launch)."""
    now = time.monotonic() if now is None else now
    found: dict[tuple[str, str], list[RunningShard]] = {}
    for shard in job.shards:
        if shard.index in started and shard.state is ShardState.RUNNING:
            rows = round(shard.size / (ratio or 1.0))
            found.setdefault((shard.node_id, shard.device), []).append(
                RunningShard(items=rows, elapsed_s=max(0.0, now - started[shard.index])))
    return found


def own_writing(job: Job, started: Mapping[int, float],
                writing: Sequence[calibration.Sample]) -> list[calibration.Sample]:
    """`writing` (samples of the job's model whose outputs are being written), those of this job's own shards marked
    as its: a device on which one of its shards has ended but is not recorded yet (running, its attempt over)."""
    ending = {(s.node_id, s.device) for s in job.shards if s.state is ShardState.RUNNING and s.index not in started}
    return [w.model_copy(update={"job_id": job.id}) if not w.job_id and (w.node_id, w.device) in ending else w
            for w in writing]


def meter_steps(nodes: Sequence[Node]) -> dict[tuple[str, str], float]:
    """Each device's meter step, as its agent reported it."""
    return {(node.id, offer.device): offer.meter_step_s for node in nodes for offer in node.backends}


def size(job: Job, spec: Any, backends: tuple[BackendName, ...], nodes: Sequence[Node],
         busy: Mapping[tuple[str, str], int], started: Mapping[int, float], store: Store,
         deadline_s: float | None, in_bytes: bool = False,
         writing: Sequence[calibration.Sample] = (),
         overheads: Mapping[tuple[str, str], float] | None = None) -> SizedRound:
    """This round's cuts for an auto-sized job. `started`: its running shards' launch times (time.monotonic());
    `writing`: what its shards whose outputs are being written measured (not in the store until written);
    `overheads`: each device's measured per-shard overhead (farm.head.attempts.Overheads)."""
    peaks = {BackendName(b): n for b, n in store.peak_memory(job.model_key).items()}
    request = ShardRequest(job_id=job.id, index=0, items=0, backends=backends, policy=spec.policy, peak_bytes=peaks,
                           model_bytes=job.model_bytes)
    ratio = units_per_item(job, in_bytes)
    rates = calibration.rates([*store.samples(job.model_key, job_id=job.id), *own_writing(job, started, writing)],
                              meter_steps(nodes), spec.energy, job_id=job.id)
    return size_round(request, nodes, busy, running_by_device(job, started, ratio), rates, pool(job, set(started)),
                      spec.batch_size, deadline_s, units_per_item=ratio, overheads=overheads)


def apply(store: Store, job: Job, cut: Cut) -> int:
    """Make `cut` a shard record; the index of the shard to launch on its device."""
    if cut.index is None:
        return store.add_shards(job.id, [(cut.start, cut.stop)])[0]
    if cut.rest is not None:
        store.split_shard(job.id, cut.index, cut.stop)
    return cut.index


def assignment(job_id: str, index: int, cut: Cut) -> Assignment:
    """The cut's device as the scheduler's placement; its basis is why the cut has its size."""
    return Assignment(job_id=job_id, index=index, node_id=cut.node_id, backend=cut.backend, device=cut.device,
                      threads=cut.threads, score=0.0, basis=cut.why)
