"""The head's bulk port: ranges of a job's dataset files for its nodes' large reads, over plain TLS connections, one
thread a connection (farm.data.locations.head's BulkReader is the other end).

Why not gRPC: the head's DataService, even on several data lanes, topped out at 0.43 GB/s to one node on an H200's
loopback with the head at 0.9 cores in all (benchmarks/data_streams.py): its lanes are threads of one process, and a
message's protobuf, gRPC's slices and the asyncio loop hold the GIL. Here a connection's thread holds it only between
syscalls: os.preadv fills one buffer the connection keeps, and ssl's sendall encrypts and writes it with the GIL
released, so connections run on as many cores (benchmarks/tls_ceiling.py: the ceiling of this design).

A connection carries requests one after another, each a frame (4-byte length, then JSON, REQUEST_MAX bytes at most):
{"job_id", "credential", "path", "offset", "length"}. The reply is a frame {"size": N} followed by N bytes (fewer than
asked at the file's end), or {"error": why, "missing": true|false}, after which the head closes the connection.
Checked as on the DataService, by the same code: the job's read credential (failures counted against the peer's
address, which is then refused for a while, as on the gRPC ports), only while the job runs, only files of its plan,
each opened without following links and checked to be the file planned. Memory: one CHUNK a connection, at most
MAX_CONNECTIONS of them (MAX_PER_PEER from one address); a connection idle (or a handshake slower) than IDLE_S is
closed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from farm.core.errors import FarmError, NotFoundError
from farm.data.locations.bulk_relay import FRAME, exactly, frame
from farm.data.locations.head import MAX_READ
from farm.head.data_service import DataServicer
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.tls import HeadTLS

REQUEST_MAX = 8 * 1024  # a request's JSON: a job id, a credential and a path
CHUNK = 1024 * 1024  # bytes a connection reads from the file and sends at a time (its whole buffer)
MAX_CONNECTIONS = 64  # in all: more are refused at once ...
MAX_PER_PEER = 16  # ... and from one address (a node opens STREAMS, 8): one peer cannot hold every slot
IDLE_S = 120.0


class BulkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    job_id: str = Field(max_length=64)
    credential: str = Field(max_length=256)
    path: str = Field(max_length=4096)
    offset: int = Field(ge=0)
    length: int = Field(ge=0, le=MAX_READ)


class BulkServer:
    """settings.bulk_listen_port, serving `data`'s jobs' files; start() binds it (or raises), stop() ends it and
    every connection."""

    def __init__(self, settings: HeadSettings, data: DataServicer, tls: HeadTLS | None) -> None:
        self.settings = settings
        self.data = data
        self.context: ssl.SSLContext | None = tls.server_context() if tls is not None else None  # the head's identity
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.connections: set[socket.socket] = set()
        self.per_peer: dict[str, int] = {}
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None

    def start(self) -> None:
        self.listener = socket.create_server((self.settings.host, self.settings.bulk_listen_port), backlog=128)
        threading.Thread(target=self._accept, args=(self.listener,), name="farm-bulk-accept", daemon=True).start()

    def stop(self) -> None:
        if self.listener is not None:
            # Shut down first: a close alone leaves the port listening while the accepting thread blocks on it.
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
        with self.lock:
            for conn in self.connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                raw, address = listener.accept()
            except OSError:  # closed: the head stops
                return
            peer = str(address[0])
            with self.lock:
                crowded = self.per_peer.get(peer, 0) >= MAX_PER_PEER
                if not crowded:
                    self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
            if crowded or not self.slots.acquire(blocking=False):
                raw.close()  # refused before any byte is read
                if not crowded:
                    self._left(peer)
                continue
            threading.Thread(target=self._serve, args=(raw, peer), name="farm-bulk", daemon=True).start()

    def _left(self, peer: str) -> None:
        with self.lock:
            self.per_peer[peer] -= 1
            if not self.per_peer[peer]:
                del self.per_peer[peer]

    def _serve(self, raw: socket.socket, peer: str) -> None:
        with self.lock:
            self.connections.add(raw)
        try:
            raw.settimeout(IDLE_S)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self.context.wrap_socket(raw, server_side=True) if self.context else raw
            # A store of the connection's own: one SQLite connection shared by the connections' threads saw no job
            # submitted after the head started (Python 3.12 on the H200), where the data lanes' own stores did.
            store = Store(self.settings.state_dir / "state.db")
            try:
                with conn:
                    buffer = bytearray(CHUNK)
                    while self._one(conn, peer, buffer, store):
                        pass
            finally:
                store.close()
        except (OSError, ValueError):  # the peer went, stalled past IDLE_S, or spoke no TLS
            pass
        finally:
            with self.lock:
                self.connections.discard(raw)
            raw.close()
            self.slots.release()
            self._left(peer)

    def _one(self, conn: socket.socket, peer: str, buffer: bytearray, store: Store) -> bool:
        """One request served; False when the connection is to close (its end, or after an error)."""
        head = exactly(conn.recv_into, FRAME.size)
        if head is None:
            return False
        (size,) = FRAME.unpack(head)
        if size > REQUEST_MAX:
            conn.sendall(frame({"error": f"a request is at most {REQUEST_MAX} bytes", "missing": False}))
            return False
        body = exactly(conn.recv_into, size)
        if body is None:
            return False
        try:
            request = BulkRequest.model_validate_json(body)
            root, planned = self.data.dataset_at(peer, request.job_id, request.credential, store)
            fd = self.data.open_file(request.job_id, root, planned, request.path)
        except ValidationError:
            conn.sendall(frame({"error": "a request is a JSON object of job_id, credential, path, offset and "
                                         "length", "missing": False}))
            return False
        except FarmError as exc:
            conn.sendall(frame({"error": exc.message, "missing": isinstance(exc, NotFoundError)}))
            return False
        try:
            end = min(request.offset + request.length, os.fstat(fd).st_size)
            left = max(end - request.offset, 0)
            conn.sendall(frame({"size": left}))
            view, at = memoryview(buffer), request.offset
            while left:
                got = os.preadv(fd, [view[:min(CHUNK, left)]], at)
                if got <= 0:  # the file shrank since its size was read: the node sees a short read and fails it
                    return False
                conn.sendall(view[:got])
                at, left = at + got, left - got
        finally:
            os.close(fd)
        return True
