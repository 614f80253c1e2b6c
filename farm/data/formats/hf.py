"""A Hugging Face `datasets` folder written by `Dataset.save_to_disk`: Arrow IPC stream files listed in its
state.json. Read with pyarrow directly (the `datasets` package is not needed on the nodes). Planning counts each
file's rows from its record batches' headers (memory-mapped on the head's own disk: no data is read)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pyarrow as pa

from farm.core.dataset import ROW_ID, DataFile
from farm.core.errors import DataError
from farm.data.locations import is_local, join
from farm.data.locations import where


def _stream(fs, path: str):
    if is_local(fs):
        return pa.ipc.open_stream(pa.memory_map(path))
    return pa.ipc.open_stream(fs.open(path, "rb"))


def plan(fs, root: str) -> tuple[list[tuple[str, int]], tuple[str, ...], int]:
    try:
        state = json.loads(fs.cat_file(join(root, "state.json")))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{root}: not a folder written by save_to_disk (state.json: {exc})") from None
    files, columns = [], ()
    for name in names:
        try:
            with _stream(fs, join(root, name)) as reader:
                columns = columns or tuple(reader.schema.names)
                rows = sum(batch.num_rows for batch in reader)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{where(root, name)}: not a whole Arrow stream ({exc})") from None
        files.append((name, rows))
    return files, columns, sum(rows for _, rows in files)


def read(fs, root: str, location: str, pieces: Sequence[tuple[DataFile, int, int]], columns: list[str] | None,
         batch_rows: int, workers: int = 1) -> Iterator[pa.RecordBatch]:
    for file, first, end in pieces:
        name = where(location, file.path)
        row = 0
        try:
            with _stream(fs, join(root, file.path)) as reader:
                for batch in reader:
                    lo, hi = max(first - row, 0), min(end - row, batch.num_rows)
                    for start in range(lo, hi, batch_rows):
                        part = batch.slice(start, min(batch_rows, hi - start))
                        if columns is not None:
                            part = part.select(columns)
                        ids = pa.array(range(file.offset + row + start, file.offset + row + start + part.num_rows),
                                       pa.int64())
                        yield part.add_column(0, ROW_ID, ids)
                    row += batch.num_rows
                    if row >= end:
                        break
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{name}: rows from {first + row} do not read: {exc}") from None
