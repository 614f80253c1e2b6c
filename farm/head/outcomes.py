"""What becomes of a shard and its job, for every kind: one path for a result, for a failure (sorted into the node's
fault or the job's), for a retry, and for the end (metrics, the kind's outputs, the manifest)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ray import exceptions as ray_errors

from farm.core.energy import Energy
from farm.core.errors import DataError, FarmError
from farm.core.models import JobState, Node, Shard, ShardState
from farm.core.spec import ModelJobSpec
from farm.core.tuning import TuningOutcome
from farm.head import output_place, tuning
from farm.head.output import manifest, write_manifest
from farm.head.settings import HeadSettings
from farm.head.store import Job, Store
from farm.head.store.retries import PAUSED
from farm.scheduler import bad_rows
from farm.scheduler.calibration import Sample

if TYPE_CHECKING:
    from farm.core.spec import JobSpec
    from farm.head.kinds.base import KindHandler


class NodeLost(Exception):
    """A node that ran part of a job left the farm (seen by the head, before Ray's own health checks)."""


# Failures of the place a shard ran, not of the job's code: the shard may run again elsewhere.
NODE_FAILURES = (
    ray_errors.NodeDiedError, ray_errors.WorkerCrashedError, ray_errors.ObjectLostError, ray_errors.OutOfMemoryError,
    ray_errors.LocalRayletDiedError, ray_errors.RayActorError, NodeLost,
)
# What a collective raises on the workers that remain when one of the group dies (gloo's TCP pairs, NCCL).
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "gloo/transport", "NCCL communicator")


@dataclass(frozen=True)
class Failure:
    node: bool  # the node or its worker process failed, not the job's code: the shard may run again
    message: str
    data: bool = False  # a malformed input (farm.core.errors.DataError): its shard fails, the job's others go on
    bad_rows: tuple[int, int] | None = None  # data's: the range that does not read, as its node said (unchecked)
    farm_trace: str = ""  # the traceback with Farm's own frames, which the one its node sent leaves out (--verbose)


class Uploaded(Exception):
    """A failure its node sent with the call's upload (farm.head.arrivals), sorted there as the node saw it."""

    def __init__(self, failure: Failure, log: str = "", trace: str = "") -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.log = log
        self.trace = trace


