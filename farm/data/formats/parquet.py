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
            with fs.open(join(root, file.path), "rb") as handle:
                yield from _read_file(pq.ParquetFile(handle), file.offset, first, end, columns, batch_rows)
        except DataError:
            raise
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise DataError(f"{name}: rows {first}-{end - 1} do not read: {exc}") from None


def _read_file(parquet: pq.ParquetFile, offset: int, first: int, end: int, columns: list[str] | None,
               batch_rows: int) -> Iterator[pa.RecordBatch]:
    groups, row = [], 0
    group_start = None
    for index in range(parquet.metadata.num_row_groups):
        rows = parquet.metadata.row_group(index).num_rows
        if row + rows > first and row < end:
            groups.append(index)
            group_start = row if group_start is None else group_start
        row += rows
    if not groups:
        return
    row = group_start or 0
    for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=groups, columns=columns,
                                      use_pandas_metadata=False):
        lo, hi = max(first - row, 0), min(end - row, batch.num_rows)
        if hi > lo:
            part = batch.slice(lo, hi - lo)
            ids = pa.array(range(offset + row + lo, offset + row + hi), pa.int64())
            yield part.add_column(0, ROW_ID, ids)
        row += batch.num_rows
        if row >= end:
            return
