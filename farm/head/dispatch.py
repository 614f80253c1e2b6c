"""The dispatcher: turns the scheduler's placements into assignments on the nodes' work streams, and their results
into state. It knows no job kind: each job's handler (farm.head.kinds) plans, builds and records its shards; results,
failures and retries take the one path of farm.head.outcomes. Runs on the head's event loop.

A shard goes to its node over that node's mutual-TLS work stream (farm.head.links), its task as JSON
(farm.core.wire), to the node's persistent worker for the (job, device). Each attempt gets an upload ticket at launch
(random, held here, bound to its job, shard, attempt and node): the worker streams the result or the failure to the
ResultService with it (farm.head.arrivals), as Arrow IPC and protobuf, then its node says the attempt ended; one that
ended with no result in is the node's failure. No Ray, and nothing a node makes is unpickled here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray

from farm.core.energy import marginal_joules
from farm.core.errors import AuthError, FarmError, SpecError
from farm.core.models import BackendName, JobState, Node, ShardState
from farm.core.spec import JobSpec, parse_spec
from farm.core.tasks import ResultRoute
from farm.head import arrivals, autoshard, environment, joblog, kinds, node_check, ray_compat
from farm.head.arrivals import Arrival, BadUpload, Cut, Void
from farm.head.attempts import Attempts, Overheads, Running
from farm.head.kinds.base import KindHandler, ShardedKind, sharded
from farm.head.links import MAX_REASON, JobNodes, Links
from farm.head.outcomes import Failure, Outcomes, ShardRecord, sort_failure
from farm.head.output import remove_partial_files
from farm.head.settings import HeadSettings
from farm.head.store import Job, Store
from farm.proto.v1 import agent_pb2, result_pb2
from farm.scheduler import Assignment, ShardRequest, calibration
from farm.scheduler.calibration import Sample
from farm.scheduler.rounds import schedule_round

log = logging.getLogger("farm.head")

# Why an attempt failed whose node said it ended with no result uploaded, and gave no reason.
NO_RESULT = "it ended with no result (its worker died, or could not reach the head)"


@dataclass
class Round:
    """What one scheduling round shares between its jobs: the nodes, and the slots taken so far."""

    nodes: dict[str, Node] = field(default_factory=dict)
    busy: Counter[tuple[str, str]] = field(default_factory=Counter)


class Dispatcher:
    def __init__(self, store: Store, settings: HeadSettings, notify: Callable[[str], None]) -> None:
        self.store = store
        self.settings = settings
        self.notify = notify
        self.wake = asyncio.Event()
        self.attempts = Attempts(settings)
        self.overheads = Overheads()
        # Shards whose result is in and whose output is being written: what they measured, for sizing and scoring
        # (the store has it only once the output is written, exactly once; the device is free meanwhile).
        self.writing: dict[tuple[str, int], Sample] = {}
        self.draining: set[str] = set()  # as of the last refresh_nodes: nodes whose owner or operator drains them
        self.code: dict[str, str] = {}  # job id → the URI of its code package in Ray (training's, on trusted nodes)
        self.job_nodes = JobNodes(store, notify)
        self.links = Links()
        self.links.on_ended = self._ended
        self.links.on_worker, self.links.on_output = self.job_nodes.worker_started, self.job_nodes.live.record
        self.links.on_change = self.wake.set
        self.links.on_closed = lambda node_id: self._take_back(node_id, "its node's work stream closed")
        self.specs: dict[str, JobSpec] = {}  # job id → its spec, parsed once (at submit, or at the head's start)
        self.tasks: set[asyncio.Task[None]] = set()
        self.handlers = kinds.handlers(settings, store)
        self.outcomes = Outcomes(store, settings, notify, self._cancel_running)
        self.round = Round()
        self.node_watch = node_check.NodeWatch(store, settings)

    async def run(self) -> None:
        self.recover()
        while True:
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            except TimeoutError:
                pass
            self.wake.clear()
            await self.refresh_nodes()
            self.schedule()

    def admit(self, job_id: str, spec: JobSpec) -> None:
        """A job the store just accepted, with its spec as parsed at submit."""
        self.specs[job_id] = spec
        self.wake.set()

    def handler(self, job: Job) -> KindHandler[Any]:
        return self.handlers[job.kind]

    def spec(self, job: Job) -> JobSpec:
        """The job's spec: parsed at submit, or once from the store after a head restart."""
        if job.id not in self.specs:
            self.specs[job.id] = parse_spec(job.spec_yaml, job.id)
        return self.specs[job.id]

    def recover(self) -> None:
        """After a head restart (a crash included): shards that were running died with the old Ray driver and go
        back to the queue; files a killed head was writing are removed (the shards they belong to run again); a job
        whose last shard was recorded just before the head died gets its manifest now."""
        joblog.record_restart(self.store)
        requeued = self.store.requeue_running()
        if requeued:
            log.info("recovered %d shards that were running when the head stopped", requeued)
        for job in self.store.jobs(states=(JobState.QUEUED, JobState.RUNNING)):
            remove_partial_files(Path(job.output))
            try:
                self.outcomes.finish_if_done(job.id, self.handler(job), self.spec(job))
            except SpecError as exc:  # a spec this head no longer reads: the job cannot go on
                self.outcomes.fail(job.id, None, exc.message)

    async def refresh_nodes(self) -> None:
        """Node state; the shards of ended jobs and of nodes that left or went silent go back (_take_back)."""
        holding, self.draining = await self.node_watch.refresh(self.links.connected())
        self.attempts.release_ended(lambda job_id: self.store.job_state(job_id).finished)
        for node_id in {r.node_id for r in self.attempts.running.values()} - holding:
            self._take_back(node_id, "its node left the farm")

    def _take_back(self, node_id: str, why: str) -> None:
        """Every attempt on this node ends here, its shard back in the queue (Links.on_closed: a closed work stream
        is one its agent stopped its workers with, even if it opened a new one since)."""
        for key, running in list(self.attempts.running.items()):
            if running.node_id != node_id:
                continue
            self.attempts.release(key)
            self.links.cancel_attempt(running.node_id, running.ticket)
            if node_id in self.draining:
                self.outcomes.requeue(*key, "its node drained and stopped its workers")
            else:
                self.outcomes.retry_or_fail(*key, why)
            self.notify(key[0])
        self.wake.set()

    def schedule(self) -> None:
        """One round per unfinished job, in submission order: earlier jobs take free slots first."""
        jobs = self.store.jobs(states=(JobState.QUEUED, JobState.RUNNING))
        for gone in (self.specs.keys() | self.code.keys() | self.job_nodes.jobs()) - {job.id for job in jobs}:
            self.specs.pop(gone, None)  # a finished job's
            self.code.pop(gone, None)
            for node_id, order in self.job_nodes.forget(gone):  # its workers end with it
                self.links.send(node_id, order)
        if not jobs:
            return
        self.round = Round({node.id: node for node in self.store.nodes()},
                           Counter((r.node_id, r.device) for r in self.attempts.running.values()))
        for job in jobs:
            try:
                spec = self.spec(job)
            except SpecError as exc:
                self.outcomes.fail(job.id, None, exc.message)
                continue
            self.handler(job).schedule(job, spec, self)

    def place_shards(self, job: Job, spec: Any, handler: ShardedKind[Any]) -> None:
        """A sharded kind's round: its waiting shards through the scheduler, and those it places launched; or, for
        a kind whose shards are sized as the job runs, new ones cut for the devices that are free."""
        if handler.sizes_shards(spec):
            self._cut_and_launch(job, spec, handler)
            return
        backends = handler.backends(spec)
        wanted = self._waiting(job)
        if not wanted:
            return
        peaks = {BackendName(b): n for b, n in self.store.peak_memory(job.model_key).items()}
        requests = [
            ShardRequest(job_id=job.id, index=s.index, items=s.size, backends=backends, policy=spec.policy,
                         peak_bytes=peaks, model_bytes=job.model_bytes)
            for s in wanted
        ]
        running_items: Counter[tuple[str, str]] = Counter()
        for index, running in self.attempts.of_job(job.id).items():
            running_items[(running.node_id, running.device)] += job.shards[index].size
        nodes, busy = self.round.nodes, self.round.busy
        rates = calibration.rates([*self.store.samples(job.model_key), *self._writing(job)],
                                  autoshard.meter_steps(list(nodes.values())), spec.energy)
        decided = schedule_round(requests, list(nodes.values()), self.attempts.queueing(job.id, busy), running_items,
                                 rates, self._deadline(job, spec), now=time.time())
        if decided.infeasible:
            self.outcomes.fail(job.id, None, decided.infeasible)
            return
        for assignment in decided.assignments:
            busy[(assignment.node_id, assignment.device)] += 1
            self.launch(job, spec, handler, assignment, nodes[assignment.node_id])
        self._explain(job, [*decided.explanation, *sorted({f"waiting: {w.why}" for w in decided.waiting})])

    def _cut_and_launch(self, job: Job, spec: Any, handler: ShardedKind[Any]) -> None:
        """An auto-sized job's round: a shard for each free device its policy wants, cut to that device's size
        (from the rows that never ran first, then the uncut rest), launched there."""
        started = {index: r.started for index, r in self.attempts.of_job(job.id).items()}
        nodes, busy = self.round.nodes, self.round.busy
        decided = autoshard.size(job, spec, handler.backends(spec), list(nodes.values()),
                                 self.attempts.queueing(job.id, busy), started, self.store,
                                 self._deadline(job, spec), in_bytes=handler.counts_bytes(job, spec),
                                 writing=self._writing(job), overheads=self.overheads.medians())
        if decided.infeasible:
            self.outcomes.fail(job.id, None, decided.infeasible)
            return
        for cut in decided.cuts:
            index = autoshard.apply(self.store, job, cut)
            job = self.store.job(job.id)
            busy[(cut.node_id, cut.device)] += 1
            self.launch(job, spec, handler, autoshard.assignment(job.id, index, cut), nodes[cut.node_id],
                        f"rows {cut.start:,}-{cut.stop:,}: {cut.why}")
        self._explain(job, list(decided.explanation))

    def _writing(self, job: Job) -> list[Sample]:
        """What shards of the job's model measured whose outputs are being written."""
        model_keys = {job.id: job.model_key}
        for job_id, _ in self.writing:
            if job_id not in model_keys:
                model_keys[job_id] = self.store.job(job_id).model_key
        return [sample for (job_id, _), sample in self.writing.items() if model_keys[job_id] == job.model_key]

    def _deadline(self, job: Job, spec: Any) -> float | None:
        """Seconds left to the job's deadline, if it has one."""
        return None if spec.deadline_s is None else spec.deadline_s - (time.time() - job.created_at)

    def _explain(self, job: Job, lines: list[str]) -> None:
        """A round that said nothing (its job all cut) leaves the last one's reasons for `--explain`."""
        if lines and (explanation := "\n".join(lines)) != job.explanation:
            self.store.set_explanation(job.id, explanation)

    def _waiting(self, job: Job) -> list[Any]:
        running = self.attempts.of_job(job.id)
        return [s for s in job.shards if s.state is ShardState.PENDING and s.index not in running]

    def working_dir(self, job: Job) -> str:
        """The job's code as a Ray package URI, uploaded once (training's workers, on trusted nodes): Ray ships it to
        each node as the working_dir of the job's actors."""
        if job.id not in self.code:
            self.code[job.id] = ray_compat.upload_code(Path(job.code_path).read_bytes())
        return self.code[job.id]

    def holds(self, job_id: str) -> bool:
        """Whether shards of this job are still out (an ended job's, being stopped): their results would come back
        for a job deleted meanwhile."""
        return bool(self.attempts.of_job(job_id))

    def takes_upload(self, ticket: str) -> bool:
        return self.attempts.takes_upload(ticket)

    def expect(self, staging: Path | None = None) -> tuple[ResultRoute, asyncio.Future[Arrival]]:
        return self.attempts.expect(staging)

    def forget(self, route: ResultRoute) -> None:
        self.attempts.forget(route)

    def forget_code(self, uri: str) -> None:
        """A deleted job's code package (`uri`: ray_compat.code_uri of its bytes), out of Ray's GCS, unless a job
        still on its way uses the same code. On the event loop, as uploads are: none slips in between."""
        if ray.is_initialized() and uri not in self.code.values():
            ray_compat.drop_code(uri)

    def launch(self, job: Job, spec: Any, handler: ShardedKind[Any], assignment: Assignment, node: Node,
               why: str = "") -> None:
        """Start a shard on the assignment's device; `why` it went there (default: the score it went on)."""
        shard = job.shards[assignment.index]
        call = handler.task(job, spec, shard, assignment)
        route = self.attempts.route()
        order = self.job_nodes.order(job, node.id, shard.index, call.entry, call.task, assignment.device, route,
                                     environment.worker_env(spec))
        if not self.links.send(node.id, order):
            return  # its stream closed since the round began: the shard stays pending, the next round places it
        self.attempts.start((job.id, shard.index), Running(node.id, assignment.device, route.ticket))
        self.outcomes.started(job, shard.index, node, assignment.backend.value, assignment.device,
                              why or f"score {assignment.score:,.1f}, {assignment.basis}")
        self.wake.set()  # a round gives a device one shard: the next, now, fills its other slots and its queue

    async def receive(self, ticket: str, parts: AsyncIterator[result_pb2.UploadPart]) -> None:
        """An attempt's upload (ResultService.Upload), read whole. Its result is claimed (the attempt is released, the
        device free) before this returns, so before its task ends; its output is written after, exactly once. A
        ticket that is unknown, void (the attempt taken back or ended) or already used is refused."""
        expected = self.attempts.calls.pop(ticket, None)  # one upload a ticket
        if expected is not None:
            arrival = await arrivals.receive(parts, expected.staging, lambda: not expected.arrived.done())
            if expected.arrived.done():  # the call was given up meanwhile
                arrival.discard()
                raise Void("the call was given up while its result arrived")
            expected.arrived.set_result(arrival)
            return
        holder = self.attempts.holder(ticket)
        if holder is None or holder[1].receiving:
            raise AuthError("invalid or void upload ticket (its attempt ended, or its result is in)")
        key, running = holder
        running.receiving = True
        job = self.store.job(key[0])
        try:
            arrival = await arrivals.receive(parts, sharded(self.handler(job)).staging(job, key[1]),
                                             lambda: self.attempts.running.get(key) is running)
        except Cut:  # its sender went away: its task's end says so (reap), the ticket used
            raise
        except BadUpload as exc:  # as a broken node would send: the attempt counts as the node's failure
            if self.attempts.release(key) is running:
                self._failed(key, running, Failure(True, f"its upload: {exc.message}"))
            raise
        if self.attempts.running.get(key) is not running:  # taken back while it arrived: a rerun owns the shard now
            arrival.discard()
            raise Void("the attempt was taken back while its result arrived")
        if arrival.failure is None and (measured := sharded(self.handler(job)).measured(arrival)) is not None:
            # Counted for sizing from the moment its device is free, not once its output is checked.
            self.writing[key] = self._with_marginal(running, measured).sample(running.node_id, running.device)
        self.attempts.release(key)  # claimed before any await: losing the node now must not hand the shard to another
        self.wake.set()  # its device is free: its next shard, sized by this one, is cut while the output is written
        settling = asyncio.create_task(self._settle(key, running, arrival))
        self.tasks.add(settling)
        settling.add_done_callback(self.tasks.discard)

    def _ended(self, node_id: str, ended: agent_pb2.WorkEnded) -> None:
        """A node says an attempt ended: one still held (no result in) is the node's failure; the shard runs again.
        What the attempt cost beyond its compute is its device's per-shard overhead (sizing reads it)."""
        self.overheads.record(node_id, ended.device, ended.overhead_s)
        holder, reason = self.attempts.holder(ended.ticket), ended.reason[:MAX_REASON]
        if holder is None or holder[1].node_id != node_id:  # claimed already, or another node's: nothing to do
            return
        key, running = holder
        self.attempts.release(key)
        if not self.store.job_state(key[0]).finished:  # a finished job's attempts were cancelled
            self._failed(key, running, Failure(True, reason or NO_RESULT))
        self.wake.set()

    async def _settle(self, key: tuple[str, int], running: Running, arrival: Arrival) -> None:
        """A claimed attempt's result: its output written and the shard done, or its failure sorted."""
        job_id, index = key
        try:
            job = self.store.job(job_id)
            if job.state.finished:  # cancelled, or failed by another shard
                arrival.discard()
                return
            if arrival.failure is not None:
                self._failed(key, running, arrival.failure, arrival.log, arrival.traceback)
                return
            joblog.record_output(self.store, job_id, index, arrival.figures)
            handler, spec = sharded(self.handler(job)), self.spec(job)
            await asyncio.to_thread(handler.check_result, job, spec, job.shards[index], arrival)
            record = await asyncio.to_thread(handler.record, job, spec, job.shards[index], arrival)
            self.writing.pop(key, None)  # in the store from here on
            self.outcomes.succeeded(job_id, index, self._with_marginal(running, record))
            self.outcomes.finish_if_done(job_id, handler, spec)
        except Exception as exc:
            arrival.discard()
            if not isinstance(exc, FarmError):  # the head itself failed at the shard's output
                log.exception("shard %s/%d", job_id, index)
            self._failed(key, running, sort_failure(exc))
        finally:
            self.writing.pop(key, None)
            self.notify(job_id)
            self.wake.set()

    def _failed(self, key: tuple[str, int], running: Running, failure: Failure, output: str = "",
                trace: str = "") -> None:
        """An attempt's failure, released already: the node's retries the shard (or requeues it, on a node that
        drained), its data's fails the shard alone, the job's fails the job."""
        job_id, index = key
        if failure.node:
            if running.node_id in self.draining:  # its agent stopped its workers: not the shard's fault
                self.outcomes.requeue(job_id, index, f"its node drained ({failure.message})")
            else:
                self.outcomes.retry_or_fail(job_id, index, failure.message)
            self.notify(job_id)
            return
        joblog.record_failure(self.store, job_id, index, output, trace, failure.farm_trace)
        if failure.data:  # a malformed input: its shard keeps the rows that do not read, failed; the rest run again
            job = self.store.job(job_id)
            self.outcomes.shard_failed(job_id, index, failure, self.handler(job), self.spec(job))
        else:
            self.outcomes.fail(job_id, index, failure.message)

    def _with_marginal(self, running: Running, record: ShardRecord) -> ShardRecord:
        """The record with its energy above its device's idle draw (its agent read that on the same meter)."""
        node = self.round.nodes.get(running.node_id)
        offer = next((o for o in node.backends if o.device == running.device), None) if node else None
        if record.marginal_j is not None or record.energy is None or offer is None:
            return record
        return replace(record, marginal_j=marginal_joules(record.energy, offer.idle_w, offer.idle_source))

    def cancel(self, job_id: str) -> None:
        self._cancel_running(job_id)
        self.handler(self.store.job(job_id)).cancel(job_id)
        self.store.set_job_state(job_id, JobState.CANCELLED)
        self.notify(job_id)

    def _cancel_running(self, job_id: str) -> None:
        """Stop a job's attempts and workers on its nodes; its tickets void now, whatever the nodes still send."""
        for node_id, order in self.job_nodes.cancels(job_id):
            self.links.send(node_id, order)
        for index in list(self.attempts.of_job(job_id)):
            self.attempts.release((job_id, index))
