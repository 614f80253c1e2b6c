"""A path on the head's machine. The head reads it from its own disk (planning); a node, which shares no filesystem
with the head, reads it through the head's DataService over the head's TLS channel, with the job's read credential:
a token the head made for this job alone, which reaches only the files of the job's dataset plan (so the job's code,
which sees it, never needs the node's key or certificate)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import subprocess
import sys
import threading
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import grpc
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from farm.core.errors import DataError
from farm.data.locations import bulk_relay as relay

if TYPE_CHECKING:
    import io

    import fsspec

    from farm.core.tasks import HeadAccess

BLOCK = 16 * 1024 * 1024  # bytes a node asks the head for at a time (read ahead)
MAX_READ = 64 * 1024 * 1024  # bytes one Read may ask for (the head's DataService holds to it)
MAX_MESSAGE = 16 * 1024 * 1024
PIECE = 4 * 1024 * 1024  # bytes of a long range one Read asks for ...
STREAMS = 8  # ... and how many such Reads are in flight, each on a connection of its own to the head's data port
FILES_PER_CALL = 256  # whole files one ReadFiles call asks for (the head takes up to 1024)
CALLS_AHEAD = 4  # ReadFiles calls in flight: the head reads the next ones' files while this one's are taken
log = logging.getLogger("farm.data")


def filesystem(location: str, access: HeadAccess | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    if access is None:
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(), os.path.abspath(os.path.expanduser(location))
    return HeadFileSystem(access), ""


@lru_cache(maxsize=1)
def tune_malloc() -> bool:
    """Keep the process's large buffers in glibc's heap rather than a fresh mmap each (its default above 128 KiB, the
    threshold rising only after a free): every MiB-sized message on both sides (the file's bytes, the protobuf, gRPC's
    slices) otherwise faults in and zeroes new pages, which halved a stream's throughput on loopback
    (benchmarks/data_service.py). Freed memory past 256 MiB is still given back. Linux with glibc only; once per
    process; whether it took."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 64 * 1024 * 1024) and mallopt(m_trim_threshold, 256 * 1024 * 1024))


@lru_cache(maxsize=2)
def _pool(streams: int) -> ThreadPoolExecutor:
    """The threads a worker's long reads run their pieces on (sync gRPC streams: one thread each)."""
    return ThreadPoolExecutor(max_workers=streams, thread_name_prefix="farm-head-read")


@lru_cache(maxsize=4)
def channel(address: str, ca_pem: bytes) -> grpc.Channel:
    """A channel to the head as a node's worker reaches it (its dataset reads, its shards' uploads): one per head."""
    return _connect(address, ca_pem, [])


@lru_cache(maxsize=4)
def lanes(address: str, ca_pem: bytes, count: int) -> tuple[grpc.Channel, ...]:
    """`count` channels to the head's data port, each its own TCP connection (a local subchannel pool: gRPC would
    otherwise share one connection among channels of the same target and options). The head hands each connection
    to one of its data lanes (farm.head.data_lanes), so several cores there send a large file's pieces; here each
    connection is read and decrypted by gRPC's own threads."""
    return tuple(_connect(address, ca_pem, [("grpc.use_local_subchannel_pool", 1), ("farm.lane", lane)])
                 for lane in range(count))


def _connect(address: str, ca_pem: bytes, options: list[tuple[str, Any]]) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", MAX_MESSAGE), *options]
    if not ca_pem:  # a head started with --insecure
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(ca_pem), options=options)


