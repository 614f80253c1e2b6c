"""The agent's gRPC client for the head's AgentService."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from farm import __version__
from farm.core.errors import AgentError, AuthError
from farm.core.models import BackendOffer, Hardware
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc


class HeadClient:
    def __init__(self, head: str) -> None:
        self.head = head
        self.channel = grpc.aio.insecure_channel(head)
        self.stub = agent_pb2_grpc.AgentServiceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def register(
        self, join_token: str, name: str, hardware: Hardware, offers: list[BackendOffer], address: str, node_id: str
    ) -> agent_pb2.RegisterReply:
        request = agent_pb2.RegisterRequest(
            join_token=join_token, name=name, hardware=convert.hardware_to_pb(hardware),
            backends=[convert.offer_to_pb(o) for o in offers], agent_version=__version__, address=address,
            node_id=node_id,
        )
        try:
            reply: agent_pb2.RegisterReply = await self.stub.Register(request, timeout=30, wait_for_ready=True)
            return reply
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
                raise AuthError(f"the head at {self.head} refused the join token: {exc.details()}") from None
            raise AgentError(f"cannot register with the head at {self.head}: {exc.details()}") from None

    def heartbeats(
        self, beats: AsyncIterator[agent_pb2.HeartbeatRequest]
    ) -> grpc.aio.StreamStreamCall[agent_pb2.HeartbeatRequest, agent_pb2.HeartbeatReply]:
        return self.stub.Heartbeat(beats)

    async def deregister(self, node_id: str, node_token: str) -> None:
        try:
            await self.stub.Deregister(agent_pb2.DeregisterRequest(node_id=node_id, node_token=node_token), timeout=5)
        except (grpc.aio.AioRpcError, asyncio.TimeoutError):
            pass  # the head is gone or forgot us: it will mark the node offline on its own
