"""DataService: a job's dataset files on the head's machine for its shards' nodes (by the job's read credential),
and a job's result files for users (by the API token). Thin: the files are farm.head.datasets' and
farm.data.results'; file reads run in threads, off the event loop that carries every heartbeat."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

import grpc

from farm.core.dataset import Location
from farm.core.errors import AuthError, NotFoundError, UserError
from farm.data.locations import join
from farm.data.locations.head import MAX_READ
from farm.data.results import MANIFEST, SHARD_FILE, Results
from farm.head import datasets
from farm.head.auth import Tokens
from farm.head.errors import streaming, unary
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.proto.v1 import data_pb2, data_pb2_grpc

CHUNK = 1024 * 1024  # bytes a Chunk message carries
JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class DataServicer(data_pb2_grpc.DataServiceServicer):
    def __init__(self, store: Store, tokens: Tokens, settings: HeadSettings) -> None:
        self.store = store
        self.tokens = tokens
        self.settings = settings

    def _dataset_file(self, context: grpc.aio.ServicerContext, job_id: str, path: str) -> Path:
        """The file `path` of job `job_id`'s dataset on this machine, once the job's read credential is checked:
        only files of the job's plan, only while the job runs, never inside the head's state folder."""
        metadata = dict(context.invocation_metadata() or ())
        presented = str(metadata.get("authorization", "")).removeprefix("Bearer ")
        expected = datasets.read_token(self.settings.state_dir, job_id) if JOB_ID.match(job_id) else None
        self.tokens.check_secret(context, presented, expected, "invalid or missing read credential for this job")
        if self.store.job(job_id).state.finished:
            raise AuthError(f"job {job_id} has ended: its read credential is void")
        saved = datasets.load(self.settings.state_dir, job_id)
        if saved is None or saved[0].where is not Location.HEAD:
            raise NotFoundError(f"job {job_id} reads no dataset from the head")
        spec, plan = saved
        if path not in {f.path for f in plan.files}:
            raise NotFoundError(f"no file {path!r} in job {job_id}'s dataset")
        target = Path(join(spec.location, path))
        if datasets.inside(target, self.settings.state_dir):
            raise NotFoundError(f"no file {path!r} in job {job_id}'s dataset")
        return target

    @unary
    async def Stat(self, request: data_pb2.DataFileRequest, context: grpc.aio.ServicerContext
                   ) -> data_pb2.DataFileInfo:
        path = self._dataset_file(context, request.job_id, request.path)
        try:
            size = await asyncio.to_thread(lambda: path.stat().st_size)
        except OSError:
            raise NotFoundError(f"{request.path!r} of job {request.job_id}'s dataset is gone") from None
        return data_pb2.DataFileInfo(size=size)

    @streaming
    async def Read(self, request: data_pb2.ReadRequest, context: grpc.aio.ServicerContext
                   ) -> AsyncIterator[data_pb2.Chunk]:
        path = self._dataset_file(context, request.job_id, request.path)
        if request.offset < 0 or not 0 <= request.length <= MAX_READ:
            raise UserError(f"a read is at most {MAX_READ} bytes from an offset of at least 0")
        try:
            handle = await asyncio.to_thread(path.open, "rb")
        except OSError:
            raise NotFoundError(f"{request.path!r} of job {request.job_id}'s dataset is gone") from None
        with handle:
            async for chunk in _chunks(handle, request.offset, request.length):
                yield chunk

    @unary
    async def ListResults(self, request: data_pb2.ListResultsRequest, context: grpc.aio.ServicerContext
                          ) -> data_pb2.ListResultsReply:
        self.tokens.check_api(context)
        job = self.store.job(request.job_id)
        files = await asyncio.to_thread(Results(job.output).files)
        rows = {s.index: s.items for s in job.shards}
        listed = []
        for name, size in files:
            match = SHARD_FILE.match(name)
            shard = int(match.group(1)) if match else -1
            listed.append(data_pb2.ResultFile(name=name, size=size, shard=shard, rows=rows.get(shard, 0)))
        return data_pb2.ListResultsReply(state=job.state.value, files=listed, format="parquet")

    @streaming
    async def ReadResult(self, request: data_pb2.ReadResultRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[data_pb2.Chunk]:
        self.tokens.check_api(context)
        job = self.store.job(request.job_id)
        if not (SHARD_FILE.match(request.name) or request.name == MANIFEST) or request.offset < 0:
            raise NotFoundError(f"job {job.id} has no result file {request.name!r}")
        try:
            handle = await asyncio.to_thread(Results(job.output).open, request.name)
        except (OSError, FileNotFoundError):
            raise NotFoundError(f"job {job.id} has no result file {request.name!r} (yet)") from None
        with handle:
            async for chunk in _chunks(handle, request.offset, None):
                yield chunk


async def _chunks(handle: IO[bytes], offset: int, length: int | None) -> AsyncIterator[data_pb2.Chunk]:
    await asyncio.to_thread(handle.seek, offset)
    left = length
    while left is None or left > 0:
        data = await asyncio.to_thread(handle.read, CHUNK if left is None else min(CHUNK, left))
        if not data:
            return
        if left is not None:
            left -= len(data)
        yield data_pb2.Chunk(data=data)
