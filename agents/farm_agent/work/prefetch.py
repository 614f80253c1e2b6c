"""A shard's batches read ahead in a thread, so that the node reads and decodes the next batches while the device
runs the current one: a shard then takes about max(read, compute) rather than their sum. Hand-written rather than
torch's DataLoader, whose workers are processes that would copy each batch and re-open the job's dataset."""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import TypeVar

T = TypeVar("T")

DEPTH = 3  # batches read ahead: enough to ride out one slow block from the head, memory a few batches
_DONE = object()


def prefetch(items: Iterator[T], depth: int = DEPTH) -> Generator[T]:
    """`items` in order, read by a background thread at most `depth` ahead of the consumer. An error raised while
    reading is raised here, the same exception, when the consumer reaches it. When the consumer stops early (close(),
    an error of its own, or garbage collection), the thread stops after the item it is reading and closes `items`."""
    ready: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[object, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.05)  # wakes to see `stop` when the consumer has gone
                return True
            except queue.Full:
                continue
        return False

    def fill() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_DONE, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            put((None, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=fill, name="farm-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()
