"""Plain text: one item a line, in column `text` (UTF-8; blank lines are items too)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from farm.core.dataset import DataFile
from farm.data.formats import lines


def plan(fs, root: str) -> tuple[list[tuple[str, int]], tuple[str, ...], None]:
    return lines.plan_files(fs, root, lines.LINE_SUFFIXES["text"]), ("text",), None


def read(fs, root: str, location: str, pieces: Sequence[tuple[DataFile, int, int]], columns: list[str] | None,
         batch_rows: int, workers: int = 1) -> Iterator[pa.RecordBatch]:
    def parse(name: str, batch: list[tuple[int, bytes]], file: DataFile) -> pa.RecordBatch:
        texts = [lines.decode(name, file.offset + offset, line) for offset, line in batch]
        return pa.record_batch({"text": pa.array(texts, pa.string())})

    return lines.read_lines(fs, root, location, pieces, batch_rows, parse, skip_blank=False)
