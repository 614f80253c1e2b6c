"""DataService: a job's dataset files on the head's machine for its shards' nodes (by the job's read credential),
and a job's result files for users (by the API token). Thin: the files are farm.head.datasets' and
farm.data.results'; file reads run in threads, off the event loop that carries every heartbeat."""

from __future__ import annotations

import asyncio
import copy
import os
import re
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

import grpc

from farm.core.dataset import Location
from farm.core.errors import AuthError, NotFoundError, UserError
from farm.data.locations import join
from farm.data.locations.head import MAX_READ, tune_malloc
from farm.data.results import SHARD_FILE, Results, is_result_file
from farm.head import datasets
from farm.head.auth import Tokens, peer_address
from farm.head.planned_files import LinkRefused, Opened, open_folder, open_planned
from farm.head.errors import streaming, unary
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.proto.v1 import data_pb2, data_pb2_grpc

CHUNK = 1024 * 1024  # bytes a Chunk message carries
JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_FILES = 1024  # paths one ReadFiles may name
SERVED_KEPT = 16  # jobs whose credential and plan the service keeps read
READ_AHEAD = 4  # groups of files a ReadFiles call has started reading ahead of the one it sends: its memory is at
# most READ_AHEAD x 2 CHUNK bytes (a group stops past CHUNK), with a file open a group, whatever the files' sizes
GROUP_FIRST, GROUP_MOST = 8, 64  # files a call's first group starts with; the most a group takes
Started = tuple["int | None", bytes, str]  # a file opened and its first CHUNK read: (its fd if more is left, the
# bytes, why it does not read)
Planned = dict[str, "tuple[int, int] | None"]  # a job's planned files: path → (st_dev, st_ino) as planned, if kept


@dataclass(frozen=True)
class _Served:
    token: str  # the job's read credential
    root: str | None  # its dataset's location on this machine (None: it reads none from the head)
    paths: Planned  # its plan's files, with their identities as planned


