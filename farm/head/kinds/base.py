"""The interface every job kind's handler implements (see farm/head/kinds/__init__.py for how to add one)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from farm.core.errors import SpecError
from farm.core.models import BackendName, Shard
from farm.core.spec import JobKind, ModelJobSpec, SpecBase
from farm.core.tasks import ResultRoute
from farm.head import shard_check
from farm.head.arrivals import Arrival
from farm.head.outcomes import Outcomes, ShardRecord
from farm.head.settings import HeadSettings
from farm.head.store import Job, Store

if TYPE_CHECKING:
    from farm.scheduler import Assignment

S = TypeVar("S", bound=SpecBase)
CODE_PIECE = 1024 * 1024  # bytes of a code file hashed at a time (model_key)


@dataclass(frozen=True)
class Submission:
    """What a client sent with its spec."""

    code_zip: bytes  # the job's code, its workers' working folder on every node
    names: frozenset[str]  # the archive's file names
    items: int  # the items the client counted in the dataset (0 where the kind counts them itself)
    dataset_location: str = ""  # a located dataset's location as the client resolved it (empty: the spec's)


@dataclass(frozen=True)
class Plan:
    """A job's work at submit: how many items, the shards to start with, and what calibration keys it by."""

    items: int
    ranges: list[tuple[int, int]]  # [start, stop) in the kind's items (rows, steps, pairs), one per shard
    model_key: str  # jobs with one key share their speed and memory measurements
    keep: Mapping[str, bytes] = field(default_factory=dict)  # files for the job's folder beside its code (0600)
    notes: tuple[str, ...] = ()  # lines for the job's log when it is accepted


@dataclass(frozen=True)
class ShardCall:
    """A shard's task: the entry point the node's worker runs (a name of farm.core.wire.ENTRY_TASKS) and its argument
    (sent as JSON; the dispatcher adds the attempt's upload ticket)."""

    entry: str
    task: object


class Driver(Protocol):
    """What the dispatcher lends a handler each round (farm.head.dispatch.Dispatcher)."""

    store: Store
    settings: HeadSettings
    outcomes: Outcomes

    def notify(self, job_id: str) -> None: ...

    def working_dir(self, job: Job) -> str: ...

    def place_shards(self, job: Job, spec: Any, handler: ShardedKind[Any]) -> None: ...

    def expect(self, staging: Path | None = None) -> tuple[ResultRoute, asyncio.Future[Arrival]]: ...

    def forget(self, route: ResultRoute) -> None: ...


class KindHandler(Generic[S]):
    """One job kind on the head. A handler holds no per-job state between calls, except a driver of its own
    (training's); every call gets the job as the store has it and its spec, parsed once at submit."""

    kind: ClassVar[JobKind]

    def __init__(self, settings: HeadSettings, store: Store | None = None) -> None:
        self.settings = settings
        self.store = store  # the head's store, for what a kind records beyond its shards (inference's tuning)

    def plan(self, spec: S, submission: Submission) -> Plan:
        """At submit, in a worker thread (it may read a dataset's metadata): check the spec against the code, count
        the items, cut the first shards (SpecError: refused)."""
        raise NotImplementedError

    def schedule(self, job: Job, spec: S, driver: Driver) -> None:
        """Each scheduling round while the job is queued or running: start what can start."""
        raise NotImplementedError

    def metrics(self, job: Job, spec: S) -> dict[str, float]:
        """Once every shard is in: the kind's own figures of the job, added to the shared ones (rates, energy,
        accuracy)."""
        return {}

    def finish(self, job: Job, spec: S, metrics: dict[str, float]) -> dict[str, Any]:
        """Once every shard is in: write the kind's joined outputs; return its own fields for the manifest."""
        return {}

    def complete(self, job: Job, spec: S) -> bool:
        """Whether the job's shards cover all its work: a kind whose shards are cut as the job runs (`sizes_shards`)
        says no until the last is cut; the job finishes once it is complete and every shard succeeded."""
        return True

    def sizes_shards(self, spec: S) -> bool:
        """Whether the job's shards are cut as it runs, each sized to last a target time on the device it goes to
        (farm.scheduler.sizing): the dispatcher then cuts them as devices free up (farm.head.autoshard), rather than
        placing shards cut at submit."""
        return False

    def shard_file(self, index: int) -> str | None:
        """The file a shard's output is in, inside the job's output folder (None: the kind writes none per shard)."""
        return None

    def cancel(self, job_id: str) -> None:
        """The job was cancelled: stop what the handler drives itself (the dispatcher stops shard tasks)."""


