"""The gRPC servicers: thin translations between the wire and the head's services."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
from pydantic import ValidationError

from farm.core.dataset import ReadRoute
from farm.core.energy import DevicePower
from farm.core.errors import AuthError, FarmError
from farm.core.ids import new_id
from farm.core.models import GpuMemory, NodeState
from farm.core.phases import ShardPhases
from farm.head import joblog, node_input, uploads
from farm.head.auth import Tokens, new_node_token
from farm.head.errors import request_error, status_of, streaming, unary
from farm.head.jobs import Deleted, Jobs
from farm.head.links import Links
from farm.head.settings import HeadSettings
from farm.head.store import Job, Store
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc, common_pb2, fleet_pb2, fleet_pb2_grpc, job_pb2, job_pb2_grpc
from farm.tls import HeadTLS

log = logging.getLogger("farm.head")


CODE_PART = 1024 * 1024  # bytes of a job's code package in one message
SHARD_LOCAL = {"metrics"}  # a kind's own per-shard figures: the job's metrics carry what a user reads of them


def job_to_pb(job: Job) -> job_pb2.Job:
    return job_pb2.Job(
        id=job.id, name=job.name, kind=job.kind, state=job.state.value, output=job.output, error=job.error,
        created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at, items=job.items,
        metrics=job.metrics, explanation=job.explanation, spec_yaml=job.spec_yaml,
        shards=[job_pb2.Shard(**s.model_dump(mode="json", exclude_none=True, exclude=SHARD_LOCAL),
                              read_route=route.name.lower() if (route := ReadRoute.of(s.metrics)) is not None else "",
                              time=job_pb2.ShardTime(**phases.seconds())
                              if (phases := ShardPhases.of(s.metrics, s.seconds)) is not None else None)
                for s in job.shards],
        energy_j=job.energy_j, energy_sources=job.energy_sources, marginal_j=job.marginal_j, run=job.run,
    )


_HEARTBEAT_REPLIES = {state: agent_pb2.HeartbeatReply(state=state.value) for state in NodeState}  # never mutated


def _power_from_pb(msg: common_pb2.DevicePower) -> DevicePower:
    """convert.power_from_pb, by fields: its MessageToDict costs ~30 µs a reading, which thousands of heartbeats a
    second add up to; the model validates the same either way."""
    # The strings as they came: pydantic validates them into their enums.
    return DevicePower(device=msg.device, watts=msg.watts, source=msg.source, scope=msg.scope)  # type: ignore[arg-type]


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, store: Store, tokens: Tokens, settings: HeadSettings, wake: asyncio.Event,
                 tls: HeadTLS | None = None, links: Links | None = None,
                 code_for: Callable[[str, str], Path | None] = lambda node_id, job_id: None) -> None:
        """`links`: the nodes' work streams; `code_for(node, job)`: the job's code package, if that node may have it
        (it was given a shard of the job)."""
        self.links = links or Links()
        self.code_for = code_for
        self.store = store
        self.tokens = tokens
        self.tls = tls  # signs each joining node's client certificate; None: a head without TLS
        self.settings = settings
        self.wake = wake

    @unary
    async def Register(self, request: agent_pb2.RegisterRequest, context: grpc.aio.ServicerContext
                       ) -> agent_pb2.RegisterReply:
        # A node that joined before may join again on its own credentials alone (below), with no join token: its
        # join token may have expired or been revoked since, and nodes that joined stay.
        stored = self.store.node_token_hash(request.node_id) if request.node_id else None
        token_id = ""
        if request.join_token or not stored:
            token_id = self.tokens.check_join(request.join_token, self.store, context)
        node_input.check_register(request)
        if not stored:  # let in on the join token (a new node): a use of it, under its use limit and rate
            self.tokens.check_join_room(token_id, self.store)
        if stored:  # a known node: only itself (or an operator's `farm head forget-node`) takes its id again
            try:
                self.tokens.check_returning_node(context, request.node_id, request.node_token, stored)
            except AuthError as exc:
                raise AuthError(f"{exc.message}; if this machine lost its identity, an operator can let it join "
                                f"afresh with `farm head forget-node {request.node_id}`") from None
        node_id = request.node_id if stored is not None else new_id("n")
        # Trusted: the admin's own machine, proven by the API token; once trusted, its re-registrations keep it so.
        trusted = bool(request.admin_token) and self.tokens.is_admin(request.admin_token) or \
            bool(stored) and self.store.node_trusted(node_id)
        if request.admin_token and not trusted:
            raise AuthError("--trusted needs the head's API token (only the head's operator joins trusted nodes)")
        token, token_hash = new_node_token()
        client_cert = self.tls.sign_node(request.csr_pem, node_id) if self.tls and request.csr_pem else b""
        if not stored:  # counted once the join can no longer fail on the request; a node joining again is no use
            self.tokens.use_join(token_id, self.store)
        self.store.upsert_node(
            node_id, request.name, convert.hardware_from_pb(request.hardware),
            [convert.offer_from_pb(b) for b in request.backends], request.address, token_hash, trusted,
        )
        log.info("node %r registered as %s from %s%s", request.name, node_id, context.peer(),
                 " (trusted: joins the head's Ray)" if trusted else "")
        self.wake.set()
        # A lent node never learns the head's Ray address or token: its shards come over its work stream.
        return agent_pb2.RegisterReply(
            node_id=node_id, node_token=token, ray_address=self.settings.ray_address if trusted else "",
            ray_token=self.settings.ray_token_path.read_text().strip() if trusted else "",
            heartbeat_interval_s=self.settings.heartbeat_interval_s, client_cert_pem=client_cert,
            mtls_port=self.settings.mtls_listen_port if self.tls else 0,
        )

    async def Heartbeat(self, request_iterator: AsyncIterator[agent_pb2.HeartbeatRequest],
                        context: grpc.aio.ServicerContext) -> None:
        """Each beat is answered with the node's state. Written with context.read/write, not as an async generator
        under @streaming: thousands of beats a second each went through three generator layers (ours, the error
        wrapper's, grpc's), a share of the head's CPU worth saving."""
        verified: str | None = None  # not "": a beat with no node id would pass as verified
        try:
            while (beat := await context.read()) is not grpc.aio.EOF:
                if beat.node_id != verified:
                    self.tokens.check_node(context, beat.node_id, beat.node_token,
                                           self.store.node_token_hash(beat.node_id))
                    verified = beat.node_id
                node_input.check_beat(beat)
                self.store.heartbeat(
                    beat.node_id, beat.cpu_percent, beat.memory_percent,
                    tuple(_power_from_pb(p) for p in beat.power), beat.busy, beat.farm_cpu_percent,
                    tuple(GpuMemory(device=m.device, used_bytes=m.used_bytes, total_bytes=m.total_bytes)
                          for m in beat.gpu_memory),
                )
                state = self.store.node_state(beat.node_id)
                if state is NodeState.OFFLINE:  # silent for a while, alive again: it rejoins through the usual checks
                    self.store.set_node_state(beat.node_id, NodeState.JOINING)
                    self.wake.set()
                    state = NodeState.JOINING
                await context.write(_HEARTBEAT_REPLIES[state])
        except (FarmError, ValidationError) as caught:
            exc = caught if isinstance(caught, FarmError) else request_error(caught)
            log.info("Heartbeat refused: %s", exc.message)
            await context.abort(status_of(exc), exc.message)

    async def Work(self, request_iterator: AsyncIterator[agent_pb2.WorkReport],
                   context: grpc.aio.ServicerContext) -> None:
        """The node's work stream (farm.head.links): its hello proves it is the node (node token, and with TLS its
        certificate); then the head's orders go out while its reports come in, until either side closes."""
        try:
            hello = await context.read()
            if hello is grpc.aio.EOF or hello.WhichOneof("report") != "hello":
                raise AuthError("a work stream starts with the node's hello")
            node_id = hello.hello.node_id
            self.tokens.check_node(context, node_id, hello.hello.node_token, self.store.node_token_hash(node_id))
        except FarmError as exc:
            await context.abort(status_of(exc), exc.message)
            return
        link = self.links.attach(node_id)
        log.info("node %s: work stream open", node_id)

        async def send() -> None:
            while True:
                await context.write(await link.orders.get())

        sending = asyncio.create_task(send())
        try:
            while (report := await context.read()) is not grpc.aio.EOF:
                self.links.report(link, report)
        except (grpc.aio.AioRpcError, ConnectionError):
            pass
        finally:
            sending.cancel()
            self.links.detach(link)
            log.info("node %s: work stream closed", node_id)

    @streaming
    async def Code(self, request: agent_pb2.CodeRequest, context: grpc.aio.ServicerContext
                   ) -> AsyncIterator[agent_pb2.CodePart]:
        """A job's code package, to a node the head gave a shard of that job, in parts read as they are sent: a call
        holds one part, however large the package and however many nodes fetch it at once."""
        self.tokens.check_node(context, request.node_id, request.node_token,
                               self.store.node_token_hash(request.node_id))
        path = self.code_for(request.node_id, request.job_id)
        if path is None:
            raise AuthError(f"node {request.node_id} runs no shard of job {request.job_id[:40]!r}")
        with path.open("rb") as package:
            while data := await asyncio.to_thread(package.read, CODE_PART):
                yield agent_pb2.CodePart(data=data)

    @unary
    async def Deregister(self, request: agent_pb2.DeregisterRequest, context: grpc.aio.ServicerContext
                         ) -> agent_pb2.DeregisterReply:
        self.tokens.check_node(context, request.node_id, request.node_token,
                               self.store.node_token_hash(request.node_id))
        self.store.set_node_state(request.node_id, NodeState.OFFLINE, "")
        log.info("node %s deregistered", request.node_id)
        self.wake.set()
        return agent_pb2.DeregisterReply()