class DataServicer(data_pb2_grpc.DataServiceServicer):
    def __init__(self, store: Store, tokens: Tokens, settings: HeadSettings) -> None:
        self.store = store
        self.tokens = tokens
        self.settings = settings
        tune_malloc()  # MiB-sized messages from the heap, not fresh pages each
        # The files ReadFiles calls read ahead, on a bounded pool off the event loop.
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="farm-data")
        self.served: OrderedDict[str, _Served] = OrderedDict()
        self.serving = threading.Lock()  # `served` is shared with the data lanes' servicers, on their threads
        self.state_real = os.path.realpath(settings.state_dir) + os.sep  # resolved once, not at every file

    def for_lane(self, store: Store) -> DataServicer:
        """This servicer for a data lane's loop (farm.head.data_lanes): its own store (a SQLite connection is one
        thread's), the same read pool and plans kept."""
        lane = copy.copy(self)
        lane.store = store
        return lane

    async def _dataset(self, context: grpc.aio.ServicerContext, job_id: str) -> tuple[str, Planned]:
        """Job `job_id`'s dataset root on this machine and its plan's files, once the job's read credential is
        checked, only while the job runs. The plan is loaded once the credential is checked, off the event loop (a
        folder of 65,536 images: most of a second of pydantic, which would hold up every call on this loop)."""
        metadata = dict(context.invocation_metadata() or ())
        presented = str(metadata.get("authorization", "")).removeprefix("Bearer ")
        kept, token = self._credential(job_id, presented, peer_address(context), self.store)
        served = kept if kept is not None else await asyncio.to_thread(self._load, job_id, token)
        return self._root(job_id, served)

    def dataset_at(self, peer: str, job_id: str, presented: str, store: Store) -> tuple[str, Planned]:
        """_dataset for a caller outside gRPC (the bulk port, farm.head.bulk: on its connection's thread)."""
        kept, token = self._credential(job_id, presented, peer, store)
        return self._root(job_id, kept if kept is not None else self._load(job_id, token))

    def _credential(self, job_id: str, presented: str, peer: str, store: Store) -> tuple[_Served | None, str]:
        """The job's plan if kept, and its read credential, once `presented` is that credential (counted against
        `peer` where it is not) and the job has not ended."""
        kept = self._kept(job_id) if JOB_ID.match(job_id) else None
        token = kept.token if kept else (datasets.read_token(self.settings.state_dir, job_id)
                                         if JOB_ID.match(job_id) else None)
        self.tokens.check_secret_at(peer, presented, token, "invalid or missing read credential for this job")
        assert token is not None  # check_secret_at refused a job without a credential
        if store.job_state(job_id).finished:
            raise AuthError(f"job {job_id} has ended: its read credential is void")
        return kept, token

    @staticmethod
    def _root(job_id: str, served: _Served) -> tuple[str, Planned]:
        if served.root is None:
            raise NotFoundError(f"job {job_id} reads no dataset from the head")
        return served.root, served.paths

    def _kept(self, job_id: str) -> _Served | None:
        with self.serving:
            if (served := self.served.get(job_id)) is not None:
                self.served.move_to_end(job_id)
            return served

    def _load(self, job_id: str, token: str) -> _Served:
        """A job's plan as the head serves it, read once: it is written at submit and never changes, and a large
        plan (a folder of 65,536 images) took longer to load than its files to read, at every call. The last
        SERVED_KEPT jobs are kept."""
        saved = datasets.load(self.settings.state_dir, job_id)
        if saved is None or saved[0].where is not Location.HEAD:
            served = _Served(token, None, {})
        else:
            known = datasets.planned_identities(self.settings.state_dir, job_id) or {}
            served = _Served(token, saved[0].location, {f.path: known.get(f.path) for f in saved[1].files})
        with self.serving:
            self.served[job_id] = served
            while len(self.served) > SERVED_KEPT:
                self.served.popitem(last=False)
        return served

    def open_file(self, job_id: str, root: str, planned: Planned, path: str, folder: int | None = None) -> int:
        """The file `path` of the job's plan, opened without following links (open_planned; from `folder`, the
        root's descriptor, when given), never inside the head's state folder (no link followed: its path as planned
        is where it is), and the very file planned."""
        # Lexically: open_planned follows no link on the way, so a path that opens is where it says it is (resolving
        # it at every file was the largest part of serving a folder of small images).
        if path not in planned or (os.path.normpath(join(root, path)) + os.sep).startswith(self.state_real):
            raise NotFoundError(f"no file {path!r} in job {job_id}'s dataset")
        try:
            fd, info = open_planned(root, path, folder)
        except LinkRefused:
            raise
        except OSError:
            raise NotFoundError(f"{path!r} of job {job_id}'s dataset is gone") from None
        if planned[path] not in (None, (info.st_dev, info.st_ino)):
            os.close(fd)
            raise LinkRefused(f"{path!r} of job {job_id}'s dataset has been replaced since the job was submitted "
                              "(another file is at its path): not read")
        return fd

    @unary
    async def Stat(self, request: data_pb2.DataFileRequest, context: grpc.aio.ServicerContext
                   ) -> data_pb2.DataFileInfo:
        root, planned = await self._dataset(context, request.job_id)
        fd = await asyncio.to_thread(self.open_file, request.job_id, root, planned, request.path)
        try:
            return data_pb2.DataFileInfo(size=os.fstat(fd).st_size)
        finally:
            os.close(fd)

    @streaming
    async def Read(self, request: data_pb2.ReadRequest, context: grpc.aio.ServicerContext
                   ) -> AsyncIterator[data_pb2.Chunk]:
        root, planned = await self._dataset(context, request.job_id)
        if request.offset < 0 or not 0 <= request.length <= MAX_READ:
            raise UserError(f"a read is at most {MAX_READ} bytes from an offset of at least 0")
        loop = asyncio.get_running_loop()
        fd = await loop.run_in_executor(self.pool, self.open_file, request.job_id, root, planned, request.path)
        try:
            # The next chunk is read on the pool while this one is sent: the disk and the socket overlap, and the
            # call holds at most two chunks.
            offset, end = request.offset, request.offset + request.length
            reading = loop.run_in_executor(self.pool, os.pread, fd, min(CHUNK, end - offset), offset)
            while True:
                try:
                    data = await reading
                except OSError as exc:
                    raise NotFoundError(f"{request.path!r} of job {request.job_id}'s dataset does not read: "
                                        f"{exc.strerror}") from None
                offset += len(data)
                if len(data) == 0:
                    return
                if offset < end and len(data) == CHUNK:
                    reading = loop.run_in_executor(self.pool, os.pread, fd, min(CHUNK, end - offset), offset)
                yield data_pb2.Chunk(data=data)
                if offset >= end or len(data) < CHUNK:
                    return
        finally:
            if not reading.done():
                reading.add_done_callback(lambda _: os.close(fd))
            else:
                os.close(fd)

    @streaming
    async def ReadFiles(self, request: data_pb2.ReadFilesRequest, context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[data_pb2.FileParts]:
        root, planned = await self._dataset(context, request.job_id)
        if len(request.paths) > MAX_FILES:
            raise UserError(f"a ReadFiles call names at most {MAX_FILES} files, not {len(request.paths)}")
        loop = asyncio.get_running_loop()
        try:  # the root's components opened once for the call's files (a folder of images: most of the syscalls)
            opened = Opened(await loop.run_in_executor(self.pool, open_folder, root))
        except OSError:
            opened = Opened(None)  # each file then opened from "/", and refused there with its reason

        def start(path: str) -> Started:
            """The file opened and its first CHUNK bytes read; or why not."""
            try:
                with opened.walking() as folder:
                    fd = self.open_file(request.job_id, root, planned, path, folder)
            except NotFoundError as exc:
                return None, b"", exc.message
            try:
                data = os.read(fd, CHUNK)
            except OSError as exc:
                os.close(fd)
                return None, b"", f"{path!r} does not read: {exc.strerror}"
            if len(data) < CHUNK:
                os.close(fd)
                return None, data, ""
            return opened.keep(fd), data, ""

        def start_group(paths: list[str]) -> list[Started]:
            """start() for the first files of `paths`, on one trip to the pool (small files: a trip a file was most
            of the head's time), up to CHUNK bytes read or a file that has more: the rest start in their turn."""
            found: list[Started] = []
            held = 0
            for path in paths:
                found.append(start(path))
                held += len(found[-1][1])
                if held >= CHUNK or found[-1][0] is not None:
                    break
            return found

        names = list(request.paths)
        group = GROUP_FIRST
        ahead: deque[tuple[list[str], asyncio.Future[list[Started]]]] = deque()
        parts: list[data_pb2.FilePart] = []
        held = index = taken = 0
        try:
            while index < len(names):
                while len(ahead) < READ_AHEAD and taken < len(names):
                    paths = names[taken:taken + group]
                    ahead.append((paths, loop.run_in_executor(self.pool, start_group, paths)))
                    taken += len(paths)
                paths, future = ahead.popleft()
                started = await future
                group = _next_group(started)
                for k, path in enumerate(paths):
                    fd, data, error = (started[k] if k < len(started)
                                       else await loop.run_in_executor(self.pool, start, path))
                    offset = 0
                    while True:
                        parts.append(data_pb2.FilePart(index=index, data=data, last=fd is None, error=error))
                        held += len(data)
                        offset += len(data)
                        if held >= CHUNK:  # several small files a message; a large file one CHUNK a message
                            yield data_pb2.FileParts(parts=parts)
                            parts, held = [], 0
                        if fd is None:
                            break
                        try:  # pread: a read still running when the call ends moves no shared offset
                            data = await loop.run_in_executor(self.pool, os.pread, fd, CHUNK, offset)
                        except OSError as exc:
                            data, error = b"", f"{path!r} does not read: {exc.strerror}"
                        if len(data) < CHUNK:
                            opened.close(fd)
                            fd = None
                    index += 1
            if parts:
                yield data_pb2.FileParts(parts=parts)
        finally:  # a call ended mid-way (cancelled, broken): what it holds and what its tasks still open is closed
            opened.end()

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
        if not is_result_file(request.name) or request.offset < 0:
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


def _next_group(started: list[Started]) -> int:
    """Files the next start_group is given: as many as its CHUNK holds at the sizes just seen (what it does not
    reach starts a file a trip)."""
    read = sum(len(data) for _, data, _ in started)
    if not started or any(fd is not None for fd, _, _ in started):
        return 1
    return max(1, min(GROUP_MOST, CHUNK * len(started) // max(read, 1)))
