"""A shard's way back to the head: its table as Arrow IPC and its figures, or its failure, as protobuf, streamed over
the head's authenticated channel with the attempt's upload ticket (farm.core.tasks.ResultRoute).

Not Ray's return value: the head would have to deserialize an object the node made, and Ray unpickles one whose
metadata (which the node writes) says so, so code from any node would run inside the head. Ray only places and runs
the shard; its task returns None, which the head never reads. The ticket is the attempt's alone: job code, which runs
in this worker beside the entry point, can speak for its own shard and nothing more.

The table goes as the runner makes it, batch by batch: a gRPC thread drains a short queue into the stream, so the node
never holds a whole shard's outputs, and the head writes them to Parquet as they arrive.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any

import grpc
import pyarrow as pa

from farm.core.errors import AgentError, DataError, FarmError
from farm.core.tasks import (SHARD_FULL_TRACEBACK_ATTR, SHARD_LOG_ATTR, SHARD_ROWS_ATTR, SHARD_TRACEBACK_ATTR,
                             ResultRoute, ShardFigures)
from farm.data.locations.head import channel
from farm.proto.convert import figures_to_pb
from farm.proto.v1 import result_pb2, result_pb2_grpc
from farm_agent.work.capture import bounded

CHUNK = 1024 * 1024  # bytes of the table in one part (the head refuses larger messages)
DEPTH = 8  # parts waiting for the gRPC thread: the shard waits when the head takes them slower than it makes them
REPLY_S = 300.0  # how long the head may take to take the last part


class UploadFailed(AgentError):
    """The head did not take the shard's result (its ticket is void: the attempt was taken back; or the head is
    gone): the task ends with an error, which the head, if it still waits, counts as the node's failure."""


class Upload:
    """One attempt's upload, open from the shard's start: `write` its table's rows, then `finish` or `fail` once."""

    def __init__(self, route: ResultRoute) -> None:
        self.parts: queue.Queue[result_pb2.UploadPart | None] = queue.Queue(DEPTH)
        stub = result_pb2_grpc.ResultServiceStub(channel(route.address, route.ca_pem))
        self.call = stub.Upload.future(iter(self.parts.get, None),
                                       metadata=(("authorization", f"Bearer {route.ticket}"),))
        self.table = TableParts(self._send)

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        """The table's next rows."""
        self.table.write_table(table)

    def write_file(self, data: bytes) -> None:
        """A file instead of a table (a training checkpoint, as safetensors)."""
        for start in range(0, len(data), CHUNK):
            self._send(result_pb2.UploadPart(file=data[start:start + CHUNK]))

    def finish(self, figures: ShardFigures) -> None:
        self._end(result_pb2.UploadPart(figures=figures_to_pb(figures)))

    def fail(self, exc: BaseException) -> None:
        self._end(result_pb2.UploadPart(failure=failure_of(exc)))

    def _end(self, last: result_pb2.UploadPart) -> None:
        self.table.close()
        self._send(last)
        self._send(None)
        try:
            self.call.result(timeout=REPLY_S)
        except grpc.RpcError as exc:
            raise UploadFailed(f"the head did not take the result: {exc.code().name}: {exc.details()}") from None
        except grpc.FutureTimeoutError:
            self.call.cancel()
            raise UploadFailed(f"the head took no result within {REPLY_S:.0f} s") from None

    def _send(self, part: result_pb2.UploadPart | None) -> None:
        while True:
            if self.call.done():  # refused (a void ticket) or broken: nothing more goes through
                error = self.call.exception()
                raise UploadFailed("the head ended the upload" + (f": {error.code().name}: {error.details()}"
                                                                  if isinstance(error, grpc.RpcError) else ""))
            try:
                self.parts.put(part, timeout=1.0)
                return
            except queue.Full:
                continue


class TableParts:
    """A table's rows as upload parts: an Arrow IPC stream, cut into parts of CHUNK bytes as its batches are written
    (the last one shorter, at close): one part a batch made the head take a part, a thread's turn, for every few
    hundred kilobytes of a small model's outputs. A batch whose schema differs from the last one's (JSON's inferred
    types) starts a new IPC stream; the head widens its file to both."""

    closed = False  # as a file, the IPC writer's sink

    def __init__(self, send: Callable[[result_pb2.UploadPart], None]) -> None:
        self.send = send
        self.buffer = bytearray()
        self.writer: pa.ipc.RecordBatchStreamWriter | None = None
        self.schema: pa.Schema | None = None

    def write_table(self, table: pa.Table | pa.RecordBatch) -> None:
        if self.writer is not None and table.schema != self.schema:
            self.writer.close()
            self.writer = None
        if self.writer is None:
            self.writer, self.schema = pa.ipc.new_stream(self, table.schema), table.schema
        self.writer.write(table)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.flush()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.buffer += view
        while len(self.buffer) >= CHUNK:
            self.send(result_pb2.UploadPart(table=bytes(self.buffer[:CHUNK])))
            del self.buffer[:CHUNK]
        return view.nbytes

    def flush(self) -> None:
        if self.buffer:
            self.send(result_pb2.UploadPart(table=bytes(self.buffer)))
            self.buffer.clear()


