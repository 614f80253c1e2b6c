"""The surroundings every job's shard runs in: the job's requirements importable (farm_agent.work.environment), and what
the shard printed and why it failed — its stdout and stderr (as they interleaved, bounded) and its full traceback —
sent to the head with its result or its error, so that `farm logs` shows them.

The shard runners wrap themselves in one line, `@job_shard`; a training worker, a Ray actor that lives for the
whole job, wraps each of its methods in `@worker_call` and hands over what it printed with each stretch's result
(`take_output`). Python-level streams only (sys.stdout, sys.stderr, which
print(), logging's default handler and warnings write to): a Ray worker's file descriptors belong to Ray, which sends
them to the node's worker log, and everything still reaches that log because the capture writes through to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

from farm.core.tasks import SHARD_LOG_ATTR, SHARD_TRACEBACK_ATTR
from farm_agent.work import memory
from farm_agent.work.environment import prepare_from_environment

# Kept of a shard's output: its first and last KEEP_BYTES each (the start says what it set out to do, the end what
# went wrong), with a line saying how much was dropped in between.
KEEP_BYTES = 32 * 1024

P = ParamSpec("P")
R = TypeVar("R")


class BoundedText:
    """Text kept as its first and last `keep` characters, with a count of what was dropped between them. The tail is
    a queue of the writes, trimmed whole from the front: a shard printing a million short lines costs a million
    appends, not a million copies of the tail."""

    def __init__(self, keep: int = KEEP_BYTES) -> None:
        self.keep = keep
        self.head: list[str] = []
        self.head_len = 0
        self.tail: deque[str] = deque()
        self.tail_len = 0
        self.dropped = 0
        self.lock = threading.Lock()  # a model's threads may print at once

    def write(self, text: str) -> None:
        with self.lock:
            if self.head_len < self.keep:
                taken = text[: self.keep - self.head_len]
                self.head.append(taken)
                self.head_len += len(taken)
                text = text[len(taken):]
            if text:
                self.tail.append(text)
                self.tail_len += len(text)
                while self.tail_len - len(self.tail[0]) >= self.keep:  # the rest still holds `keep`
                    dropped = self.tail.popleft()
                    self.tail_len -= len(dropped)
                    self.dropped += len(dropped)

    def getvalue(self) -> str:
        with self.lock:
            tail = "".join(self.tail)
            extra = max(len(tail) - self.keep, 0)
            dropped = self.dropped + extra
            gap = f"\n[... {dropped:,} characters dropped ...]\n" if dropped else ""
            return "".join(self.head) + gap + tail[extra:]

    def take(self) -> str:
        """What was kept, and start afresh."""
        value = self.getvalue()
        with self.lock:
            self.head, self.head_len, self.tail, self.tail_len, self.dropped = [], 0, deque(), 0, 0
        return value


@contextlib.contextmanager
def captured(stream: BoundedText) -> Iterator[None]:
    """sys.stdout and sys.stderr into `stream` (and through to the worker's own) while inside. An exception that
    leaves gets what was printed and its formatted traceback as attributes (SHARD_LOG_ATTR, SHARD_TRACEBACK_ATTR)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(stream, out), _Tee(stream, err)
    try:
        yield
    except BaseException as exc:
        try:
            setattr(exc, SHARD_LOG_ATTR, stream.getvalue())
            setattr(exc, SHARD_TRACEBACK_ATTR, bounded("".join(traceback.format_exception(exc))))
        except (AttributeError, TypeError):  # an exception type without a __dict__: it goes on as it is
            pass
        raise
    finally:
        sys.stdout, sys.stderr = out, err


def job_shard(run: Callable[P, R]) -> Callable[P, R]:
    """Run a shard in its job's environment with its stdout and stderr captured, and the memory it freed given back
    when it ends (farm_agent.work.memory). Its result gets the output in its `log` field; an exception it raises gets
    the output and its formatted traceback as attributes (SHARD_LOG_ATTR, SHARD_TRACEBACK_ATTR) and goes on up."""

    @functools.wraps(run)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        stream = BoundedText()
        try:
            with captured(stream):
                prepare_from_environment()
                result = run(*args, **kwargs)
        finally:
            memory.give_back()  # the worker lives on: what the shard freed goes back to the lender's machine
        if dataclasses.is_dataclass(result) and any(f.name == "log" for f in dataclasses.fields(result)):
            return dataclasses.replace(result, log=stream.getvalue())  # type: ignore[type-var]
        return result

    return wrapper


OUTPUT_ATTR = "_farm_output"  # a worker's own stream, on the worker


def worker_call(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A method of a job's long-lived worker (a training actor, called many times), with its stdout and stderr
    captured into the worker's own stream across calls, until `take_output` hands them over; an exception gets the
    output and traceback as under job_shard."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        stream = self.__dict__.setdefault(OUTPUT_ATTR, BoundedText())
        with captured(stream):
            return method(self, *args, **kwargs)

    return wrapper


def take_output(worker: object) -> str:
    """What a worker's calls printed since the last take."""
    stream = worker.__dict__.get(OUTPUT_ATTR)
    return stream.take() if isinstance(stream, BoundedText) else ""


class _Tee(io.TextIOBase):
    """One of the two streams: into the shared capture, and through to the worker's own stream."""

    def __init__(self, capture: BoundedText, through: object) -> None:
        self.capture = capture
        self.through = through

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.capture.write(text)
        try:
            self.through.write(text)  # type: ignore[attr-defined]
        except (OSError, ValueError, AttributeError):  # a closed or odd worker stream must not fail the shard
            pass
        return len(text)

    def flush(self) -> None:
        try:
            self.through.flush()  # type: ignore[attr-defined]
        except (OSError, ValueError, AttributeError):
            pass

    def isatty(self) -> bool:
        return False


def bounded(text: str, keep: int = KEEP_BYTES) -> str:
    """Its first and last `keep` characters, with how many were dropped between."""
    if len(text) <= 2 * keep:
        return text
    return f"{text[:keep]}\n[... {len(text) - 2 * keep:,} characters dropped ...]\n{text[-keep:]}"
