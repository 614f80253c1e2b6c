"""The head's end of each node's work stream (AgentService.Work): the orders waiting for a node, and which nodes are
connected now.

Every shard reaches its node this way, over the node's mutual-TLS channel, as protobuf: an Assignment (its task as
JSON, farm.core.wire) or a cancellation. The node answers with acks, what its attempts print as they run, and,
when an attempt ends, an Ended report; its result goes separately, by upload ticket, to the ResultService. No node
ever holds the head's Ray address or token for this, and nothing a node sends on it is more than a ticket and text.

A node holds its running shards while its stream is open: once it closes (the agent stopped, its machine or network
went away), the dispatcher's next round takes them back (farm.head.dispatch)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from farm.core.tasks import ResultRoute
from farm.core.wire import encode_task
from farm.head.joblog import LiveOutput
from farm.head.store import Job, Store
from farm.proto.v1 import agent_pb2

log = logging.getLogger("farm.head")

MAX_REASON = 2000  # characters of a node's word on why an attempt ended
ORDERS_WAITING = 10_000  # orders queued for one node at most: a node that reads none is dropped


@dataclass
class Link:
    """One node's open work stream: the orders the head has for it, in order."""

    node_id: str
    orders: asyncio.Queue[agent_pb2.WorkOrder] = field(default_factory=lambda: asyncio.Queue(ORDERS_WAITING))
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class Links:
    def __init__(self) -> None:
        self.open: dict[str, Link] = {}
        # The dispatcher's: an attempt its node says ended (the node's id and what it said).
        self.on_ended: Callable[[str, agent_pb2.WorkEnded], None] = lambda node_id, ended: None
        self.on_worker: Callable[[str, agent_pb2.WorkerStarted], None] = lambda node_id, started: None
        self.on_output: Callable[[str, agent_pb2.WorkOutput], None] = lambda node_id, output: None
        self.on_change: Callable[[], None] = lambda: None
        # The dispatcher's: a node's stream closed (or a new one replaced it): its agent stopped its workers.
        self.on_closed: Callable[[str], None] = lambda node_id: None

    def connected(self) -> set[str]:
        return set(self.open)

    def attach(self, node_id: str) -> Link:
        """A node's new stream; an older one of the same node is closed (its agent reconnected)."""
        old = self.open.pop(node_id, None)
        if old is not None:
            old.closed.set()
            self.on_closed(node_id)  # before the new stream takes any order
        link = self.open[node_id] = Link(node_id)
        self.on_change()
        return link

    def detach(self, link: Link) -> None:
        link.closed.set()
        if self.open.get(link.node_id) is link:
            del self.open[link.node_id]
            self.on_closed(link.node_id)
            self.on_change()

    def send(self, node_id: str, order: agent_pb2.WorkOrder) -> bool:
        """Queue an order for a node; False: it is not connected (or reads nothing), and the order is dropped."""
        link = self.open.get(node_id)
        if link is None:
            return False
        try:
            link.orders.put_nowait(order)
        except asyncio.QueueFull:
            log.warning("node %s reads no orders: its work stream is closed", node_id)
            self.detach(link)
            return False
        return True

    def cancel_attempt(self, node_id: str, ticket: str) -> None:
        self.send(node_id, agent_pb2.WorkOrder(cancel=agent_pb2.CancelWork(ticket=ticket)))

    def report(self, link: Link, report: agent_pb2.WorkReport) -> None:
        """What the node said on its stream (after its hello)."""
        which = report.WhichOneof("report")
        if which == "ended":
            self.on_ended(link.node_id, report.ended)
        elif which == "worker":
            self.on_worker(link.node_id, report.worker)
        elif which == "output":
            self.on_output(link.node_id, report.output)


class JobNodes:
    """Which nodes the head gave shards of which running job: they alone may fetch its code (AgentService.Code),
    and they hear when it ends, so that its workers end with it."""

    def __init__(self, store: Store, notify: Callable[[str], None] = lambda job_id: None) -> None:
        self.store = store
        self.nodes: dict[str, set[str]] = {}
        self.sha: dict[str, str] = {}
        self.runs: dict[str, int] = {}  # each job's run its nodes were last given (Job.run): what a cancel ends
        self.live = LiveOutput(store, notify)  # what the attempts print while they run

    def add(self, job_id: str, node_id: str) -> None:
        self.nodes.setdefault(job_id, set()).add(node_id)

    def jobs(self) -> set[str]:
        return set(self.nodes)

    def of(self, job_id: str) -> set[str]:
        return set(self.nodes.get(job_id, ()))

    def gave(self, node_id: str, job_id: str) -> bool:
        return node_id in self.nodes.get(job_id, ())

    def order(self, job: Job, node_id: str, index: int, entry: str, task: object, device: str, route: ResultRoute,
              env: dict[str, str]) -> agent_pb2.WorkOrder:
        """An attempt of shard `index` as its node's order; the node may fetch the job's code from now on."""
        self.add(job.id, node_id)
        self.runs[job.id] = job.run
        self.live.started(route.ticket, job.id, index, node_id)
        return agent_pb2.WorkOrder(assign=agent_pb2.Assignment(
            ticket=route.ticket, job_id=job.id, shard=index, entry=entry, device=device,
            task_json=encode_task(entry, task), code_sha256=self.code_sha(job), env=env,
            result_address=route.address, ca_pem=route.ca_pem, name=f"farm:{job.name}:{index}", run=job.run))

    def cancels(self, job_id: str) -> list[tuple[str, agent_pb2.WorkOrder]]:
        """For each node given shards of the job, the order that ends them and its workers there: its run's (a node
        that saw it takes no more orders of that run, but takes a later run's, as a retry of its missing rows)."""
        order = agent_pb2.WorkOrder(cancel=agent_pb2.CancelWork(job_id=job_id, run=self.runs.get(job_id, 1)))
        return [(node_id, order) for node_id in sorted(self.of(job_id))]

    def forget(self, job_id: str) -> list[tuple[str, agent_pb2.WorkOrder]]:
        """An ended job's nodes, forgotten; the orders that end it there."""
        cancels = self.cancels(job_id)
        self.sha.pop(job_id, None)
        self.runs.pop(job_id, None)
        self.nodes.pop(job_id, None)
        return cancels

    def code_sha(self, job: Job) -> str:
        """The sha256 of the job's code package, read once: a node checks what it fetched against it."""
        if job.id not in self.sha:
            self.sha[job.id] = hashlib.sha256(Path(job.code_path).read_bytes()).hexdigest()
        return self.sha[job.id]

    def worker_started(self, node_id: str, started: agent_pb2.WorkerStarted) -> None:
        """A node started a persistent worker for a job on a device: the job's log says so (once a node and device,
        unless a worker died and was replaced)."""
        if self.gave(node_id, started.job_id):
            how = ("a warm worker taken on node", ", started before the job with torch and the device ready") \
                if started.warm else ("worker started on node", "")
            self.store.log(started.job_id, "info", f"{how[0]} {node_id} {started.device[:40]!r} (pid {started.pid}"
                           f"{how[1]}): it keeps the model loaded between shards")

    def code_for(self, node_id: str, job_id: str) -> Path | None:
        """A job's code package, for a node the head gave a shard of that job."""
        return Path(self.store.job(job_id).code_path) if self.gave(node_id, job_id) else None
