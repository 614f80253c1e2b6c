"""Parquet: a file or a folder of files (pyarrow's dataset layer finds them, as `pyarrow.dataset.dataset` does: hidden
and `_`-prefixed files skipped). Planning reads each file's footer only (its row count); a range reads only the row
groups that hold its rows, batch by batch.

With several workers (the CPUs a shard lends its reader), a file's row groups decode in parallel, each on a thread
with a handle of its own (pyarrow releases the GIL while it decodes), in order, as many ahead as there are workers
and at most AHEAD_BYTES of them (their uncompressed size in the footer; one at least): a GPU's shard of a wide
Parquet file read at ~400 MB/s on one thread of an H200's host, a DataLoader's 8 processes at ~800 MB/s."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from farm.core.dataset import ROW_ID, DataFile
from farm.core.errors import DataError
from farm.data.locations import join
from farm.data.locations import where

AHEAD_BYTES = 512 * 1024 * 1024  # row groups decoding ahead, by their uncompressed size (the first always)
# A shard cut inside a row group leaves the group's rest to the next shard, which the same worker most often runs:
# the group, decoded once, is kept for it (on the H100 a job's cuts read 21 groups of 64 MiB for a file of 16).
SHARED_GROUPS = 2
SHARED_BYTES = 256 * 1024 * 1024  # a larger group is decoded again rather than held
_shared: OrderedDict[tuple[Any, ...], Future[pa.Table]] = OrderedDict()
_shared_lock = threading.Lock()


def plan(fs, root: str) -> tuple[list[tuple[str, int]], tuple[str, ...], int]:
    dataset = ds.dataset(root, format="parquet", filesystem=fs)
    files = []
    for fragment in dataset.get_fragments():
        path = fragment.path
        relative = "" if path.rstrip("/") == root.rstrip("/") else path[len(root.rstrip("/")) + 1:]
        try:
            rows = pq.read_metadata(path, filesystem=fs).num_rows
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{where(root, relative)}: not a whole Parquet file ({exc})") from None
        files.append((relative, rows))
    files.sort()
    return files, tuple(dataset.schema.names), sum(rows for _, rows in files)


def read(fs, root: str, location: str, pieces: Sequence[tuple[DataFile, int, int]], columns: list[str] | None,
         batch_rows: int, workers: int = 1) -> Iterator[pa.RecordBatch]:
    for file, first, end in pieces:
        name = where(location, file.path)
        try:
            # No cache: pyarrow reads each column chunk it needs whole, once; a read-ahead block (the head's 16 MiB)
            # would hold a second copy and bytes past it, a worker's peak then growing with the dataset's files.
            with fs.open(join(root, file.path), "rb", cache_type="none") as handle:
                parquet = pq.ParquetFile(handle)
                if workers > 1 and parquet.metadata.num_row_groups > 1:
                    opened = functools.partial(fs.open, join(root, file.path), "rb", cache_type="none")
                    yield from _read_groups(opened, parquet.metadata, name, file.offset, first, end, columns,
                                            batch_rows, workers, key=(join(root, file.path), file.units))
                else:
                    yield from _read_file(parquet, name, file.offset, first, end, columns, batch_rows)
        except DataError:
            raise
        except (OSError, pa.ArrowException, ValueError) as exc:  # its footer: none of its rows read
            raise DataError(f"{name}: rows {first}-{end - 1} do not read: {first_line(exc)}",
                            rows=(file.offset + first, file.offset + end)) from None


def _read_file(parquet: pq.ParquetFile, name: str, offset: int, first: int, end: int, columns: list[str] | None,
               batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The rows [first, end) of the file, a row group at a time; a group that does not read (a corrupt page) is
    named alone, with its rows: the file's other groups read."""
    group_start = 0
    for index in range(parquet.metadata.num_row_groups):
        if group_start >= end:
            return
        rows = parquet.metadata.row_group(index).num_rows
        if group_start + rows > first:
            try:
                yield from _read_group(parquet, index, group_start, offset, first, end, columns, batch_rows)
            except (OSError, pa.ArrowException, ValueError) as exc:
                lo, hi = max(first, group_start), min(end, group_start + rows)
                raise DataError(f"{name}: rows {lo}-{hi - 1} (row group {index}) do not read: {first_line(exc)}",
                                rows=(offset + lo, offset + hi)) from None
        group_start += rows


