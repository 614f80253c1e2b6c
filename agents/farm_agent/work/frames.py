"""Length-prefixed protobuf frames between an agent and its workers, over a Unix socket pair: the agent sends
Assignments, a worker sends WorkReports. A frame is a 4-byte big-endian length, then the message; either side refuses
a frame over its bound (the worker runs job code, which can write to its end)."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from farm.core.errors import AgentError

M = TypeVar("M", bound=Message)
HEADER = struct.Struct(">I")
MAX_ASSIGNMENT = 32 * 1024 * 1024  # a task names its rows and files; its CA is a few KiB
MAX_REPORT = 64 * 1024  # a ticket and a line of text


def pack(message: Message) -> bytes:
    data = message.SerializeToString()
    return HEADER.pack(len(data)) + data


def parse(kind: type[M], data: bytes) -> M:
    message = kind()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise AgentError(f"a malformed {kind.__name__} frame: {exc}") from None
    return message


def recv(sock: socket.socket, kind: type[M], limit: int) -> M | None:
    """The next frame from a blocking socket (the worker's side); None once the other side closed."""
    header = _recv_exactly(sock, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > limit:
        raise AgentError(f"a frame of {size:,} bytes (at most {limit:,})")
    data = _recv_exactly(sock, size)
    if data is None:
        return None
    return parse(kind, data)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


async def read(reader: asyncio.StreamReader, kind: type[M], limit: int) -> M | None:
    """The next frame from a stream (the agent's side); None once the other side closed."""
    try:
        (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        if size > limit:
            raise AgentError(f"a frame of {size:,} bytes (at most {limit:,})")
        return parse(kind, await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
