"""The shard runner's read-ahead: the same batches in the same order, a reader's error raised to the consumer with
its message, and its thread stopped (and the source closed) when the consumer stops early."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from farm.core.errors import DataError
from farm_agent.work.prefetch import prefetch


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "farm-prefetch"]


def test_yields_every_item_in_order() -> None:
    assert list(prefetch(iter(range(1000)), depth=2)) == list(range(1000))
    assert list(prefetch(iter([]))) == []
    assert _readers() == []


def test_a_reader_error_reaches_the_consumer_after_the_items_before_it() -> None:
    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise DataError("rows.npy: row 3 does not decode")

    stream = prefetch(source())
    assert next(stream) == 1 and next(stream) == 2
    with pytest.raises(DataError, match=r"^rows\.npy: row 3 does not decode$"):
        next(stream)
    assert _readers() == []


def test_an_early_stop_ends_the_thread_and_closes_the_source() -> None:
    closed = threading.Event()
    read = []

    def source() -> Iterator[int]:
        try:
            for i in range(10**9):
                read.append(i)
                yield i
        finally:
            closed.set()

    held = source()  # held here, so that only prefetch's close (not garbage collection) can close it
    stream = prefetch(held, depth=2)
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.close()  # type: ignore[attr-defined]
    assert closed.is_set() and _readers() == []
    assert len(read) <= 3 + 2 + 1  # bounded: what was consumed, the queue, the item in hand