class FleetServicer(fleet_pb2_grpc.FleetServiceServicer):
    def __init__(self, store: Store, tokens: Tokens) -> None:
        self.store = store
        self.tokens = tokens

    @unary
    async def ListNodes(self, request: fleet_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
                        ) -> fleet_pb2.ListNodesReply:
        self.tokens.check_read(context)
        running = self.store.running_shards_by_node()
        nodes = [convert.node_to_pb(n) for n in self.store.nodes()]
        for node in nodes:
            node.shards_running = running.get(node.id, 0)
        return fleet_pb2.ListNodesReply(nodes=nodes)

    @unary
    async def DrainNode(self, request: fleet_pb2.DrainNodeRequest, context: grpc.aio.ServicerContext
                        ) -> fleet_pb2.Node:
        self.tokens.check_api(context)
        node = convert.node_to_pb(self.store.set_node_drain(request.node, request.drain))
        node.shards_running = self.store.running_shards_by_node().get(node.id, 0)
        log.info("node %s %s by an operator", node.name, "drained" if request.drain else "undrained")
        return node


class JobServicer(job_pb2_grpc.JobServiceServicer):
    def __init__(self, jobs: Jobs, tokens: Tokens) -> None:
        self.jobs = jobs
        self.tokens = tokens

    @unary
    async def Submit(self, request: job_pb2.SubmitRequest, context: grpc.aio.ServicerContext) -> job_pb2.SubmitReply:
        self.tokens.check_api(context)
        code_zip = request.code_zip
        if request.code_upload:
            code_zip = await asyncio.to_thread(uploads.take, self.jobs.settings.state_dir, request.code_upload)
        job_id = await self.jobs.submit(request.spec_yaml, code_zip, request.items, request.output,
                                        request.model_bytes, request.overwrite, request.dataset_location)
        return job_pb2.SubmitReply(job_id=job_id)

    async def UploadCode(self, request_iterator: AsyncIterator[job_pb2.CodeChunk], context: grpc.aio.ServicerContext
                         ) -> job_pb2.CodeUpload:
        try:
            self.tokens.check_api(context)

            async def chunks() -> AsyncIterator[bytes]:
                async for chunk in request_iterator:
                    yield chunk.data

            upload_id = await uploads.receive(self.jobs.settings.state_dir, chunks(),
                                              self.jobs.settings.max_code_mb * 1024 * 1024)
        except FarmError as exc:
            log.info("UploadCode refused: %s", exc.message)
            await context.abort(status_of(exc), exc.message)
        return job_pb2.CodeUpload(upload_id=upload_id)

    @unary
    async def Get(self, request: job_pb2.GetJobRequest, context: grpc.aio.ServicerContext) -> job_pb2.Job:
        self.tokens.check_read(context)
        return job_to_pb(self.jobs.get(request.job_id))

    @unary
    async def List(self, request: job_pb2.ListJobsRequest, context: grpc.aio.ServicerContext
                   ) -> job_pb2.ListJobsReply:
        self.tokens.check_read(context)
        return job_pb2.ListJobsReply(jobs=[job_to_pb(j) for j in self.jobs.list(request.limit)])

    @unary
    async def Cancel(self, request: job_pb2.CancelJobRequest, context: grpc.aio.ServicerContext) -> job_pb2.Job:
        self.tokens.check_api(context)
        return job_to_pb(self.jobs.cancel(request.job_id))

    @unary
    async def RetryMissing(self, request: job_pb2.RetryMissingRequest, context: grpc.aio.ServicerContext
                           ) -> job_pb2.Job:
        self.tokens.check_api(context)
        return job_to_pb(await self.jobs.retry_missing(request.job_id))

    @unary
    async def Delete(self, request: job_pb2.DeleteJobsRequest, context: grpc.aio.ServicerContext
                     ) -> job_pb2.DeleteJobsReply:
        self.tokens.check_api(context)
        return _deleted_to_pb(await self.jobs.delete(list(request.job_ids), request.outputs))

    @unary
    async def Prune(self, request: job_pb2.PruneJobsRequest, context: grpc.aio.ServicerContext
                    ) -> job_pb2.DeleteJobsReply:
        self.tokens.check_api(context)
        return _deleted_to_pb(await self.jobs.prune(request.older_than_s, list(request.states), request.outputs))

    @streaming
    async def Watch(self, request: job_pb2.WatchJobRequest, context: grpc.aio.ServicerContext
                    ) -> AsyncIterator[job_pb2.Job]:
        self.tokens.check_read(context)
        async for job in self.jobs.watch(request.job_id):
            yield job_to_pb(job)

    @unary
    async def Logs(self, request: job_pb2.LogsRequest, context: grpc.aio.ServicerContext) -> job_pb2.LogsReply:
        self.tokens.check_read(context)
        lines = self.jobs.store.logs(request.job_id, _shard(request), request.after)
        return job_pb2.LogsReply(lines=[log_line_to_pb(line) for line in lines])

    @streaming
    async def FollowLogs(self, request: job_pb2.LogsRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[job_pb2.LogLine]:
        self.tokens.check_read(context)
        async for line in joblog.follow(self.jobs.store, self.jobs.events, request.job_id, _shard(request),
                                        request.after):
            yield log_line_to_pb(line)


def _deleted_to_pb(deleted: list[Deleted]) -> job_pb2.DeleteJobsReply:
    return job_pb2.DeleteJobsReply(jobs=[
        job_pb2.DeletedJob(id=d.job.id, name=d.job.name, state=d.job.state.value, output=d.job.output,
                           outputs_removed=d.outputs_removed, outputs_kept=d.outputs_kept)
        for d in deleted
    ])


def _shard(request: job_pb2.LogsRequest) -> int | None:
    return request.shard if request.HasField("shard") else None


def log_line_to_pb(line: dict[str, Any]) -> job_pb2.LogLine:
    message = job_pb2.LogLine(id=line["id"], ts=line["ts"], level=line["level"], message=line["message"])
    if line["shard"] is not None:
        message.shard = line["shard"]
    return message