def failure_of(exc: BaseException) -> result_pb2.ShardFailure:
    """A failed shard's exception as the head sorts it: a malformed input fails its shard, the agent's own failure
    is the node's (the shard runs again), anything else is the job's."""
    # SystemExit is most often Ray ending the worker (its raylet gone, the node stopping: `SystemExit: 1` failed the
    # chaos test's job after a head kill); a job's own sys.exit fails its shard the same way each try, so it still
    # fails the job, after the retries.
    node = isinstance(exc, (AgentError, SystemExit))
    kind = (result_pb2.ShardFailure.DATA if isinstance(exc, DataError)
            else result_pb2.ShardFailure.NODE if node else result_pb2.ShardFailure.JOB)
    text = str(exc).strip()
    message = exc.message if isinstance(exc, FarmError) else \
        f"{type(exc).__name__}: {text.splitlines()[0] if text else type(exc).__name__}"
    rows = getattr(exc, SHARD_ROWS_ATTR, "")  # a model's exception: where in its shard
    message = f"{rows}: {message}" if rows else message
    full = "".join(traceback.format_exception(exc))
    trace = getattr(exc, SHARD_TRACEBACK_ATTR, "") or full
    bad_start, bad_stop = exc.rows if isinstance(exc, DataError) and exc.rows else (0, 0)
    return result_pb2.ShardFailure(kind=kind, message=bounded(message), traceback=bounded(str(trace)),
                                   log=bounded(str(getattr(exc, SHARD_LOG_ATTR, ""))), bad_start=bad_start,
                                   bad_stop=bad_stop,
                                   farm_traceback=bounded(str(getattr(exc, SHARD_FULL_TRACEBACK_ATTR, "") or full)))


def send(route: ResultRoute, work: Callable[[Upload], ShardFigures | Callable[[], ShardFigures]]
         ) -> ShardFigures | Finishing | None:
    """Run a shard's `work` (it writes its table to the upload and returns its figures) and send its result, or its
    failure, to the head; its figures (None: it failed). Raises only where the head did not take it. A `work` that
    returns a function of its figures (they hold energy its meter finds after the shard: farm_agent.power) is
    finished in a thread: the Finishing returned says when, and its worker starts its next shard meanwhile."""
    upload = Upload(route)
    try:
        measured = work(upload)
    except UploadFailed:
        raise
    except (Exception, SystemExit) as exc:  # the job's code may call sys.exit
        upload.fail(exc)
        return None
    if callable(measured):
        return Finishing(upload, measured)
    upload.finish(measured)
    return measured


class Finishing:
    """A shard's result finishing in a thread: its figures made, then sent (the upload's last part and the head's
    answer). `wait()` gives why it could not, or "", and its figures."""

    def __init__(self, upload: Upload, measured: Callable[[], ShardFigures]) -> None:
        self.upload, self.measured = upload, measured
        self.reason = ""
        self.figures: ShardFigures | None = None
        self.thread = threading.Thread(target=self._finish, name="farm-finish")  # not a daemon: the worker waits
        self.thread.start()

    def _finish(self) -> None:
        try:
            self.figures = self.measured()
            self.upload.finish(self.figures)
        except FarmError as exc:
            self.reason = exc.message
        except Exception as exc:  # noqa: BLE001 - said to the head as why the attempt ended
            self.reason = f"{type(exc).__name__}: {exc}"[:2000]

    def wait(self) -> tuple[str, ShardFigures | None]:
        self.thread.join()
        return self.reason, self.figures


def figures(result: Any, **metrics: float) -> ShardFigures:
    """A node-side result's figures (ShardResult, EvaluateResult, KernelEvalShardResult), with the kind's own."""
    return ShardFigures(items=result.items, seconds=result.seconds, correct=result.correct, energy=result.energy,
                        peak_memory_bytes=result.peak_memory_bytes, log=result.log, metrics=metrics,
                        tuning=getattr(result, "tuning", None))