def _read_groups(opened: Callable[[], Any], metadata: pq.FileMetaData, name: str, offset: int, first: int, end: int,
                 columns: list[str] | None, batch_rows: int, workers: int, key: tuple[Any, ...] = ()
                 ) -> Iterator[pa.RecordBatch]:
    """_read_file's batches, the row groups decoding ahead on `workers` threads: each a whole group's table, read
    through a handle of its own (`opened()`) with the footer already read. A group the range cuts (its first or
    last) is shared with the range beside it (SHARED_GROUPS), under `key` (the file) with its index and columns."""
    groups, group_start = [], 0
    for index in range(metadata.num_row_groups):
        rows = metadata.row_group(index).num_rows
        if group_start < end and group_start + rows > first:
            groups.append((index, group_start, rows, metadata.row_group(index).total_byte_size))
        group_start += rows
    pool = _pool(workers)
    pending: deque[tuple[tuple[int, int, int, int], Future[pa.Table]]] = deque()
    shared: set[int] = set()  # the futures another range may wait on too
    try:
        for group in groups:
            while pending and (len(pending) >= workers or sum(g[3] for g, _ in pending) + group[3] > AHEAD_BYTES):
                yield from _batches_of(*pending.popleft(), name, offset, first, end, batch_rows)
            index, start, rows, size = group
            cut = start < first or start + rows > end
            share = (*key, index, tuple(columns or ())) if key and cut and size <= SHARED_BYTES else None
            pending.append((group, future := _decode(pool, share, opened, metadata, index, columns)))
            if share is not None:
                shared.add(id(future))
        while pending:
            yield from _batches_of(*pending.popleft(), name, offset, first, end, batch_rows)
    finally:  # the consumer stopped early, or a group failed: what has not started is dropped (not a shared one)
        for _, future in pending:
            if id(future) not in shared:
                future.cancel()


def _decode(pool: ThreadPoolExecutor, share: tuple[Any, ...] | None, opened: Callable[[], Any],
            metadata: pq.FileMetaData, index: int, columns: list[str] | None) -> Future[pa.Table]:
    """Row group `index`'s table, decoding on `pool`; under `share`, the one decoded (or decoding) for the range
    beside this one, taken (a cut has two sides: it is used once more), else one kept for it."""
    if share is None:
        return pool.submit(_group_table, opened, metadata, index, columns)
    share = (*share, metadata.serialized_size, metadata.row_group(index).total_byte_size)  # the file as it is now
    with _shared_lock:
        found = _shared.pop(share, None)
        if found is not None and not found.cancelled():
            return found
        _shared[share] = future = pool.submit(_group_table, opened, metadata, index, columns)
        while len(_shared) > SHARED_GROUPS:
            _shared.popitem(last=False)
        return future


def _group_table(opened: Callable[[], Any], metadata: pq.FileMetaData, index: int, columns: list[str] | None
                 ) -> pa.Table:
    with opened() as handle:
        return pq.ParquetFile(handle, metadata=metadata).read_row_group(index, columns=columns, use_threads=False,
                                                                        use_pandas_metadata=False)


def _batches_of(group: tuple[int, int, int, int], table: Future[pa.Table], name: str, offset: int, first: int,
                end: int, batch_rows: int) -> Iterator[pa.RecordBatch]:
    index, row, rows, _ = group
    lo, hi = max(first - row, 0), min(end - row, rows)
    try:
        part = table.result().slice(lo, hi - lo)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataError(f"{name}: rows {row + lo}-{row + hi - 1} (row group {index}) do not read: {first_line(exc)}",
                        rows=(offset + row + lo, offset + row + hi)) from None
    at = offset + row + lo
    for batch in part.to_batches(max_chunksize=batch_rows):
        yield batch.add_column(0, ROW_ID, pa.array(range(at, at + batch.num_rows), pa.int64()))
        at += batch.num_rows


@lru_cache(maxsize=4)
def _pool(workers: int) -> ThreadPoolExecutor:
    """Kept for the process's life (a worker's shards read one after another)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="farm-parquet")


def _read_group(parquet: pq.ParquetFile, index: int, row: int, offset: int, first: int, end: int,
                columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of [first, end) in row group `index` (its first row is `row` of the file). One reader a row group:
    pyarrow's reader over several groups keeps every group's column chunks it has read until it ends (pyarrow 26), so
    a shard's memory grew with its rows (a 28 MiB file of 8 groups: 25 MiB held at the last group, 3.6 MiB so)."""
    for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=[index], columns=columns,
                                      use_pandas_metadata=False):
        lo, hi = max(first - row, 0), min(end - row, batch.num_rows)
        if hi > lo:
            part = batch.slice(lo, hi - lo)
            ids = pa.array(range(offset + row + lo, offset + row + hi), pa.int64())
            yield part.add_column(0, ROW_ID, ids)
        row += batch.num_rows
        if row >= end:
            return


def first_line(exc: BaseException) -> str:
    """pyarrow's message is often two lines ("Couldn't deserialize thrift ...\nDeserializing page header failed.")."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
