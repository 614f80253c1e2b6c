"""A shard's result as it arrives from its node (farm_agent.work.upload): the table's Arrow IPC stream written to a
Parquet file as its parts come in (a staged file, hidden, beside the shard's final one: nothing holds the whole
table), then its figures or its failure, last. Arrow's IPC reader and protobuf are the only readers of a node's bytes
here: nothing a node sends is unpickled.

pyarrow's IPC stream reader reads from a pipe fed by the event loop (a short queue: the node waits when the disk
is slower than the network); a thread drains it into pyarrow's ParquetWriter. Hand-written: the pipe is the one
piece neither gRPC nor pyarrow offers (an async iterator of chunks as a blocking file).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from farm.core.errors import FarmError
from farm.core.tasks import ShardFigures
from farm.head.outcomes import Failure
from farm.proto.convert import figures_from_pb
from farm.proto.v1 import result_pb2

DEPTH = 8  # parts between the event loop and the writing thread
MAX_MESSAGE = 4 * 1024  # what the head keeps of a failure's one line from a node
# Arrow's IPC reader holds a whole message (a batch) before it yields it: a batch over this is refused as its size is
# read, before its body is. A runner's batch of outputs is far smaller (a node sends each batch as it is made).
MAX_IPC_MESSAGE = 256 * 1024 * 1024
# What a shard's table may take per row of its range, on average, and over that: its upload is refused once past
# range x this (a node once sent 8 billion rows for a range of thousands, each written before any check).
MAX_ROW_BYTES = 4 * 1024 * 1024
# A shard's table is written in row groups of about this many bytes, not one a node's batch: a million rows of 16
# floats came in 252 batches of 4,096, and stage() took 0.95-1.11 s writing a row group each, 0.47-0.53 s writing 9
# (the 2-core dev box, two runs each). Held in memory while it fills, once per upload; no larger, because what is
# held when the last part comes is written before the head counts the node's device free.
ROW_GROUP_BYTES = 8 * 1024 * 1024
HELD_BATCHES = 1024  # and at most this many batches: a node's one-row batches would hold a million tables
SLACK_BYTES = 64 * 1024 * 1024  # schemas, stream headers, Arrow's padding


class Staging(type(Path())):  # type: ignore[misc]
    """A staged file's path that also knows the most rows its shard's range takes (a kind's `staging` makes one)."""

    max_rows: int | None = None


def bounded(path: Path, max_rows: int) -> Path:
    """`path`, for a shard whose range takes at most `max_rows` rows (rows, or bytes of lines: a line has one)."""
    staging = Staging(path)
    staging.max_rows = max(max_rows, 0)
    return staging


def max_rows(staging: Path | None) -> int | None:
    return getattr(staging, "max_rows", None)


class BadUpload(FarmError):
    """An upload no shard's entry point sends: out of order, a table that is not Arrow IPC, figures out of range."""


class Cut(BadUpload):
    """An upload that stopped before its last part: its sender went away (its worker died, most likely)."""


class Void(FarmError):
    """The attempt was taken back (its node lost, its job ended) while its result arrived."""

    grpc_status = "FAILED_PRECONDITION"


@dataclass(frozen=True)
class Staged:
    """A shard's table as it arrived, a Parquet file beside the shard's final one, until it is committed (or the file
    it sent instead, `rows` 0)."""

    path: Path
    rows: int

    def column(self, name: str) -> pa.ChunkedArray | None:
        if name not in pq.read_schema(self.path).names:
            return None
        return pq.read_table(self.path, columns=[name]).column(name)

    def table(self) -> pa.Table:
        return pq.read_table(self.path)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Arrival:
    """One attempt's upload, whole: its figures and its table (where it sent one), or its failure."""

    figures: ShardFigures | None = None
    table: Staged | None = None
    failure: Failure | None = None
    log: str = ""  # a failure's: what the shard printed
    traceback: str = ""

    def discard(self) -> None:
        if self.table is not None:
            self.table.discard()


def figures(arrival: Arrival) -> ShardFigures:
    """A successful arrival's figures (a failure never reaches a kind's handler)."""
    assert arrival.figures is not None
    return arrival.figures


def failure_from_pb(msg: result_pb2.ShardFailure) -> Arrival:
    """A node's failure as the head sorts every failure (farm.head.outcomes): the job's, its data's, or the node's."""
    line = (msg.message.strip().splitlines() or [""])[0][:MAX_MESSAGE] or "the shard failed (no message)"
    kind = result_pb2.ShardFailure.Kind
    data = msg.kind == kind.DATA
    bad = (msg.bad_start, msg.bad_stop) if data and msg.bad_stop > msg.bad_start else None  # checked at its shard
    return Arrival(failure=Failure(node=msg.kind == kind.NODE, message=line, data=data, bad_rows=bad,
                                   farm_trace=msg.farm_traceback),
                   log=msg.log, traceback=msg.traceback)


async def receive(parts: AsyncIterator[result_pb2.UploadPart], staging: Path | None,
                  wanted: Callable[[], bool]) -> Arrival:
    """Read one upload to its end: its table (if any) staged at `staging` (a file made for it; None: the kind sends
    none), then its last part; `staging` is removed where no table is kept. `wanted`: whether the attempt is still
    the shard's (checked at every part; Void once it is not)."""
    pipe: Pipe | None = None
    writing: asyncio.Future[tuple[Path, int]] | None = None
    file: IO[bytes] | None = None  # a file's bytes instead of a table (a training checkpoint)
    last: result_pb2.UploadPart | None = None
    rows_cap = max_rows(staging)
    bytes_cap = None if rows_cap is None else rows_cap * MAX_ROW_BYTES + SLACK_BYTES
    received = 0
    try:
        async for part in parts:
            if not wanted():
                raise Void("the attempt was taken back while its result arrived")
            which = part.WhichOneof("part")
            if last is not None or which is None:
                raise BadUpload("its upload has parts after its last one, or an empty part")
            if which in ("table", "file") and (staging is None or (file if which == "table" else pipe)):
                raise BadUpload(f"its upload carries a {which} where none is taken")
            if which == "file":
                assert staging is not None
                if file is None:
                    file = await asyncio.to_thread(staging.open, "wb")
                await asyncio.to_thread(file.write, part.file)
            elif which == "table":
                assert staging is not None
                received += len(part.table)
                if bytes_cap is not None and received > bytes_cap:
                    raise BadUpload(f"its table is over {bytes_cap // 2**20} MiB, more than its range of "
                                    f"{rows_cap} rows takes")
                if pipe is None:
                    pipe = Pipe(min(MAX_IPC_MESSAGE, bytes_cap or MAX_IPC_MESSAGE))
                    writing = asyncio.ensure_future(asyncio.to_thread(stage, pipe, staging, rows_cap))
                await asyncio.to_thread(pipe.put, part.table)
            else:
                last = part
        if last is None:
            raise Cut("its upload ended without its figures or its failure")
        staged = None
        if pipe is not None and writing is not None:
            await asyncio.to_thread(pipe.put, None)
            path, rows = await writing
            staged = Staged(path, rows)
        elif file is not None and staging is not None:
            await asyncio.to_thread(_close, file)
            file = None
            staged = Staged(staging, 0)
        elif staging is not None:  # no table came: the place kept for it goes
            staging.unlink(missing_ok=True)
        if last.WhichOneof("part") == "failure":
            if staged is not None:
                staged.discard()
            return failure_from_pb(last.failure)
        try:
            return Arrival(figures=figures_from_pb(last.figures), table=staged)
        except FarmError:
            if staged is not None:
                staged.discard()
            raise
    except BaseException as error:
        reason = error  # what went wrong; the writer's own reason, if it has one, wins (below)
        if file is not None:
            file.close()
        if pipe is not None and writing is not None:
            pipe.abort()
            try:
                await writing
            except BadUpload as refused:  # the writer's reason (past its range) over the reader's (it stopped)
                reason = refused
            except Exception:
                pass
        if staging is not None:
            _remove_staged(staging)
        if isinstance(reason, BadUpload):
            raise reason from None
        if isinstance(reason, (pa.ArrowException, ValueError, OSError)) and not isinstance(reason, FarmError):
            raise BadUpload(f"its table is not an Arrow IPC stream the head can write: {reason}") from None
        raise


def _close(file: IO[bytes]) -> None:
    file.flush()
    os.fsync(file.fileno())
    file.close()


def _remove_staged(staging: Path) -> None:
    for path in (staging, widened(staging)):
        path.unlink(missing_ok=True)


class Pipe:
    """Chunks put by the event loop, read as a blocking file by pyarrow's IPC reader in a thread."""

    closed = False

    def __init__(self, max_message: int = MAX_IPC_MESSAGE) -> None:
        self.max_message = max_message
        self.chunks: queue.Queue[bytes | None] = queue.Queue(DEPTH)
        self.rest = memoryview(b"")
        self.ended = False
        self.aborted = threading.Event()  # the reader failed or the upload was dropped: puts stop waiting

    def put(self, chunk: bytes | None) -> None:
        """The next chunk; None: the end."""
        while not self.aborted.is_set():
            try:
                self.chunks.put(chunk, timeout=0.5)
                return
            except queue.Full:
                continue
        raise BadUpload("the head stopped reading its table")

    def abort(self) -> None:
        self.aborted.set()
        try:
            self.chunks.put_nowait(None)  # a reader waiting for a chunk stops
        except queue.Full:
            pass

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, size: int = -1) -> bytes:
        """Exactly `size` bytes unless the stream ends first (Arrow's reader takes a short read as a broken stream).
        Arrow reads a message's body in one read of its size, as the message's header gives it: a size over the
        cap is refused here, before any of the body is held."""
        if size < 0 or size > self.max_message:
            raise BadUpload(f"its table is not an Arrow IPC stream the head takes: a message of {size} bytes "
                            f"(at most {self.max_message})")
        out = bytearray()
        while (size < 0 or len(out) < size) and self._fill():
            take = len(self.rest) if size < 0 else min(size - len(out), len(self.rest))
            out += self.rest[:take]
            self.rest = self.rest[take:]
        return bytes(out)

    def at_end(self) -> bool:
        return not self._fill()

    def _fill(self) -> bool:
        if len(self.rest):
            return True
        if self.ended:
            return False
        chunk = self.chunks.get()
        if chunk is None or self.aborted.is_set():
            self.ended = True
            return False
        self.rest = memoryview(chunk)
        return True


