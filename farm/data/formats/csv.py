"""CSV: a header line, then one row a line (pyarrow's CSV reader). Rows are split by lines, so a quoted field must
not hold a newline."""

from __future__ import annotations

import csv as stdcsv
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv

from farm.core.dataset import DataFile
from farm.core.errors import DataError
from farm.data.formats import lines


def plan(fs, root: str) -> tuple[list[tuple[str, int]], tuple[str, ...], None]:
    files = lines.plan_files(fs, root, lines.LINE_SUFFIXES["csv"])
    columns = tuple(_fields(lines.first_line(fs, root, files[0][0]))) if files else ()
    return files, columns, None


def _fields(line: bytes) -> list[str]:
    return next(stdcsv.reader([line.decode(errors="replace")]), [])


def read(fs, root: str, location: str, pieces: Sequence[tuple[DataFile, int, int]], columns: list[str] | None,
         batch_rows: int, workers: int = 1) -> Iterator[pa.RecordBatch]:
    headers: dict[str, bytes] = {}

    def parse(name: str, batch: list[tuple[int, bytes]], file: DataFile) -> pa.RecordBatch:
        header = headers.setdefault(file.path, lines.first_line(fs, root, file.path))
        body = header + b"\n" + b"\n".join(line for _, line in batch)
        try:
            table = pacsv.read_csv(pa.BufferReader(body), convert_options=pacsv.ConvertOptions(
                include_columns=columns))
        except pa.ArrowException as exc:
            width = len(_fields(header))
            for offset, line in batch:
                if len(_fields(line)) != width:
                    raise DataError(f"{name}: row at byte {file.offset + offset}: {len(_fields(line))} fields, "
                                    f"the header has {width}") from None
            raise DataError(f"{name}: rows from byte {file.offset + batch[0][0]} do not read: {exc}") from None
        if table.num_rows != len(batch):
            raise DataError(f"{name}: rows from byte {file.offset + batch[0][0]}: {table.num_rows} rows read from "
                            f"{len(batch)} lines (a quoted field holds a newline?)")
        return table.combine_chunks().to_batches()[0]

    return lines.read_lines(fs, root, location, pieces, batch_rows, parse, skip_first_line=True)
