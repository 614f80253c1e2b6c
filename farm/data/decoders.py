"""Decoding a batch's encoded items (an image folder's files) on the CPUs the node lends a worker: on threads where
the decoder spends an item mostly in C with the GIL released, on processes where it holds the GIL for much of it.
One decoder per format that the node decodes itself, from DECODERS; each says which pool suits a batch.

Pillow releases the GIL while its C codec runs, but opens a file, finds its plugin and walks its chunks in Python.
On a 64x64 PNG (12 KiB) opening alone is ~20 us of ~60 us (and its load loop is partly Python), so threads gain
little; on a 256x256 one (190 KiB) the codec's load is ~820 us of ~910 us and threads scale with the cores (one
core of the 2-core dev box, 2026-12).

A process pool's items go out as bytes and come back as arrays (pickled both ways): its processes run this module's
code, started by this worker, as the job's user, on the job's own data, so nothing crosses a trust boundary that the
worker itself does not already hold (the head never unpickles anything a node made: this stays inside the worker).
"""

from __future__ import annotations

import io
import multiprocessing
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

import numpy as np

from farm.core.dataset import DataFormat
from farm.core.errors import DataError


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


def decode_all(decoder: Decoder, items: Sequence[bytes], workers: int, pool: PoolKind | None = None
               ) -> list[np.ndarray | str]:
    """Each item decoded, in order, or why it did not decode (one line), on `workers` of the pool that suits the
    batch (`pool`: that one instead). A decoder process that dies (a file that crashes the codec) fails the batch
    with DataError; the next batch gets a fresh pool."""
    if workers <= 1 or len(items) <= 1:
        return [_decode_one(decoder.name, item) for item in items]
    kind = pool or decoder.pool(sum(map(len, items)) / len(items))
    if kind is PoolKind.THREADS:
        return list(_threads(workers).map(lambda item: _decode_one(decoder.name, item), items))
    step = -(-len(items) // workers)  # one contiguous chunk a process: a round trip a process per batch
    chunks = [list(items[i:i + step]) for i in range(0, len(items), step)]
    try:
        return [found for part in _processes(workers).map(_decode_chunk, [decoder.name] * len(chunks), chunks)
                for found in part]
    except BrokenProcessPool:
        _processes.cache_clear()
        raise DataError(f"a {decoder.name} decoder process died on a batch of {len(items)} items (an input that "
                        "crashes the decoder)") from None


def _decode_one(name: str, data: bytes) -> np.ndarray | str:
    try:
        return _by_name(name).decode(data)
    except Undecodable as exc:
        return (str(exc).strip().splitlines() or ["it does not decode"])[0]


def _decode_chunk(name: str, items: list[bytes]) -> list[np.ndarray | str]:
    """In a decoder process."""
    return [_decode_one(name, item) for item in items]


def _by_name(name: str) -> Decoder:
    return next(d for d in DECODERS.values() if d.name == name)


@lru_cache(maxsize=4)
def _threads(workers: int) -> Executor:
    """One pool per size, kept for the worker's life (a pool a batch would start threads a batch)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="farm-decode")


@lru_cache(maxsize=1)
def _processes(workers: int) -> Executor:
    """Kept for the worker's life. Started by forkserver (spawn off Linux), never forked from this process: a Ray
    worker holds gRPC's and Ray's threads, which a fork would copy mid-lock. Each process imports the parent's main
    module as `__mp_main__` (a Ray worker's is guarded; a script's needs `if __name__ == "__main__"`) and costs about
    a second to start on the 2-core dev box: once per worker, not per shard."""
    method = "forkserver" if sys.platform.startswith("linux") else "spawn"
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method))
