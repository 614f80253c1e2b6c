"""The gate in front of every RPC: a call whose metadata carries no credential of the kind its method needs is refused
before gRPC reads its body, so that a caller with nothing can make the head hold nothing (a unary handler's request
is read whole before any servicer code runs; the refusing handler here is a streaming one, which reads nothing).

The servicers still check each call in full (a node's certificate, a job's own read credential, a token in a body):
this only keeps the unauthenticated out early. Each refusal counts against the peer, as the servicers' do.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from enum import Enum
from typing import Any

import grpc

from farm.head.auth import Tokens, hash_token
from farm.head.store import Store

NODE_ID_KEY = "farm-node-id"  # metadata: the node a node call is for (its node token is the bearer)


class Needs(Enum):
    """What a method's metadata must carry."""

    API = "the API token"
    READ = "the API token, unless the head was started with --open-read"
    JOIN = "a join token, or a joined node's token and id (a node that joins again)"
    NODE = "the node's token, and its id as farm-node-id"
    BEARER = "a running job's read credential (checked in full by DataService against the job the call names)"
    TICKET = "a running shard attempt's upload ticket"


# What a refusal says: as the servicers' own checks say it.
REFUSAL = {Needs.API: "invalid or missing API token", Needs.READ: "invalid or missing API token",
           Needs.JOIN: "invalid join token", Needs.NODE: "unknown node or invalid node token",
           Needs.BEARER: "invalid or missing read credential for this job",
           Needs.TICKET: "invalid or void upload ticket (its attempt ended, or its result is in)"}


# Every method not named here needs the API token.
NEEDS = {
    "/farm.v1.AgentService/Register": Needs.JOIN,
    "/farm.v1.AgentService/Heartbeat": Needs.NODE,
    "/farm.v1.AgentService/Deregister": Needs.NODE,
    "/farm.v1.AgentService/Work": Needs.NODE,
    "/farm.v1.AgentService/Code": Needs.NODE,
    "/farm.v1.DataService/Stat": Needs.BEARER,
    "/farm.v1.DataService/Read": Needs.BEARER,
    "/farm.v1.DataService/ReadFiles": Needs.BEARER,
    "/farm.v1.ResultService/Upload": Needs.TICKET,
    **{f"/farm.v1.{service}/{method}": Needs.READ for service, method in (
        ("FleetService", "ListNodes"), ("JobService", "Get"), ("JobService", "List"), ("JobService", "Watch"),
        ("JobService", "Logs"), ("JobService", "FollowLogs"))},
}


def bearer(metadata: Mapping[str, Any]) -> str:
    return str(metadata.get("authorization", "")).removeprefix("Bearer ")


class AuthGate(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: Tokens, store: Store, takes_upload: Callable[[str], bool] = lambda ticket: False,
                 reads_data: Callable[[str], bool] = lambda credential: False) -> None:
        """`takes_upload`: whether a ticket is a running attempt's that has not uploaded yet (the dispatcher's).
        `reads_data`: whether a bearer is an unfinished job's read credential (farm.head.datasets.ReadCredentials)."""
        self.tokens = tokens
        self.store = store
        self.takes_upload = takes_upload
        self.reads_data = reads_data

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        metadata = dict(details.invocation_metadata or ())
        presented = bearer(metadata)
        needs = NEEDS.get(details.method, Needs.API)
        if self.admits(needs, presented, str(metadata.get(NODE_ID_KEY, ""))):
            return refusing_malformed(await continuation(details))
        return self._refusing(REFUSAL[needs], presented)

    def admits(self, needs: Needs, presented: str, node_id: str) -> bool:
        if not presented:
            return needs is Needs.READ and self.tokens.open_read
        if needs is Needs.JOIN and not node_id:  # a known one: revoked or expired, Register says which, in words
            return self.store.join_token(hash_token(presented)) is not None
        if needs in (Needs.NODE, Needs.JOIN):  # Register with a node's own credentials: Register checks the rest
            stored = self.store.node_token_hash(node_id) if node_id else None
            return bool(stored) and hmac.compare_digest(hash_token(presented), str(stored))
        if needs is Needs.BEARER:
            return self.reads_data(presented)
        if needs is Needs.TICKET:
            return self.takes_upload(presented)
        return self.tokens.open_read and needs is Needs.READ or \
            hmac.compare_digest(presented.encode(), self.tokens.api.encode())

    def _refusing(self, reason: str, presented: str) -> grpc.RpcMethodHandler:
        async def refuse(requests: object, context: grpc.aio.ServicerContext) -> None:
            error = self.tokens.refuse(context, reason, presented)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, error.message)

        return grpc.stream_unary_rpc_method_handler(refuse)


MALFORMED = "a request that is not the method's message (it does not parse)"


class _Malformed:
    """What a request body that does not parse becomes, for the handler's wrapper to refuse in words."""


_MALFORMED = _Malformed()


class _Reading:
    """A stream's context whose read() refuses a message that does not parse (servicers read with context.read())."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def read(self) -> object:
        request = await self._context.read()
        if request is _MALFORMED:
            await self._context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED)
        return request


def refusing_malformed(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
    """`handler` with a parser that does not raise: gRPC's own answered UNKNOWN ("Unexpected DecodeError") to bytes
    that are not the message, before any Farm code ran. A request that does not parse is refused with
    INVALID_ARGUMENT, whether it is a unary call's or one message of a stream."""
    if handler is None or handler.request_deserializer is None:
        return handler
    parse = handler.request_deserializer

    def tolerant(data: bytes) -> object:
        try:
            return parse(data)
        except Exception:  # noqa: BLE001 - whatever a parser raises on bytes that are not its message
            return _MALFORMED

    async def checked(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
        async for request in requests:
            if request is _MALFORMED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED)
            yield request

    async def replies(result: Any) -> AsyncIterator[object]:
        if hasattr(result, "__aiter__"):
            async for reply in result:
                yield reply
        else:  # a handler that writes its replies itself (context.write)
            await result

    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        unary_unary = handler.unary_unary

        async def one_one(request: object, context: grpc.aio.ServicerContext) -> object:
            if request is _MALFORMED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED)
            return await unary_unary(request, context)

        return grpc.unary_unary_rpc_method_handler(one_one, tolerant, serialize)
    if handler.unary_stream is not None:
        unary_stream = handler.unary_stream

        async def one_many(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
            if request is _MALFORMED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED)
            async for reply in replies(unary_stream(request, context)):
                yield reply

        return grpc.unary_stream_rpc_method_handler(one_many, tolerant, serialize)
    if handler.stream_unary is not None:
        stream_unary = handler.stream_unary

        async def many_one(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> object:
            return await stream_unary(checked(requests, context), _Reading(context))

        return grpc.stream_unary_rpc_method_handler(many_one, tolerant, serialize)
    stream_stream = handler.stream_stream

    async def many_many(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
        async for reply in replies(stream_stream(checked(requests, context), _Reading(context))):
            yield reply

    return grpc.stream_stream_rpc_method_handler(many_many, tolerant, serialize)
