"""The shards' running attempts and the worker calls waiting for their results, each known by its upload ticket.

A ticket is random, made at launch and held only here: the one thing an attempt's entry point on a node shows the
head's ResultService to send its result (farm.head.arrivals). It is bound to its shard (or call) and void once the
attempt ends, is taken back, or has begun its one upload.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from farm.core.tasks import ResultRoute
from farm.head.arrivals import Arrival
from farm.head.settings import HeadSettings

ShardKey = tuple[str, int]  # (job id, shard index)


@dataclass
class Running:
    """One attempt of a shard: where it runs and its upload ticket."""

    node_id: str
    device: str
    ticket: str = ""
    started: float = field(default_factory=time.monotonic)
    receiving: bool = False  # its upload has begun: the ticket takes no second one


class Overheads:
    """Each device's per-shard overhead, as its node measured it on a warm worker (WorkEnded.overhead_s): from when
    the attempt could start (its worker free, it queued) to its end, less its compute: the first batch read before
    the shard's window, the result's trip and the head's answer. The median of the last KEEP, for sizing
    (farm.scheduler.sizing). A node's word sizes only its own shards; it is bounded all the same."""

    KEEP = 15
    MAX_S = 600.0

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], deque[float]] = {}

    MAX_DEVICES = 100_000

    def record(self, node_id: str, device: str, overhead_s: float) -> None:
        if not device or not 0.0 < overhead_s <= self.MAX_S:
            return
        key = (node_id, device[:64])
        if key in self.seen or len(self.seen) < self.MAX_DEVICES:
            self.seen.setdefault(key, deque(maxlen=self.KEEP)).append(overhead_s)

    def medians(self) -> dict[tuple[str, str], float]:
        return {key: statistics.median(values) for key, values in self.seen.items()}


@dataclass
class Expected:
    """A worker's call whose result is to come by upload (a training worker's): where a file or table it sends goes,
    and the future its arrival resolves."""

    staging: Path | None
    arrived: asyncio.Future[Arrival]


class Attempts:
    def __init__(self, settings: HeadSettings) -> None:
        self.settings = settings
        self.running: dict[ShardKey, Running] = {}
        self.tickets: dict[str, ShardKey] = {}  # upload ticket → the shard whose running attempt holds it
        self.calls: dict[str, Expected] = {}  # upload ticket → a worker's call waiting for its result (training's)
        self._ca_pem: bytes | None = None

    def route(self) -> ResultRoute:
        """A new ticket, and how its holder reaches this head: the address agents join at, the CA they pin."""
        if self._ca_pem is None:
            self._ca_pem = b"" if self.settings.insecure else (self.settings.tls_dir / "ca.pem").read_bytes()
        return ResultRoute(self.settings.address, self._ca_pem, secrets.token_urlsafe(32))

    def queueing(self, job_id: str, busy: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
        """The round's busy slots (`busy`, every job's) as this job sees them: a device running only this job's
        shards counts up to queue_depth of them as free, so that its worker holds its next shard before one ends."""
        mine = Counter((r.node_id, r.device) for r in self.of_job(job_id).values())
        seen = Counter(busy)
        for key, count in mine.items():
            if count == busy[key]:
                seen[key] = max(count - self.settings.queue_depth, 0)
        return seen

    def release_ended(self, ended: Callable[[str], bool]) -> None:
        """Every attempt of a job that has ended goes: an ended job holds no device, whatever path ended it."""
        for job_id in {key[0] for key in self.running}:
            if ended(job_id):
                for index in self.of_job(job_id):
                    self.release((job_id, index))

    def start(self, key: ShardKey, running: Running) -> None:
        self.running[key] = running
        self.tickets[running.ticket] = key

    def release(self, key: ShardKey) -> Running | None:
        """The shard's running attempt ends here: its ticket is void from now on."""
        running = self.running.pop(key, None)
        if running is not None:
            self.tickets.pop(running.ticket, None)
        return running

    def holder(self, ticket: str) -> tuple[ShardKey, Running] | None:
        key = self.tickets.get(ticket) if ticket else None
        running = self.running.get(key) if key is not None else None
        if key is None or running is None or running.ticket != ticket:
            return None
        return key, running

    def takes_upload(self, ticket: str) -> bool:
        """Whether `ticket` is a running attempt's or a waiting call's, whose upload has not begun (the gate asks,
        before the body)."""
        holder = self.holder(ticket)
        return ticket in self.calls or holder is not None and not holder[1].receiving

    def expect(self, staging: Path | None = None) -> tuple[ResultRoute, asyncio.Future[Arrival]]:
        """A worker's call that sends its result by upload (training's): its route, and the future its arrival
        resolves. `staging`: a file made for what it sends, if it sends a table or a file."""
        route = self.route()
        arrived: asyncio.Future[Arrival] = asyncio.get_running_loop().create_future()
        self.calls[route.ticket] = Expected(staging, arrived)
        return route, arrived

    def forget(self, route: ResultRoute) -> None:
        """The call is over, its result in or not: its ticket is void (and, if its upload never began, the file made
        for what it would have sent goes)."""
        expected = self.calls.pop(route.ticket, None)
        if expected is not None and expected.staging is not None:
            expected.staging.unlink(missing_ok=True)

    def of_job(self, job_id: str) -> dict[int, Running]:
        """The job's running attempts, by shard index."""
        return {index: running for (running_job, index), running in self.running.items() if running_job == job_id}
