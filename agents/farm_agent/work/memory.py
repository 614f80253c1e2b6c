"""Memory a shard freed, given back to the system when it ends.

A worker lives on between shards on a lender's machine, and glibc's malloc keeps what a shard freed in its arenas
(reads from the head, Arrow batches, result buffers, from the reader thread's arena too), so a worker held more
between shards the larger the shards it had run (seen in a scratch experiment on the 2-core box, not a benchmark of
the project). A fixed mmap threshold (MALLOC_MMAP_THRESHOLD_) kept the peak flat but made the model's own tensors
page-fault on every batch, about half the speed there: not taken. The arenas are two (MALLOC_ARENA_MAX, set for every
worker by farm_agent.daemon.workers and every Ray process by farm.local.ray_env): glibc's 8 a core each kept what
their threads freed.
"""

from __future__ import annotations

import ctypes
import sys


def give_back() -> None:
    """Return the free memory of every malloc arena to the system (glibc's malloc_trim); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # a libc without malloc_trim (musl)
        pass
