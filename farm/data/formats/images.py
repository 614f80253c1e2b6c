"""A folder of images (PNG, JPEG): one row per file, in the order of their sorted paths. Batches carry the encoded
bytes (`image`) and the path under the folder (`path`); the node decodes them with Pillow when it turns a batch into
arrays (decode_images), so a file that does not decode fails its shard naming the file.

A reader that asks for FILE instead of `image` gets, where the folder is on this machine's own filesystem (a shared
path), each file's path there and no bytes: the decoders then read the files themselves, each in its own process or
thread, as a DataLoader's workers do, and the reading thread (which shares its process with the model) opens none.
Elsewhere FILE is ignored and the bytes come as `image`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from farm.core.dataset import ROW_ID, DataFile, DataFormat
from farm.core.errors import DataError
from farm.data.locations import find, is_local, join, where

SUFFIXES = (".png", ".jpg", ".jpeg")
FILE = "_file"  # the column of each file's local path, in place of its bytes (never a user's column: plan's names)


def plan(fs, root: str) -> tuple[list[tuple[str, int]], tuple[str, ...], int]:
    prefix = root.rstrip("/") + "/"
    found = sorted(p.removeprefix(prefix) for p in find(fs, root) if p.lower().endswith(SUFFIXES)
                   and not p.rsplit("/", 1)[-1].startswith("."))
    return [(path, 1) for path in found], ("image", "path"), len(found)


def read(fs, root: str, location: str, pieces: Sequence[tuple[DataFile, int, int]], columns: list[str] | None,
         batch_rows: int, workers: int = 1) -> Iterator[pa.RecordBatch]:
    files = [file for file, first, end in pieces if end > first]
    if FILE in (columns or ()) and is_local(fs):
        for start in range(0, len(files), batch_rows):
            chunk = files[start:start + batch_rows]
            yield pa.record_batch({
                ROW_ID: pa.array([f.offset for f in chunk], pa.int64()),
                FILE: pa.array([join(root, f.path) for f in chunk], pa.string()),
                "path": pa.array([f.path for f in chunk], pa.string()),
            })
        return
    found = _contents(fs, [join(root, f.path) for f in files])
    for start in range(0, len(files), batch_rows):
        chunk = files[start:start + batch_rows]
        data = []
        for file in chunk:
            try:
                _, value = next(found)
            except OSError as exc:  # the whole call failed (the head refused it, the connection broke)
                raise DataError(f"{where(location, file.path)}: does not read: {exc}") from None
            if not isinstance(value, bytes):
                raise DataError(f"{where(location, file.path)} (row {file.offset}): does not read: {value}",
                                rows=(file.offset, file.offset + 1))
            data.append(value)
        yield pa.record_batch({
            ROW_ID: pa.array([f.offset for f in chunk], pa.int64()),
            "image": pa.array(data, pa.binary()),
            "path": pa.array([f.path for f in chunk], pa.string()),
        })


def _contents(fs, paths: list[str], group: int = 64) -> Iterator[tuple[str, bytes | Exception]]:
    """Each file's bytes (or its error) in order. The head's files stream in batched calls, read ahead across the
    model's batches (HeadFileSystem.iter_files); local ones (a shared path) are read as they are (fsspec's local
    `cat` costs twice a plain read a file, in the one thread that feeds the decode pool); elsewhere fsspec's `cat` a
    group at a time (concurrent for http and s3)."""
    from farm.data.locations.head import HeadFileSystem

    if isinstance(fs, HeadFileSystem):
        yield from fs.iter_files(paths)
        return
    if is_local(fs):
        for path in paths:
            try:
                with open(path, "rb") as handle:
                    yield path, handle.read()
            except OSError as exc:
                yield path, exc
        return
    for start in range(0, len(paths), group):
        part = paths[start:start + group]
        found = fs.cat(part, on_error="return") if len(part) > 1 else {part[0]: _one(fs, part[0])}
        for path in part:
            yield path, found.get(path, FileNotFoundError(path))


def _one(fs, path: str) -> bytes | Exception:
    try:
        return fs.cat_file(path)
    except OSError as exc:
        return exc


def decode_images(location: str, batches: Iterable[pa.RecordBatch], workers: int = 1, ahead: int = 1
                  ) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Each batch with its images as arrays (H, W) or (H, W, C) in their own mode: one array [N, ...] when they
    share a shape, else an object array of arrays (as Ray Data's read_images gives them). Decoded on `workers`
    threads or processes (the CPUs the node lends; farm.data.decoders chooses which by the images' size), `ahead`
    batches at once (farm.data.decoders.decode_ahead); a batch with FILE and no `image` has its files read there
    too. A file that does not decode (or read) fails its batch naming it and its row (its range:
    farm.scheduler.bad_rows skips that row alone)."""
    from farm.data.decoders import DECODERS, UNREADABLE, decode_ahead

    for batch, arrays in decode_ahead(DECODERS[DataFormat.IMAGES], batches, _encoded, workers, ahead):
        if isinstance(arrays, np.ndarray):  # all of one shape and type, stacked where they were decoded
            yield batch, arrays
            continue
        failed = next((i for i, a in enumerate(arrays) if isinstance(a, str)), None)
        if failed is not None:
            path, row = batch.column("path")[failed].as_py(), batch.column(ROW_ID)[failed].as_py()
            why = str(arrays[failed])
            why = why if why.startswith(UNREADABLE) else f"the image does not decode: {why}"
            raise DataError(f"{where(location, path)} (row {row}): {why}", rows=(row, row + 1))
        if arrays and all(a.shape == arrays[0].shape and a.dtype == arrays[0].dtype for a in arrays):  # type: ignore[union-attr]
            yield batch, np.stack(arrays)
            continue
        ragged = np.empty(len(arrays), dtype=object)
        ragged[:] = arrays
        yield batch, ragged


def _encoded(batch: pa.RecordBatch) -> list[bytes | str]:
    """The batch's encoded images, or (FILE, no `image`) their local paths for the decoders to read."""
    names = batch.schema.names
    return batch.column("image" if "image" in names or FILE not in names else FILE).to_pylist()
