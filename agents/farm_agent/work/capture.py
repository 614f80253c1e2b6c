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
import os
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import farm
import farm_agent
from farm.core.tasks import SHARD_FULL_TRACEBACK_ATTR, SHARD_LOG_ATTR, SHARD_TRACEBACK_ATTR
from farm_agent.work import memory
from farm_agent.work.environment import prepare_from_environment

# Kept of a shard's output: its first and last KEEP_BYTES each (the start says what it set out to do, the end what
# went wrong), with a line saying how much was dropped in between.
KEEP_BYTES = 32 * 1024
LIVE_LINE = 4 * 1024  # a line this long without its newline yet goes live as it is
LIVE_PIECE = 8 * 1024  # characters a live piece at most: under the agent's 64 KiB report cap in any UTF-8

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
        self.sent = 0  # characters of the kept head already sent live (take_live): never sent again
        self.closed = False  # the rest was taken (unsent): nothing more goes live

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

    def take_live(self) -> str:
        """The kept head's whole lines not sent yet, at most LIVE_PIECE characters (a line longer than LIVE_LINE
        without its newline yet goes as it is), to send while the shard runs. Only the head streams: past its
        `keep` characters the rest waits for the end, where `unsent` gives it with the count of what was dropped,
        so a shard's output costs the head what it does today, however much it prints."""
        with self.lock:
            if self.closed:
                return ""
            window = "".join(self.head)[self.sent:self.sent + LIVE_PIECE]
            lines = window.rfind("\n") + 1
            cut = lines or (len(window) if len(window) >= LIVE_LINE else 0)
            self.sent += cut
            return window[:cut]

    def unsent(self) -> str:
        """What take_live has not sent: the rest of the head, the gap and the tail (all of getvalue when nothing
        was sent live). Nothing goes live after it."""
        with self.lock:
            self.closed, sent = True, self.sent
        return self.getvalue()[sent:]


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
            setattr(exc, SHARD_LOG_ATTR, stream.unsent())
            setattr(exc, SHARD_TRACEBACK_ATTR, bounded(user_traceback(exc)))
            setattr(exc, SHARD_FULL_TRACEBACK_ATTR, bounded("".join(traceback.format_exception(exc))))
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
            with live(stream), captured(stream):
                prepare_from_environment()
                result = run(*args, **kwargs)
        finally:
            memory.give_back()  # the worker lives on: what the shard freed goes back to the lender's machine
        if dataclasses.is_dataclass(result) and any(f.name == "log" for f in dataclasses.fields(result)):
            return dataclasses.replace(result, log=stream.unsent())  # type: ignore[type-var]
        return result

    return wrapper


class LiveOutput:
    """The running shard's stream, for a persistent worker's sender (farm_agent.work.host) to read while the shard
    runs: one shard runs at a time in a worker. A piece is taken and sent under its lock, which the shard's end
    takes before reading what is left; and once that is read (`unsent`) nothing more goes live: no text goes
    twice, none is lost."""

    def __init__(self) -> None:
        self.stream: BoundedText | None = None
        self.lock = threading.Lock()

    def send(self, report: Callable[[str], None]) -> None:
        """What the running shard printed since the last call, to `report`, under the lock (see above)."""
        with self.lock:
            while self.stream is not None and (piece := self.stream.take_live()):
                report(piece)


LIVE = LiveOutput()


@contextlib.contextmanager
def live(stream: BoundedText) -> Iterator[None]:
    with LIVE.lock:
        LIVE.stream = stream
    try:
        yield
    finally:
        with LIVE.lock:  # a piece being sent now is out before the shard's end reads what is left
            LIVE.stream = None


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


# Where Farm's own frames are: a traceback a user reads starts past them.
FARM_CODE = tuple(str(Path(module.__file__ or "").parent) + os.sep for module in (farm, farm_agent))


def user_traceback(exc: BaseException, code: Path | None = None) -> str:
    """The exception's traceback from the first frame of the job's code (`code`, its folder: the worker's cwd), else
    from the first frame that is not Farm's (a torch module's, for a model without a forward of its own); the
    whole traceback when every frame is Farm's."""
    code_dir = str(code or Path.cwd()) + os.sep
    frames = list(_frames(exc.__traceback__))
    first = next((tb for tb in frames if tb.tb_frame.f_code.co_filename.startswith(code_dir)), None) or next(
        (tb for tb in frames if not tb.tb_frame.f_code.co_filename.startswith(FARM_CODE)), None)
    return "".join(traceback.format_exception(type(exc), exc, first or exc.__traceback__))


def _frames(tb: TracebackType | None) -> Iterator[TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next