class BulkReader:
    """Relays to the head's bulk port (farm.data.locations.bulk_relay): `relays` processes at most, started as reads
    need them and kept, one request at a time on each. A range's bytes come through the relay's pipe, read with the
    GIL released, so this process's threads wait on pipes while the relays decrypt on cores of their own."""

    def __init__(self, address: str, ca_pem: bytes, relays: int = STREAMS) -> None:
        host, _, port = address.rpartition(":")
        self.hello = relay.frame({"host": host.strip("[]"), "port": int(port), "ca_pem": ca_pem.decode()})
        self.slots = threading.BoundedSemaphore(relays)
        self.idle: queue.SimpleQueue[_Relay] = queue.SimpleQueue()

    def read(self, access: HeadAccess, path: str, start: int, end: int) -> bytearray:
        """Bytes [start, end) of `path` (fewer at the file's end). A relay that ends inside a read (its connection
        failed) is replaced and the read made once more."""
        length = max(end - start, 0)
        request = relay.frame({"job_id": access.job_id, "credential": access.token, "path": path, "offset": start,
                               "length": length})
        with self.slots:
            for attempt in (0, 1):
                try:
                    one = self.idle.get_nowait()
                except queue.Empty:
                    try:
                        one = _Relay(self.hello)
                    except OSError as exc:  # no process could start here: the node reads on the data port
                        raise BulkUnreachable(f"a relay to the head's bulk port did not start: {exc}") from None
                try:
                    reply, data = one.exchange(request, length)
                except OSError as exc:
                    one.end()
                    if attempt == 0:
                        continue
                    raise OSError(f"the head's bulk port: {exc}") from None
                self.idle.put(one)
                if "failed" in reply:
                    if reply.get("unreachable"):
                        raise BulkUnreachable(str(reply["failed"]))
                    raise OSError(str(reply["failed"]))
                if "error" in reply:
                    raise OSError(errno.ENOENT if reply.get("missing") else errno.EACCES,
                                  f"the head's data service: {reply['error']}", path)
                return data
        raise AssertionError("unreachable")


class _Relay:
    """One relay process and its pipes; ended when its reader drops it, or with this process."""

    def __init__(self, hello: bytes) -> None:
        self.process = subprocess.Popen([sys.executable, "-I", "-S", relay.__file__], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, bufsize=0)
        self.ended = weakref.finalize(self, _end, self.process)
        self._send(hello)

    def _send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)

    def exchange(self, request: bytes, length: int) -> tuple[dict[str, Any], bytearray]:
        """(the relay's reply, the bytes where it has some); OSError where the relay ended or spoke out of turn."""
        stdout = cast("io.FileIO", self.process.stdout)  # unbuffered (bufsize=0): its readinto releases the GIL
        try:
            self._send(request)
            reply = relay.read_frame(stdout.readinto)
        except ValueError as exc:
            raise OSError(f"its relay: {exc}") from None
        if reply is None:
            raise OSError("its relay ended")
        if "size" not in reply:
            return reply, bytearray()
        size = reply["size"]
        if not isinstance(size, int) or not 0 <= size <= length:
            raise OSError(f"its relay sent {size!r} bytes for a read of {length}")
        data = relay.exactly(stdout.readinto, size)
        if data is None:
            raise OSError("its relay ended inside a reply")
        return reply, data

    def end(self) -> None:
        self.ended()


def _end(process: subprocess.Popen[bytes]) -> None:
    """A relay ends at its stdin's end; one stuck in a read is killed."""
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    try:
        process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class BulkUnreachable(OSError):
    """The bulk port does not answer (a firewall that lets through only the data port): the node reads there."""


@lru_cache(maxsize=4)
def bulk(address: str, ca_pem: bytes) -> BulkReader:
    return BulkReader(address, ca_pem)


