"""Parquet: a file or a folder of files (pyarrow's dataset layer finds them, as `pyarrow.dataset.dataset` does: hidden
and `_`-prefixed files skipped). Planning reads each file's footer only (its row count); a range reads only the row
groups that hold its rows, batch by batch."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from farm.core.dataset import ROW_ID, DataFile
from farm.core.errors import DataError
from farm.data.locations import join
from farm.data.locations import where


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
         batch_rows: int) -> Iterator[pa.RecordBatch]:
    for file, first, end in pieces:
        name = where(location, file.path)
        try:
            # No cache: pyarrow reads each column chunk it needs whole, once; a read-ahead block (the head's 16 MiB)
            # would hold a second copy and bytes past it, a worker's peak then growing with the dataset's files.
            with fs.open(join(root, file.path), "rb", cache_type="none") as handle:
                yield from _read_file(pq.ParquetFile(handle), name, file.offset, first, end, columns, batch_rows)
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
