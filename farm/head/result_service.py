"""ResultService: each shard's attempt uploads its result here, by its upload ticket (farm.head.dispatch issues it;
farm.head.arrivals reads the upload). Thin: the dispatcher checks the ticket and owns what arrives."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from farm.head.dispatch import Dispatcher
from farm.head.errors import unary
from farm.head.gate import bearer
from farm.proto.v1 import result_pb2, result_pb2_grpc


class ResultServicer(result_pb2_grpc.ResultServiceServicer):
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    @unary
    async def Upload(self, request_iterator: AsyncIterator[result_pb2.UploadPart],
                     context: grpc.aio.ServicerContext) -> result_pb2.UploadReply:
        await self.dispatcher.receive(bearer(dict(context.invocation_metadata() or ())), request_iterator)
        return result_pb2.UploadReply()