def widened(path: Path) -> Path:
    return path.with_name(path.name + "w")


def stage(pipe: Pipe, path: Path, max_rows: int | None = None) -> tuple[Path, int]:
    """Write the IPC stream(s) from `pipe` to a Parquet file at `path` (or beside it, where a later stream's schema
    widened the file's); the file and its rows. A node starts a new stream where a batch's inferred types differ
    from the last one's (an integer column in one JSON batch, a float one in the next): the file is widened to
    both, as farm.data.batches.concat widens a shard's tables. `max_rows`: the first batch past it is refused, before
    it is written."""
    writer: pq.ParquetWriter | None = None
    schema = pa.schema([])
    rows = 0
    held: list[pa.Table] = []  # batches not written yet, conformed to the writer's schema: one row group to be
    held_bytes = 0

    def write_held() -> None:
        nonlocal held_bytes
        if writer is not None and held:
            writer.write_table(pa.concat_tables(held))
            held.clear()
            held_bytes = 0

    try:
        while not pipe.at_end():
            with pa.ipc.open_stream(pipe) as reader:
                schema = reader.schema
                for batch in reader:
                    if max_rows is not None and rows + batch.num_rows > max_rows:
                        raise BadUpload(f"its table holds more than the {max_rows} rows of its range")
                    if writer is None:
                        writer = parquet_writer(path, batch.schema)
                    elif batch.schema != writer.schema:
                        write_held()  # in the file before it is read back to be widened
                        writer, path = _widen(writer, path, batch.schema)
                    table = pa.Table.from_batches([batch])
                    held.append(_conform(table, writer.schema) if table.schema != writer.schema else table)
                    held_bytes += batch.nbytes
                    rows += batch.num_rows
                    if held_bytes >= ROW_GROUP_BYTES or len(held) >= HELD_BATCHES:
                        write_held()
        write_held()
    except BaseException:
        pipe.abort()
        raise
    finally:
        if writer is not None:
            writer.close()
    if writer is None:  # streams with no batch: an empty table
        pq.write_table(schema.empty_table(), path)
    _fsync(path)
    return path, rows


def parquet_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    """A writer that dictionary-encodes text and binary columns only: a model's float outputs and the row ids rarely
    repeat, and trying their dictionaries first made staging a million rows of 16 floats take 0.47-0.49 s instead of
    0.30 s (the 2-core dev box; benchmarks/stage_outputs.py)."""
    text = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type) or pa.types.is_dictionary(f.type)]
    return pq.ParquetWriter(path, schema, use_dictionary=text)


def _widen(writer: pq.ParquetWriter, path: Path, schema: pa.Schema) -> tuple[pq.ParquetWriter, Path]:
    """The file so far rewritten with a schema that holds both its own and `schema`; the writer to go on with."""
    writer.close()
    written = pq.read_table(path)
    wider = pa.unify_schemas([written.schema, schema], promote_options="permissive")
    target = widened(path) if not path.name.endswith("w") else path.with_name(path.name[:-1])
    wide = parquet_writer(target, wider)
    wide.write_table(_conform(written, wider))
    path.unlink(missing_ok=True)
    return wide, target


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return pa.concat_tables([schema.empty_table(), table], promote_options="permissive").select(
        schema.names).cast(schema)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
