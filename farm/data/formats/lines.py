"""What the line formats (JSON Lines, CSV, text) share: byte units, and reading the lines that start in a byte range.

A range [first, end) of a file owns the lines that start inside it (the convention of Hadoop's line splits): it skips
the line it begins in the middle of, and reads through the end of the line that crosses `end`. So ranges cut at any
byte cover every line exactly once, and planning needs only each file's size. A row's id is the byte offset of its
line in the dataset (ordered and unique, not consecutive).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from farm.core.dataset import ROW_ID, DataFile
from farm.core.errors import DataError
from farm.data.locations import find, join
from farm.data.locations import where

BLOCK = 1 << 20  # bytes read at a time
LINE_SUFFIXES = {"jsonl": (".jsonl", ".ndjson", ".json"), "csv": (".csv",), "text": (".txt", ".text")}


def plan_files(fs, root: str, suffixes: tuple[str, ...]) -> list[tuple[str, int]]:
    """A file, or a folder's files with these suffixes, sorted, with their sizes in bytes."""
    if fs.isfile(root):
        return [("", int(fs.size(root)))]
    found = sorted(p for p in find(fs, root) if p.lower().endswith(suffixes)
                   and not p.rsplit("/", 1)[-1].startswith((".", "_")))
    prefix = root.rstrip("/") + "/"
    return [(p.removeprefix(prefix), int(fs.size(p))) for p in found]


def first_line(fs, root: str, path: str) -> bytes:
    with fs.open(join(root, path), "rb") as handle:
        return handle.readline().rstrip(b"\r\n")


def lines(handle, first: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset in the file, line without its newline) for each line starting in [first, end)."""
    if first > 0:
        handle.seek(first - 1)
        position = first - 1 + len(handle.readline())  # past the line `first` falls in ("\n" alone if it starts there)
    else:
        handle.seek(0)
        position = 0
    pending = b""  # the start of the line at `position`, not yet ended
    while position < end:
        block = handle.read(BLOCK)
        if not block:
            if pending:
                yield position, pending.rstrip(b"\r")
            return
        parts = (pending + block).split(b"\n")
        pending = parts.pop()
        for line in parts:
            if position >= end:
                return
            yield position, line.rstrip(b"\r")
            position += len(line) + 1


def read_lines(fs, root: str, location: str, pieces: Sequence[tuple[DataFile, int, int]], batch_rows: int,
               parse: Callable[[str, list[tuple[int, bytes]], DataFile], pa.RecordBatch],
               skip_first_line: bool = False, skip_blank: bool = True) -> Iterator[pa.RecordBatch]:
    """Batches of up to `batch_rows` lines of each piece, parsed by `parse(file's name, [(offset, line)], file)`."""
    for file, first, end in pieces:
        name = where(location, file.path)
        try:
            with fs.open(join(root, file.path), "rb") as handle:
                batch: list[tuple[int, bytes]] = []
                for offset, line in lines(handle, first, end):
                    if (skip_first_line and offset == 0) or (skip_blank and not line.strip()):
                        continue
                    batch.append((offset, line))
                    if len(batch) >= batch_rows:
                        yield with_ids(parse(name, batch, file), file, batch)
                        batch = []
                if batch:
                    yield with_ids(parse(name, batch, file), file, batch)
        except OSError as exc:
            raise DataError(f"{name}: bytes {first}-{end - 1} do not read: {exc}") from None


def with_ids(batch: pa.RecordBatch, file: DataFile, lines: list[tuple[int, bytes]]) -> pa.RecordBatch:
    return batch.add_column(0, ROW_ID, pa.array([file.offset + offset for offset, _ in lines], pa.int64()))


def decode(name: str, offset: int, line: bytes) -> str:
    try:
        return line.decode()
    except UnicodeDecodeError as exc:
        raise DataError(f"{name}: row at byte {offset}: not UTF-8 text ({exc.reason} at {exc.start})") from None
