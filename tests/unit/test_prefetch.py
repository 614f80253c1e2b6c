"""The shard runner's read-ahead: the same batches in the same order, a reader's error raised to the consumer with
its message, and its thread stopped (and the source closed) when the consumer stops early; and the next attempt's
batches, read while the one before it runs, handed to that attempt only."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import closing

import pytest

from farm.core.errors import DataError
from farm_agent.work.prefetch import AHEAD_DEPTH, Prefetch, ReadAhead


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "farm-prefetch"]


def test_yields_every_item_in_order() -> None:
    with closing(Prefetch(iter(range(1000)), depth=2)) as stream:
        assert list(stream) == list(range(1000))
    with closing(Prefetch(iter([]))) as stream:
        assert list(stream) == []
    assert _readers() == []


def test_a_reader_error_reaches_the_consumer_after_the_items_before_it() -> None:
    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise DataError("rows.npy: row 3 does not decode")

    with closing(Prefetch(source())) as stream:
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

    held = source()  # held here, so that only the reader's close (not garbage collection) can close it
    stream = Prefetch(held, depth=2)
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.close()
    assert closed.is_set() and _readers() == []
    assert len(read) <= 3 + 2 + 1  # bounded: what was consumed, the queue, the item in hand


def _source(read: list[int], closed: threading.Event, count: int = 10**9) -> Iterator[int]:
    try:
        for i in range(count):
            read.append(i)
            yield i
    finally:
        closed.set()


def test_the_next_attempts_batches_are_read_before_it_starts_and_handed_to_it_once() -> None:
    ahead, read, closed = ReadAhead(), [], threading.Event()
    ahead.start("t-2", _source(read, closed, count=5), found="the way its reader reached the data")
    deadline = time.monotonic() + 10
    while len(read) < AHEAD_DEPTH + 1 and time.monotonic() < deadline:  # read while the attempt before it runs
        time.sleep(0.01)
    time.sleep(0.2)
    assert read == list(range(AHEAD_DEPTH + 1))  # the queue's and the one in hand: no more before it starts
    held = ahead.take("t-2")
    assert held is not None and held[1] == "the way its reader reached the data"
    taken = held[0]
    assert list(taken) == [0, 1, 2, 3, 4]
    taken.close()
    assert ahead.take("t-2") is None and closed.is_set() and _readers() == []  # handed over once


def test_batches_read_for_another_attempt_are_closed_not_handed_over() -> None:
    ahead = ReadAhead()
    read_1, closed_1 = [], threading.Event()
    read_2, closed_2 = [], threading.Event()
    ahead.start("t-1", _source(read_1, closed_1), None)
    ahead.start("t-2", _source(read_2, closed_2), None)  # t-1 was never run (cancelled): its reader stops
    assert closed_1.is_set() and len(read_1) <= AHEAD_DEPTH + 2
    assert ahead.take("t-3") is None  # not the attempt read for: nothing, and t-2's reader stops
    assert closed_2.is_set() and _readers() == []
