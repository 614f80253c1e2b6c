"""Decoding a batch's encoded items (an image folder's files) on the CPUs the node lends a worker: on threads where
the decoder spends an item mostly in C with the GIL released, on processes where it holds the GIL for much of it.
One decoder per format that the node decodes itself, from DECODERS; each says which pool suits a batch.

Pillow releases the GIL while its C codec runs, but opens a file, finds its plugin and walks its chunks in Python.
On a 64x64 PNG (12 KiB) opening alone is ~20 us of ~60 us (and its load loop is partly Python), so threads gain
little; on a 256x256 one (190 KiB) the codec's load is ~820 us of ~910 us and threads scale with the cores (one
core of the 2-core dev box, 2026-12).

A process pool's items go out as bytes, or as the paths of local files it reads itself, and come back as arrays
(pickled both ways): its processes run this module's code, started by this worker, as the job's user, on the job's
own data, so nothing crosses a trust boundary that the worker itself does not already hold (the head never
unpickles anything a node made: this stays inside the worker).
"""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.forkserver
import os
import sys
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import TypeAlias, TypeVar

import numpy as np

from farm.core.dataset import DataFormat
from farm.core.errors import DataError

T = TypeVar("T")
# A batch's items decoded: one array [N, ...] when they all decoded to one shape and type (stacked where they were
# decoded: a decoder process sends it back as one buffer, not one pickled array an item), else each item's array or
# why it did not decode (one line).
Decoded: TypeAlias = "np.ndarray | list[np.ndarray | str]"

AHEAD = 3  # batches a shard's reader keeps decoding at once (decode_ahead): see benchmarks/image_job.py
UNREADABLE = "does not read: "  # how an item given as a local path that could not be read is reported
Item: TypeAlias = "bytes | str"  # an item's encoded bytes, or the path of a local file that holds them


class PoolKind(StrEnum):
    THREADS = "threads"
    PROCESSES = "processes"


class Undecodable(Exception):
    """An item that does not decode (a decoder raises it, with why)."""


@dataclass(frozen=True)
class Decoder:
    name: str
    decode: Callable[[bytes], np.ndarray]  # a module-level function; raises Undecodable on a malformed item
    pool: Callable[[float], PoolKind]  # which pool suits a batch whose items hold this many bytes on average


def pillow(data: bytes) -> np.ndarray:
    """An image as an array (H, W) or (H, W, C) in its own mode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return np.asarray(image)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise Undecodable(str(exc)) from None


SMALL_IMAGE = 64 * 1024  # encoded bytes below which Pillow holds the GIL for much of an item (the figures above)


def pillow_pool(mean_bytes: float) -> PoolKind:
    return PoolKind.PROCESSES if mean_bytes < SMALL_IMAGE else PoolKind.THREADS


PILLOW = Decoder("pillow", pillow, pillow_pool)
DECODERS: dict[DataFormat, Decoder] = {DataFormat.IMAGES: PILLOW}


def decode_all(decoder: Decoder, items: Sequence[Item], workers: int,
               pool: PoolKind | None = None) -> Decoded:
    """Each item decoded, in order, or why it did not decode (one line; UNREADABLE first where it did not read):
    Decoded. An item is its encoded bytes, or the path of a local file the pool reads itself. On `workers` of the
    pool that suits the batch (`pool`: that one instead). A decoder process that dies (a file that crashes the
    codec) fails the batch with DataError; the next batch gets a fresh pool."""
    return submit(decoder, items, workers, pool).result()


@dataclass(frozen=True)
class Decoding:
    """A batch's items handed to a pool: `parts` decode runs of them, in order."""

    decoder: Decoder
    items: int
    parts: list[Future[Decoded]]

    def result(self) -> Decoded:
        """Waits for the items: decode_all's Decoded."""
        try:
            parts = [part.result() for part in self.parts]
        except BrokenProcessPool:
            raise _died(self.decoder, self.items) from None
        stacked = [p for p in parts if isinstance(p, np.ndarray)]
        if len(stacked) == len(parts) and len({(p.shape[1:], p.dtype) for p in stacked}) == 1:
            return stacked[0] if len(stacked) == 1 else np.concatenate(stacked)
        return [found for part in parts for found in part]

    def cancel(self) -> None:
        """Drops what the pool has not started."""
        for part in self.parts:
            part.cancel()