class HeadFileSystem(AbstractFileSystem):
    """The files of one job's dataset on the head, by their paths in its plan ("" when the location is a file)."""

    protocol = "farmhead"
    cachable = False  # one per job's access: never shared through fsspec's instance cache

    def __init__(self, access: HeadAccess, streams: int = STREAMS, **kwargs: Any) -> None:
        """`streams`: a long range's Reads in flight, on as many connections to the head's data port (one, on its
        main address, for a head without one)."""
        super().__init__(**kwargs)
        from farm.proto.v1 import data_pb2_grpc

        tune_malloc()
        self.access = access
        connections = (lanes(access.data_address, access.ca_pem, streams) if access.data_address
                       else (channel(access.address, access.ca_pem),))
        self.stubs = [data_pb2_grpc.DataServiceStub(c) for c in connections]
        self.bulk = bulk(access.bulk_address, access.ca_pem) if access.bulk_address else None
        self.stub = self.stubs[0]  # the calls that are not a long range's pieces
        self.pool = _pool(streams)
        self._turn = 0  # the connection the next piece goes on
        self.metadata = (("authorization", f"Bearer {access.token}"),)
        self._lock = threading.Lock()
        self._last_end: dict[str, int] = {}  # where the last read of each file ended
        self._ahead: tuple[tuple[str, int, int], list[Future[list[bytes]]]] | None = None  # the range read ahead

    def _call(self, path: str, call: Any) -> Any:
        try:
            return call()
        except grpc.RpcError as exc:
            raise _error(path, exc) from None

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        from farm.proto.v1 import data_pb2

        reply = self._call(path, lambda: self.stub.Stat(
            data_pb2.DataFileRequest(job_id=self.access.job_id, path=path), metadata=self.metadata, timeout=60))
        return {"name": path, "size": reply.size, "type": "file"}

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        info = self.info(path)
        return [info] if detail else [path]

    def _chunks(self, path: str, start: int, end: int, stub: Any = None) -> list[bytes]:
        from farm.proto.v1 import data_pb2

        request = data_pb2.ReadRequest(job_id=self.access.job_id, path=path, offset=start, length=max(end - start, 0))
        on = stub or self.stub
        return self._call(path, lambda: [chunk.data for chunk in on.Read(request, metadata=self.metadata,
                                                                           timeout=300)])

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return b"".join(self._range(path, start, end))

    def _range(self, path: str, start: int, end: int) -> list[bytes]:
        """Bytes [start, end) (fewer at the file's end) as the chunks they came in, in order. A long range is read
        as PIECE-sized Reads, `streams` of them in flight on as many connections (one stream is bounded by one core
        on each side and by a round trip per call); a piece that fails fails the read, with the head's reason. A
        read that starts where the last one ended (a file object reading on) puts the next range of its length in
        flight before it returns, so the head never waits for the reader between blocks: memory, one range
        ahead."""
        pieces = [(at, min(at + PIECE, end)) for at in range(start, end, PIECE)] or [(start, end)]
        with self._lock:
            ahead, self._ahead = self._ahead, None
            if ahead is not None and ahead[0][:2] == (path, start) and ahead[0][2] >= end:  # (its end may be cut)
                reads = ahead[1][:len(pieces)]
            else:
                reads = [self._read_piece(path, *piece) for piece in pieces]
            if end - start > PIECE and self._last_end.get(path) == start:
                following = (path, end, end + (end - start))
                self._ahead = (following, [self._read_piece(path, at, min(at + PIECE, following[2]))
                                           for at in range(end, following[2], PIECE)])
            self._last_end[path] = end
        held: list[bytes] = []
        for (at, stop), read in zip(pieces, reads):
            chunks = read.result()
            got = sum(map(len, chunks))
            if got > stop - at:  # a piece read ahead for a longer range than this one asks for
                chunks, got = [b"".join(chunks)[:stop - at]], stop - at
            held.extend(chunks)
            if got < stop - at:  # the file's end: the pieces after it, and any ahead, are empty
                with self._lock:
                    self._ahead = None
                break
        return held

    def _read_piece(self, path: str, start: int, end: int) -> Future[list[bytes]]:
        """Called under the lock: on the bulk port where the head has one, else the pieces go round the data port's
        connections in turn."""
        if self.bulk is not None:
            return self.pool.submit(self._bulk_piece, path, start, end)
        stub = self.stubs[self._turn % len(self.stubs)]
        self._turn += 1
        return self.pool.submit(self._chunks, path, start, end, stub)

    def _bulk_piece(self, path: str, start: int, end: int) -> list[bytes]:
        bulk = self.bulk
        if bulk is not None:
            try:
                return [bulk.read(self.access, path, start, end)]  # type: ignore[list-item]  # a bytearray reads alike
            except BulkUnreachable as exc:
                if self.bulk is not None:
                    log.warning("%s: reading on the head's data port instead", exc)
                self.bulk = None
        return self._chunks(path, start, end, self.stubs[(start // PIECE) % len(self.stubs)])

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        if end is not None:
            return self.read_range(path, start or 0, end)
        # To its end without a Stat first: one Read of a PIECE (a small file, an image, is one call), then reads
        # of the most one may ask for. A read shorter than asked for is the file's end. Joined once, at the end.
        held, offset, asked = [], start or 0, PIECE
        while True:
            chunks = self._range(path, offset, offset + asked)
            held.extend(chunks)
            got = sum(map(len, chunks))
            offset += got
            if got < asked:
                return b"".join(held)
            asked = MAX_READ

    def iter_files(self, paths: Sequence[str]) -> Iterator[tuple[str, bytes | OSError]]:
        """Each file of `paths` whole, in order, or the error it gave (the other files still come): FILES_PER_CALL
        files a ReadFiles call, CALLS_AHEAD calls in flight (so a folder of 10,000 images is 40 calls, not 10,000).
        Memory: the file being gathered, plus what HTTP/2 flow control lets the calls ahead hold."""
        from farm.proto.v1 import data_pb2

        groups = iter([list(paths[i:i + FILES_PER_CALL]) for i in range(0, len(paths), FILES_PER_CALL)])
        calls: deque[tuple[list[str], Any]] = deque()
        call = None  # the one being read
        try:
            while True:
                while len(calls) < CALLS_AHEAD and (group := next(groups, None)) is not None:
                    request = data_pb2.ReadFilesRequest(job_id=self.access.job_id, paths=group)
                    calls.append((group, self.stub.ReadFiles(request, metadata=self.metadata, timeout=600)))
                if not calls:
                    return
                group, call = calls.popleft()
                try:
                    yield from _gathered(group, call)
                except grpc.RpcError as exc:
                    raise _error(group[0], exc) from None
        finally:  # a reader that stops early: the call it was reading and those ahead are cancelled, not left to GC
            for ended in [call, *(ahead for _, ahead in calls)]:
                if ended is not None:
                    ended.cancel()

    def cat(self, path: str | list[str], recursive: bool = False, on_error: str = "raise", **kwargs: Any
            ) -> bytes | dict[str, bytes | OSError]:
        """Several files in batched calls (iter_files); fsspec's own would make one call a file."""
        if isinstance(path, str):
            return self.cat_file(path)
        found: dict[str, bytes | OSError] = {}
        for name, value in self.iter_files(path):
            if isinstance(value, OSError) and on_error == "raise":
                raise value
            if not (isinstance(value, OSError) and on_error == "omit"):
                found[name] = value
        return found

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_type: str = "readahead", cache_options: dict[str, Any] | None = None, **kwargs: Any,
              ) -> AbstractBufferedFile:
        if mode != "rb":
            raise DataError("the head's data is read-only")
        return HeadFile(self, path, mode, block_size=block_size or BLOCK, cache_type=cache_type,
                        cache_options=cache_options)


class HeadFile(AbstractBufferedFile):
    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.read_range(self.path, start, end)


def _gathered(paths: list[str], call: Any) -> Iterator[tuple[str, bytes | OSError]]:
    """The files of one ReadFiles call from its stream of parts (each file's parts in order, files in order)."""
    held: list[bytes] = []
    index = 0
    for message in call:
        for part in message.parts:
            if part.index != index or index >= len(paths):
                raise OSError(f"the head's data service sent file {part.index} where {index} was due")
            held.append(part.data)
            if part.last:
                yield paths[index], FileNotFoundError(part.error) if part.error else b"".join(held)
                held, index = [], index + 1
    if index != len(paths):
        raise OSError(f"the head's data service sent {index} of {len(paths)} files")


def _error(path: str, exc: grpc.RpcError) -> OSError:
    code = exc.code()
    if code is grpc.StatusCode.NOT_FOUND:
        return FileNotFoundError(errno.ENOENT, f"the head's data service: {exc.details()}", path)
    return OSError(f"the head's data service: {code.name}: {exc.details()}")
