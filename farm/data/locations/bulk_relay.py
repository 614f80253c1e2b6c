"""A node's relay to the head's bulk port (farm.head.bulk): a small process of its own, started by the node's
BulkReader (farm.data.locations.head) and run as `python -I -S bulk_relay.py`, the standard library only.

Why a process: Python's ssl decrypts one TLS record (16 KiB at most) a call, the GIL taken back after each, so the
threads of one process that read several connections share one GIL ~60,000 times a second a GB/s. On an H100 host a
job's in-order reads of one 2 GiB file came at 1.17-1.49 GB/s on 1-8 connections that way, the node at 1.5 cores
(benchmarks/gpu/data_streams_h200.sh). A relay holds one TLS connection to the head, decrypts on a core of its own,
and writes the plain bytes into a pipe, which the node's thread reads in pieces of up to a MiB (the pipe's size) with
the GIL released: 2.86 GB/s through 8 relays, the same call.

Its words on stdin, from the node: first a frame {"host", "port", "ca_pem"} (the head's CA: "" for a head without
TLS); then each request a frame: the JSON the head's bulk port takes, passed on as it is. Its words on stdout, to the
node, for each request: a frame {"size": N} followed by N bytes; or the head's refusal {"error", "missing"}; or
{"failed": why, "unreachable": bool} where the head could not be reached or the connection failed before the reply.
Where the connection fails inside the N bytes, the relay exits: the node sees its pipe end early. A frame is a 4-byte
length, then JSON. It ends at its stdin's end.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import ssl
import struct
import sys

FRAME = struct.Struct("!I")
FRAME_MAX = 64 * 1024  # a request or a reply's JSON (a request: a job id, a credential and a path)
CHUNK = 1024 * 1024  # bytes received from the head and written to the node at a time
CONNECT_S = 10.0  # a bulk port that does not answer by then is taken as closed to this node
IO_S = 300.0


def exactly(recv_into, size: int) -> bytearray | None:
    """`size` bytes through `recv_into` (a socket's, or a file's readinto), or None where it ends first."""
    held = bytearray(size)
    view, got = memoryview(held), 0
    while got < size:
        n = recv_into(view[got:])
        if not n:
            return None
        got += n
    return held


def frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return FRAME.pack(len(body)) + body


def read_frame(recv_into) -> dict | None:
    """A frame's JSON object; None at the stream's end; ValueError where it is not one."""
    head = exactly(recv_into, FRAME.size)
    if head is None:
        return None
    (size,) = FRAME.unpack(head)
    if size > FRAME_MAX:
        raise ValueError(f"a frame of {size} bytes")
    body = exactly(recv_into, size)
    if body is None:
        return None
    obj = json.loads(body)
    if not isinstance(obj, dict):
        raise ValueError("a frame that is not a JSON object")
    return obj


class Relay:
    """One TLS connection to the head's bulk port, made at the first request and kept between them; what it
    receives is written to `out`, the node's pipe."""

    def __init__(self, host: str, port: int, ca_pem: str, out: int) -> None:
        self.address = (host, port)
        self.context = ssl.create_default_context(cadata=ca_pem) if ca_pem else None
        self.out = out
        self.conn: socket.socket | None = None
        self.buffer = memoryview(bytearray(CHUNK))

    def tell(self, obj: dict) -> None:
        write_all(self.out, frame(obj))

    def _connect(self) -> socket.socket:
        raw = socket.create_connection(self.address, timeout=CONNECT_S)
        raw.settimeout(IO_S)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.context is None:
            return raw
        return self.context.wrap_socket(raw, server_hostname=self.address[0])

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def serve(self, request: dict) -> None:
        """One request: the head's reply told, then its bytes passed on (or the process exits where they stop)."""
        length = request.get("length")
        if not isinstance(length, int) or length < 0:
            self.tell({"failed": "a request without its length", "unreachable": False})
            return
        reply = self._ask(json.dumps(request).encode())
        if reply is None or self.conn is None:
            return
        if "error" in reply:  # the head closes the connection after saying why
            self._drop()
            self.tell({"error": str(reply["error"]), "missing": bool(reply.get("missing"))})
            return
        size = reply.get("size")
        if not isinstance(size, int) or not 0 <= size <= length:
            self._drop()
            self.tell({"failed": f"the head's bulk port replied {reply!r} to a read of {length} bytes",
                       "unreachable": False})
            return
        self.tell({"size": size})
        left = size
        while left:
            n = self.conn.recv_into(self.buffer[:min(CHUNK, left)])
            if not n:
                raise ConnectionError("the head closed the connection inside a reply")
            write_all(self.out, self.buffer[:n])
            left -= n

    def _ask(self, body: bytes) -> dict | None:
        """The head's reply to a request; None where it could not be had (the node told why). A kept connection the
        head closed (idle past its limit) is made once more."""
        for attempt in (0, 1):
            kept = self.conn is not None
            if self.conn is None:
                try:
                    self.conn = self._connect()
                except OSError as exc:
                    self.tell({"failed": f"the head's bulk port {self.address[0]}:{self.address[1]}: {exc}",
                               "unreachable": True})
                    return None
            try:
                self.conn.sendall(FRAME.pack(len(body)) + body)
                reply = read_frame(self.conn.recv_into)
                if reply is None:
                    raise ConnectionError("the head closed the connection")
                return reply
            except (OSError, ValueError) as exc:
                self._drop()
                if not (kept and attempt == 0):
                    self.tell({"failed": f"the head's bulk port: {exc}", "unreachable": False})
                    return None
        return None


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def main() -> int:
    stdin, out = os.fdopen(0, "rb", buffering=0), 1
    if hasattr(fcntl, "F_SETPIPE_SZ"):  # a MiB a pipe read on the node's side (Linux; the default is 64 KiB)
        try:
            fcntl.fcntl(out, fcntl.F_SETPIPE_SZ, CHUNK)
        except OSError:  # a lower system limit: the default stands
            pass
    try:
        start = read_frame(stdin.readinto)
        if start is None:
            return 0
        relay = Relay(str(start["host"]), int(start["port"]), str(start.get("ca_pem") or ""), out)
        while (request := read_frame(stdin.readinto)) is not None:
            relay.serve(request)
    except (OSError, ValueError, KeyError) as exc:  # the node went, or the head's connection failed mid-reply
        print(f"farm bulk relay: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