def sort_failure(exc: BaseException, collective: bool = False) -> Failure:
    """Whose fault an exception from a shard's call is, and the one line that says what happened. `collective`: the
    call was one of a group's, where a peer's death breaks the survivors' calls too."""
    if isinstance(exc, Uploaded):
        lost = collective and any(sign in exc.failure.message for sign in PEER_LOST)
        return replace(exc.failure, node=exc.failure.node or lost)
    if isinstance(exc, NODE_FAILURES):
        return Failure(True, f"{type(exc).__name__}: {first_line(exc)}")
    if isinstance(exc, ray_errors.RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        message = cause.message if isinstance(cause, FarmError) else f"{type(cause).__name__}: {first_line(cause)}"
        return Failure(collective and any(sign in message for sign in PEER_LOST), message,
                       data=isinstance(cause, DataError), bad_rows=cause.rows if isinstance(cause, DataError) else None)
    if isinstance(exc, FarmError):
        return Failure(False, exc.message)
    return Failure(False, f"head: {type(exc).__name__}: {exc}")  # the head itself failed at the job's part


@dataclass(frozen=True)
class ShardRecord:
    """A finished shard's figures, as the store keeps them."""

    items: int
    seconds: float
    correct: int | None = None  # predictions equal to the dataset's labels, when it has labels
    energy: Energy | None = None
    peak_memory_bytes: int = 0
    marginal_j: float | None = None  # the part of `energy` above the device's idle draw (farm.core.energy)
    metrics: dict[str, float] = field(default_factory=dict)  # the kind's own figures (an evaluate shard's loss)
    tuning: TuningOutcome | None = None  # an inference shard's forward and its tuning (farm.head.tuning)

    def sample(self, node_id: str, device: str) -> Sample:
        """What the shard measured, as the scheduler's calibration reads it."""
        energy = self.energy
        return Sample(node_id=node_id, device=device, items=self.items, seconds=self.seconds,
                      energy_j=energy.joules if energy else 0.0, energy_source=energy.source.value if energy else "",
                      marginal_j=self.marginal_j if energy else None, finished_at=time.time())


class Outcomes:
    def __init__(self, store: Store, settings: HeadSettings, notify: Callable[[str], None],
                 stop_tasks: Callable[[str], None] = lambda job_id: None) -> None:
        self.store = store
        self.settings = settings
        self.notify = notify
        self.stop_tasks = stop_tasks  # a failed job's shards still running are cancelled

    def started(self, job: Job, index: int, node: Node, backend: str, device: str, why: str) -> None:
        self.store.shard_started(job.id, index, node, backend, device, why)
        if self.store.job_state(job.id) is JobState.QUEUED:
            self.store.set_job_state(job.id, JobState.RUNNING)
        self.notify(job.id)

    def succeeded(self, job_id: str, index: int, record: ShardRecord) -> None:
        self.store.shard_succeeded(job_id, index, record.items, record.seconds, record.correct, record.energy,
                                   record.peak_memory_bytes, record.marginal_j, record.metrics,
                                   record.tuning.winner if record.tuning is not None else "")
        tuning.shard_done(self.store, job_id, index, record.tuning)
        self.notify(job_id)

    def failed(self, job_id: str, index: int, failure: Failure) -> None:
        """A node's failure retries the shard (up to max_attempts); the job's fails the job."""
        (self.retry_or_fail if failure.node else self.fail)(job_id, index, failure.message)

    def retry_or_fail(self, job_id: str, index: int, error: str) -> None:
        """The shard goes back to the queue, counted as a try; the job fails once a shard ran max_attempts times."""
        job = self.store.job(job_id)
        if job.state.finished:
            return
        shard = job.shards[index]
        if shard.state is ShardState.RUNNING and shard.attempts >= self.settings.max_attempts:
            self.fail(job_id, index, f"{error} (after {shard.attempts} attempts)")
        else:
            self.store.shard_requeued(job_id, index, error)
            self.notify(job_id)

    def requeue(self, job_id: str, index: int, error: str) -> None:
        """Back to the queue, the shard's fault in nothing (its node drained)."""
        if not self.store.job_state(job_id).finished:
            self.store.shard_requeued(job_id, index, error)
            self.notify(job_id)

    def fail(self, job_id: str, index: int | None, error: str) -> None:
        """The job fails (at this shard, when one is to blame); its other running shards are cancelled."""
        if self.store.job_state(job_id).finished:
            return
        if index is not None:
            self.store.shard_failed(job_id, index, error)
        self.stop_tasks(job_id)
        self.store.set_job_state(job_id, JobState.FAILED, f"shard {index}: {error}" if index is not None else error)
        self.notify(job_id)

    def shard_failed(self, job_id: str, index: int, failure: Failure, handler: KindHandler, spec: JobSpec) -> None:
        """The shard failed on its own input (a corrupt row group, an image that does not decode): it keeps only the
        range that does not read, failed, and its other rows run again as new shards (farm.scheduler.bad_rows). The
        job's other shards run on; it ends once they are done, succeeded if what it skipped is within its error
        budget, else failed (farm results still fetches what is done)."""
        job = self.store.job(job_id)
        if job.state.finished:
            return
        shard = job.shards[index]
        found = bad_rows.cut((shard.start, shard.stop), failure.bad_rows)
        self.store.shard_skipped(job_id, index, found.bad, list(found.rest), failure.message)
        self.notify(job_id)
        self.finish_if_done(job_id, handler, spec)

    def finish_if_done(self, job_id: str, handler: KindHandler, spec: JobSpec) -> bool:
        """Once every shard is in: the metrics, the kind's joined outputs, then the manifest (written last: its
        presence says the rest is complete, bar the rows it lists as skipped); whether the job finished. Shards that
        failed on their data, over the job's error budget, leave the job failed, without a manifest, once the others
        are done."""
        job = self.store.job(job_id)
        ended = (ShardState.SUCCEEDED, ShardState.FAILED)
        if job.state.finished or any(s.state not in ended for s in job.shards):
            return False
        if not handler.complete(job, spec):
            return False
        metrics = {**job_metrics(job), **handler.metrics(job, spec)}
        self.store.set_metrics(job_id, metrics)
        failed = [s for s in job.shards if s.state is ShardState.FAILED]
        over = over_budget(job, spec, failed)
        if over:
            self.store.set_job_state(job_id, JobState.FAILED, f"{over}; shard {failed[0].index}: {failed[0].error}")
            self.notify(job_id)
            return True
        output_place.recheck(job.output, self.settings)  # a link swapped in since submit: not written through
        fields = handler.finish(job, spec, metrics)
        write_manifest(job.output, manifest(job, metrics, fields, handler.shard_file))
        if failed:
            self.store.log(job_id, "warning", f"{sum(s.stop - s.start for s in failed)} rows skipped, within the "
                                              "job's error budget: the manifest lists them")
        self.store.set_job_state(job_id, JobState.SUCCEEDED)
        self.notify(job_id)
        return True


def over_budget(job: Job, spec: JobSpec, failed: list[Shard]) -> str | None:
    """Why the shards that failed on their data fail the job (None: none did, or they are within its budget)."""
    if not failed:
        return None
    max_rows, max_fraction = (spec.max_bad_rows, spec.max_failed_fraction) if isinstance(spec, ModelJobSpec) else (0, 0)
    return bad_rows.over_budget([(s.start, s.stop) for s in failed], job.items, max_rows, max_fraction)


def job_metrics(job: Job) -> dict[str, float]:
    """What the kind recorded on the way, then rates over the job's wall time from its first shard's start, as a
    user waiting on it sees them, less the time it lay ended between runs (--retry-missing)."""
    wall_s = time.time() - job.started_at - job.metrics.get(PAUSED, 0.0)
    items = job.items_done  # what the shards did: a job over lines counts its range in bytes, its items in rows
    metrics = {**job.metrics, "items_per_s": items / wall_s if wall_s > 0 else 0.0, "wall_s": wall_s}
    if job.energy_j > 0 and all(s.energy_source for s in job.shards):
        metrics["items_per_j"] = items / job.energy_j
        if job.marginal_j:  # above the devices' idle draw: what the efficiency policy ranks by by default
            metrics["items_per_marginal_j"] = items / job.marginal_j
    if job.correct is not None and items:
        metrics["accuracy"] = job.correct / items
    return metrics


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
