"""One NumPy .npy array; rows along its first axis, in column `data`. Planning reads only its header; a range reads
only its rows' bytes (through a memory map when the file is on this machine)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from farm.core.dataset import ROW_ID, DataFile
from farm.core.errors import DataError
from farm.data.locations import is_local, join
from farm.data.locations import where


def header(handle, name: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) from an .npy header."""
    try:
        version = np.lib.format.read_magic(handle)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"format version {version} is not read here")
        shape, fortran, dtype = read(handle)
    except (ValueError, OSError) as exc:
        raise DataError(f"{name}: not an .npy file ({exc})") from None
    if dtype.hasobject or fortran or not shape:
        raise DataError(f"{name}: an .npy dataset is a C-ordered array of numbers with rows along its first axis")
    return tuple(shape), dtype, handle.tell()


def plan(fs, root: str) -> tuple[list[tuple[str, int]], tuple[str, ...], int]:
    with fs.open(root, "rb") as handle:
        shape, _, _ = header(handle, root)
    return [("", shape[0])], ("data",), shape[0]


def read(fs, root: str, location: str, pieces: Sequence[tuple[DataFile, int, int]], columns: list[str] | None,
         batch_rows: int, workers: int = 1) -> Iterator[pa.RecordBatch]:
    for file, first, end in pieces:
        name = where(location, file.path)
        path = join(root, file.path)
        with fs.open(path, "rb") as handle:
            shape, dtype, offset = header(handle, name)
            row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            mapped = np.load(path, mmap_mode="r") if is_local(fs) else None
            for start in range(first, end, batch_rows):
                stop = min(start + batch_rows, end)
                if mapped is not None:
                    rows = np.asarray(mapped[start:stop])
                else:
                    handle.seek(offset + start * row_bytes)
                    data = handle.read((stop - start) * row_bytes)
                    if len(data) != (stop - start) * row_bytes:
                        raise DataError(f"{name}: truncated: row {start + len(data) // row_bytes} is missing")
                    rows = np.frombuffer(data, dtype=dtype).reshape((stop - start, *shape[1:]))
                yield pa.record_batch({ROW_ID: pa.array(range(file.offset + start, file.offset + stop), pa.int64()),
                                       "data": array_column(rows)})


def array_column(rows: np.ndarray) -> pa.Array:
    """Rows of an array as an Arrow column: scalars, fixed-size lists (1-d rows) or fixed-shape tensors."""
    rows = np.ascontiguousarray(rows)
    if rows.ndim == 1:
        return pa.array(rows)
    if rows.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), rows.shape[1])
    return pa.FixedShapeTensorArray.from_numpy_ndarray(rows)
