"""A fake head for the client side: a real gRPC server on 127.0.0.1, in this process, answering DataService's result
calls with whatever a test hands it (hostile names, more bytes than it lists). The client under test is Farm's own,
pointed at it without TLS."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from farm.client.api import Client, HeadInfo
from farm.proto.v1 import data_pb2, data_pb2_grpc


@dataclass
class Listed:
    """One file as the fake head lists it, and the bytes it sends for it (which may differ from `size`)."""

    name: str
    data: bytes
    size: int | None = None  # what the listing says; None: len(data)
    shard: int = 0


@dataclass
class FakeResults(data_pb2_grpc.DataServiceServicer):
    files: list[Listed] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)  # names ReadResult was called with

    def ListResults(self, request: data_pb2.ListResultsRequest, context: grpc.ServicerContext
                    ) -> data_pb2.ListResultsReply:
        return data_pb2.ListResultsReply(state="succeeded", format="parquet", files=[
            data_pb2.ResultFile(name=f.name, size=len(f.data) if f.size is None else f.size, shard=f.shard, rows=1)
            for f in self.files])

    def ReadResult(self, request: data_pb2.ReadResultRequest, context: grpc.ServicerContext
                   ) -> Iterator[data_pb2.Chunk]:
        self.asked.append(request.name)
        for f in self.files:
            if f.name == request.name:
                yield data_pb2.Chunk(data=f.data[request.offset:])
                return


class FakeHead:
    """`with FakeHead(files) as (head, client):` a listening fake head and a Client to it."""

    def __init__(self, files: list[Listed]) -> None:
        self.results = FakeResults(files)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        data_pb2_grpc.add_DataServiceServicer_to_server(self.results, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def __enter__(self) -> tuple[FakeHead, Client]:
        self.server.start()
        self.client = Client(HeadInfo(address=f"127.0.0.1:{self.port}", api_token="fake", tls=False), timeout=10)
        return self, self.client

    def __exit__(self, *_: object) -> None:
        self.client.close()
        self.server.stop(grace=None)
