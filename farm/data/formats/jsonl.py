"""JSON Lines: one JSON object a line (pyarrow's JSON reader, which infers the columns' types per batch)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.json as pajson

from farm.core.dataset import DataFile
from farm.core.errors import DataError
from farm.data.formats import lines
from farm.data.locations import where


def plan(fs, root: str) -> tuple[list[tuple[str, int]], tuple[str, ...], None]:
    files = lines.plan_files(fs, root, lines.LINE_SUFFIXES["jsonl"])
    columns: tuple[str, ...] = ()
    if files:
        first = lines.first_line(fs, root, files[0][0])
        try:
            row = json.loads(first)
        except ValueError as exc:
            raise DataError(f"{where(root, files[0][0])}: row at byte 0: not JSON ({exc})") from None
        columns = tuple(row) if isinstance(row, dict) else ()
    return files, columns, None


def read(fs, root: str, location: str, pieces: Sequence[tuple[DataFile, int, int]], columns: list[str] | None,
         batch_rows: int, workers: int = 1) -> Iterator[pa.RecordBatch]:
    def parse(name: str, batch: list[tuple[int, bytes]], file: DataFile) -> pa.RecordBatch:
        try:
            table = pajson.read_json(pa.BufferReader(b"\n".join(line for _, line in batch)),
                                     read_options=pajson.ReadOptions(block_size=max(1 << 20, 2 * sum(
                                         len(line) + 1 for _, line in batch))))
        except pa.ArrowException as exc:
            raise _bad_row(name, batch, file, exc) from None
        if table.num_rows != len(batch):
            raise _bad_row(name, batch, file, ValueError(f"{table.num_rows} rows from {len(batch)} lines"))
        if columns is not None:
            missing = [c for c in columns if c not in table.column_names]
            if missing:
                raise DataError(f"{name}: no field {missing[0]!r} in rows from byte {file.offset + batch[0][0]}")
            table = table.select(columns)
        return table.combine_chunks().to_batches()[0]

    return lines.read_lines(fs, root, location, pieces, batch_rows, parse)


def _bad_row(name: str, batch: list[tuple[int, bytes]], file: DataFile, cause: Exception) -> DataError:
    """The first line of the batch that is not a JSON object, named by its byte offset (its row id)."""
    for offset, line in batch:
        try:
            value = json.loads(line)
        except ValueError as exc:
            return DataError(f"{name}: row at byte {file.offset + offset}: not JSON ({exc})")
        if not isinstance(value, dict):
            return DataError(f"{name}: row at byte {file.offset + offset}: not a JSON object")
    return DataError(f"{name}: rows from byte {file.offset + batch[0][0]} do not read: {cause}")