def submit(decoder: Decoder, items: Sequence[Item], workers: int, pool: PoolKind | None = None
           ) -> Decoding:
    """decode_all's work handed to the pool now, to be waited for later (Decoding.result)."""
    if workers <= 1 or len(items) <= 1:
        done: Future[Decoded] = Future()
        done.set_result(_decode_chunk(decoder.name, list(items)))
        return Decoding(decoder, len(items), [done])
    kind = pool or decoder.pool(_mean_bytes(items))
    if kind is PoolKind.THREADS:
        return Decoding(decoder, len(items), [_threads(workers).submit(_decode_chunk, decoder.name, [item])
                                             for item in items])
    step = -(-len(items) // workers)  # one contiguous chunk a process: a round trip a process per batch
    try:
        return Decoding(decoder, len(items), [_processes(workers).submit(_decode_chunk, decoder.name,
                                                                          list(items[i:i + step]))
                                             for i in range(0, len(items), step)])
    except BrokenProcessPool:
        raise _died(decoder, len(items)) from None


def _died(decoder: Decoder, items: int) -> DataError:
    _processes.cache_clear()  # the next batch gets a fresh pool
    return DataError(f"a {decoder.name} decoder process died on a batch of {items} items (an input that crashes "
                     "the decoder)")


def _mean_bytes(items: Sequence[Item]) -> float:
    """The items' mean encoded size; for local paths, the first file's (a stat, not one a file)."""
    if isinstance(items[0], str):
        try:
            return float(os.path.getsize(items[0]))
        except OSError:
            return 0.0
    return sum(map(len, items)) / len(items)


def decode_ahead(decoder: Decoder, batches: Iterable[T], items: Callable[[T], Sequence[Item]],
                 workers: int, ahead: int) -> Generator[tuple[T, Decoded]]:
    """Each batch with its items decoded (decode_all's Decoded), in order, while the batches after it are read and
    decode on the pool, `ahead` batches in flight in all (the memory it holds). One batch at a time, the pool idles
    while a batch's last items finish, while it is stacked and while the next one is read (a head's files, in the
    calling thread). An error reading a batch is raised once the batches before it are handed on, as it would be
    one batch at a time; an error decoding one when it is reached."""
    pending: deque[tuple[T, Decoding]] = deque()
    source = iter(batches)
    unread: Exception | None = None
    try:
        while True:
            while unread is None and len(pending) < max(ahead, 1):
                try:
                    batch = next(source)
                except StopIteration:
                    break
                except Exception as exc:  # noqa: BLE001 - raised in its turn, below
                    unread = exc
                    break
                pending.append((batch, submit(decoder, items(batch), workers)))
            if not pending:
                if unread is not None:
                    raise unread
                return
            batch, decoding = pending.popleft()
            yield batch, decoding.result()
    finally:  # the consumer stopped early, or a batch failed: what the pool has not started is dropped
        for _, decoding in pending:
            decoding.cancel()


def _decode_one(name: str, item: bytes | str) -> np.ndarray | str:
    if isinstance(item, str):  # a local file's path: read here, in the pool, not by the batch's reader
        try:
            with open(item, "rb") as handle:
                item = handle.read()
        except OSError as exc:
            return UNREADABLE + (exc.strerror or type(exc).__name__)
    try:
        return _by_name(name).decode(item)
    except Undecodable as exc:
        return (str(exc).strip().splitlines() or ["it does not decode"])[0]


def _decode_chunk(name: str, items: list[Item]) -> Decoded:
    """In a decoder process: Decoded."""
    found = [_decode_one(name, item) for item in items]
    shapes = {(a.shape, a.dtype) if isinstance(a, np.ndarray) else None for a in found}
    return np.stack(found) if found and len(shapes) == 1 and None not in shapes else found


def _by_name(name: str) -> Decoder:
    return next(d for d in DECODERS.values() if d.name == name)


@lru_cache(maxsize=4)
def _threads(workers: int) -> Executor:
    """One pool per size, kept for the worker's life (a pool a batch would start threads a batch)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="farm-decode")


@lru_cache(maxsize=1)
def _processes(workers: int) -> Executor:
    """Kept for the worker's life. Started by forkserver (spawn off Linux), never forked from this process: a
    worker holds gRPC's threads, which a fork would copy mid-lock. The forkserver imports the parent's main module
    as `__mp_main__` (a worker's is guarded; a script's needs `if __name__ == "__main__"`) and this module once, and
    each decoder process is forked from it with both loaded (importing them in each process was 0.17 CPU s apiece
    on the 2-core dev box): once per worker, not per shard."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=_context())


def start_server() -> None:
    """The decoder processes' server started now (a warm worker's, before any job), its imports made meanwhile: a
    job's first batch of small images then forks its processes at once. Started with the first batch instead, it
    took that batch 0.47 s against 0.06 s (2-core dev box, 256 PNGs of 64x64; a scratch timing, not a benchmark).
    One idle process for the worker's life."""
    if _context().get_start_method() == "forkserver":
        multiprocessing.forkserver.ensure_running()


def _context() -> multiprocessing.context.BaseContext:
    method = "forkserver" if sys.platform.startswith("linux") else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(["__main__", __name__, *PRELOADED])
    return context


# Pillow and the plugins its first open loads (Image.preinit), imported once in the decoders' server rather than in
# each decoder process on its first image: a job's first batch of 256 small PNGs on 2 processes took 55 ms against
# 17 ms for the next ones (the 2-core dev box), 25 ms of it Pillow's imports. The server skips one that is missing.
PRELOADED = ("PIL.Image", "PIL.BmpImagePlugin", "PIL.GifImagePlugin", "PIL.JpegImagePlugin", "PIL.PpmImagePlugin",
             "PIL.PngImagePlugin")
