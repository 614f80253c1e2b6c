"""A shard's batches read ahead in a thread, so that the node reads and decodes the next batches while the device
runs the current one: a shard then takes about max(read, compute) rather than their sum. Hand-written rather than
torch's DataLoader, whose workers are processes that would copy each batch and re-open the job's dataset.

The next shard's first batches are read ahead too (ReadAhead): a worker is sent its next shard while one runs, and on
the H100 a Parquet shard's first batch (a whole row group decoded) took longer than the shard's model."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
F = TypeVar("F")

DEPTH = 3  # batches read ahead: enough to ride out one slow block from the head, memory a few batches
_DONE = object()


class Prefetch(Generic[T]):
    """`items` in order, read by a background thread, started at once, at most `depth` ahead of the consumer. An
    error raised while reading is raised here, the same exception, when the consumer reaches it. close() (which an
    owner must call, whether it read all or none) stops the thread after the item it is reading and closes
    `items`."""

    def __init__(self, items: Iterator[T], depth: int = DEPTH) -> None:
        self._items = items
        self._ready: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._fill, name="farm-prefetch", daemon=True)
        self._thread.start()

    def _put(self, entry: tuple[object, BaseException | None]) -> bool:
        while not self._stop.is_set():
            try:
                self._ready.put(entry, timeout=0.05)  # wakes to see `stop` when the consumer has gone
                return True
            except queue.Full:
                continue
        return False

    def _fill(self) -> None:
        try:
            for item in self._items:
                if not self._put((item, None)):
                    return
            self._put((_DONE, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            self._put((None, exc))
        finally:
            close = getattr(self._items, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Prefetch[T]:
        return self

    def __next__(self) -> T:
        if self._ended:
            raise StopIteration
        item, error = self._ready.get()
        if error is not None:
            self._ended = True
            raise error
        if item is _DONE:
            self._ended = True
            raise StopIteration
        return item  # type: ignore[return-value]

    def close(self) -> None:
        self._ended = True
        self._stop.set()
        self._thread.join()


AHEAD_DEPTH = 1  # the next shard's batches read before it starts: its first is what it would wait on (a Parquet
# row group decoded whole); more would take the decoders from the shard that runs meanwhile


class ReadAhead(Generic[T, F]):
    """One attempt's items (T), read from before it starts: a worker's next shard, while the one before it runs. At
    most one is held; a take for another attempt closes it (the held one was cancelled or reassigned). Each with
    what its reader found before it began (F: for a dataset, the way it reaches it), for the attempt to report. A
    kind that reads ahead keeps its own (the inference kind's: one shard runs at a time in a worker)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: tuple[str, Prefetch[T], F] | None = None

    def start(self, ticket: str, items: Iterator[T], found: F) -> None:
        started = Prefetch(items, AHEAD_DEPTH)
        with self._lock:
            stale, self._held = self._held, (ticket, started, found)
        if stale is not None:
            stale[1].close()

    def take(self, ticket: str) -> tuple[Prefetch[T], F] | None:
        """The batches read ahead for `ticket`'s attempt, now the caller's to close, and what their reader found;
        None where there are none."""
        with self._lock:
            held, self._held = self._held, None
        if held is None:
            return None
        if held[0] == ticket:
            return held[1], held[2]
        held[1].close()
        return None


SEND_DEPTH = 2  # batches of outputs waiting for their sending: memory two batches' outputs


class Sender(Generic[T]):
    """`send(item)` for each item put, in order, on a thread of its own, at most `depth` waiting: the model goes on
    with the next batch while the last one's outputs are made a table and streamed to the head (Arrow IPC and
    protobuf copies that held the GIL in the model's thread: 6-18 % of an image shard's window on an H100). The first
    error `send` raises is raised by the next put() or by close(); items after it are dropped. close() waits for
    everything put to be sent. As a context manager it is stopped on leaving (a failed shard's: what it had not sent
    goes with the shard)."""

    def __init__(self, send: Callable[[T], None], depth: int = SEND_DEPTH) -> None:
        self._send = send
        self._waiting: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="farm-send", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while (item := self._waiting.get()) is not _DONE:
            if self._error is None:
                try:
                    self._send(item)  # type: ignore[arg-type]
                except BaseException as exc:  # noqa: BLE001 - raised in the model's thread by put or close
                    self._error = exc

    def put(self, item: T) -> None:
        if self._error is not None:
            raise self._error
        self._waiting.put(item)

    def close(self) -> None:
        """Everything put sent; the first error of a send raised."""
        self.stop()
        if self._error is not None:
            raise self._error

    def __enter__(self) -> Sender[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._waiting.put(_DONE)
            self._thread.join()
