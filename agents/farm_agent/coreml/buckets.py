"""Batch buckets: a Core ML model for the Neural Engine has static shapes, so it is converted once per bucket size
and every batch is padded up to the smallest bucket that holds it (or cut into largest-bucket pieces).

Pure numpy: the ANE backend and the converter both use it, and so do the tests on any OS.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

DEFAULT_BUCKETS: tuple[int, ...] = (1, 8, 32, 64)


def normalise(buckets: Sequence[int]) -> tuple[int, ...]:
    """Sorted, distinct, positive bucket sizes; ValueError for an empty or non-positive set."""
    sizes = tuple(sorted({int(b) for b in buckets}))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch buckets must be positive sizes, got {list(buckets)}")
    return sizes


def bucket_for(count: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding `count` items (count must not exceed the largest bucket)."""
    for size in sorted(buckets):
        if count <= size:
            return size
    raise ValueError(f"{count} items exceed the largest batch bucket {max(buckets)}")


def batches(count: int, batch_size: int, buckets: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """(start, stop, bucket) for each batch of at most `batch_size` (and at most the largest bucket) items."""
    step = max(1, min(batch_size, max(buckets)))
    for start in range(0, count, step):
        stop = min(start + step, count)
        yield start, stop, bucket_for(stop - start, buckets)


def pad_to(batch: np.ndarray, size: int) -> np.ndarray:
    """`batch` with copies of its last item appended up to `size` items (a real item, so padding never feeds the
    model values it has not seen, such as an all-zero attention mask)."""
    missing = size - len(batch)
    if missing < 0:
        raise ValueError(f"a batch of {len(batch)} does not fit a bucket of {size}")
    if missing == 0:
        return batch
    return np.concatenate([batch, np.repeat(batch[-1:], missing, axis=0)])
