"""Memory a shard freed, given back to the system when it ends.

A Ray worker lives on between shards and jobs on a lender's machine, and glibc's malloc keeps what a shard freed in
its arenas (the 16 MiB reads from the head, Arrow batches, result buffers, from the reader thread's arena too): on
this box a worker that had run 64k-row shards of the digits CNN through the head held 540-610 MiB between shards,
510-530 MiB with the trim below (/tmp experiment, noisy box). A fixed mmap threshold (MALLOC_MMAP_THRESHOLD_=1 MiB)
kept the peak flat but made the model's own tensors page-fault on every batch: half the speed; not taken.
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