class ShardedKind(KindHandler[S]):
    """A kind whose shards run apart, each one task on one device: the dispatcher places and collects them."""

    def schedule(self, job: Job, spec: S, driver: Driver) -> None:
        driver.place_shards(job, spec, self)

    def backends(self, spec: S) -> tuple[BackendName, ...]:
        """Where the kind's shards may run."""
        return spec.backends

    def task(self, job: Job, spec: S, shard: Shard, assignment: Assignment) -> ShardCall:
        """At launch: the call that runs this shard on the assignment's device."""
        raise NotImplementedError

    def staging(self, job: Job, index: int) -> Path | None:
        """Where a shard's uploaded table is written as it arrives (None: the kind's shards send no table)."""
        return None

    def check_result(self, job: Job, spec: S, shard: Shard, result: Arrival) -> None:
        """Before its output is written (in a worker thread): the result covers its shard (ShardResultError
        otherwise)."""
        assert result.figures is not None  # a failure never reaches here
        shard_check.check(shard, result.figures.items, None)

    def counts_bytes(self, job: Job, spec: S) -> bool:
        """Whether the job's ranges count bytes of line files (a dataset by location), not rows or items."""
        return False

    def measured(self, result: Arrival) -> ShardRecord | None:
        """A shard's figures as its result arrived, before its output is written (None: known only once written).
        Sizing reads them at once, so that the device's next shard is cut while this one's output is written."""
        return None

    def record(self, job: Job, spec: S, shard: Shard, result: Arrival) -> ShardRecord:
        """A shard's result arrived (its table staged, if it sent one): write its output (atomically; this runs in a
        worker thread), return its figures."""
        raise NotImplementedError


def check_model_files(spec: ModelJobSpec, names: frozenset[str]) -> None:
    """A kind that runs a model: its weights and data files must be in the job's code."""
    for what, path in (("weights", spec.weights), ("dataset", spec.dataset if spec.dataset_is_file else None)):
        if path and path not in names:
            raise SpecError(f"{what} {path!r} is not in the job's code")


def model_key(spec: ModelJobSpec, code_zip: bytes) -> str:
    """What calibration is keyed by: what determines a shard's speed. The model's callable, its input (dataset, batch
    size), the job's code package (every file's path and bytes, weights and data files included: a changed line of
    the model is another model; the zip's timestamps are not hashed, so resubmitting unchanged code keeps the key) and
    its environment (`env:`, `requirements`, `find_links`: a thread count or a package version changes the speed).
    Jobs that share a key share their measurements, so a model's second job starts from the first one's figures."""
    digest = hashlib.sha256(f"{spec.model}\0{spec.dataset}\0{spec.batch_size}\0".encode())
    digest.update(json.dumps([sorted(spec.env.items()), list(spec.requirements), spec.find_links]).encode())
    with zipfile.ZipFile(io.BytesIO(code_zip)) as archive:
        for member in sorted(archive.infolist(), key=lambda m: m.filename):
            if member.is_dir():
                continue
            digest.update(f"\0{member.filename}\0{member.file_size}\0".encode())
            with archive.open(member) as data:
                while piece := data.read(CODE_PIECE):
                    digest.update(piece)
    return digest.hexdigest()[:16]


def sharded(handler: KindHandler[Any]) -> ShardedKind[Any]:
    """The handler of a job whose attempts upload their results (training's calls come back through `expect`)."""
    assert isinstance(handler, ShardedKind), type(handler).__name__
    return handler
