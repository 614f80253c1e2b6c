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
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    warm: bool = False  # its worker ran a shard of the job before: its overhead is a warm shard's
    started: float = field(default_factory=time.monotonic)
    receiving: bool = False  # its upload has begun: the ticket takes no second one


class Overheads:
    """Each device's per-shard overhead as the head sees it: a warm worker's attempt from its launch to its result
    claimed, less the time the node says the shard computed (the assignment's trip, the first batch read before the
    shard's window, the result's trip, the round). The median of the last KEEP, for sizing (farm.scheduler.sizing)."""

    KEEP = 15

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], deque[float]] = {}

    def record(self, running: Running, computed_s: float) -> None:
        if running.warm:
            wall = time.monotonic() - running.started
            self.seen.setdefault((running.node_id, running.device), deque(maxlen=self.KEEP)).append(
                max(wall - computed_s, 0.0))

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
