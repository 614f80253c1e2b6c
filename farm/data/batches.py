"""Between Arrow and the model: a stream of record batches re-cut to the job's batch size, a batch as the NumPy
arrays the preprocess or the model reads, and the model's outputs back as Arrow columns of the shard's results."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from farm.core.dataset import ROW_ID, DataFormat
from farm.core.errors import DataError, FarmError


def rebatch(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The same rows in batches of exactly `rows` (the last one shorter); memory: about one batch."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - count, batch.num_rows)
            held.append(batch.slice(0, take))
            batch = batch.slice(take)
            count += take
            if count == rows:
                yield _concat(held)
                held, count = [], 0
    if count:
        yield _concat(held)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    table = pa.Table.from_batches(batches) if len({b.schema for b in batches}) == 1 else pa.concat_tables(
        [pa.Table.from_batches([b]) for b in batches], promote_options="permissive")
    return table.combine_chunks().to_batches()[0]


def column_to_numpy(column: pa.Array | pa.ChunkedArray, name: str, row_ids: Sequence[int], where: str) -> np.ndarray:
    """A column as one array: numbers as they are; fixed-size lists and fixed-shape tensors as [N, ...]; lists of
    one length stacked; strings and bytes as an object array (for a preprocess: a tokenizer, a decoder)."""
    if isinstance(column, pa.ChunkedArray):  # one chunk (a table read whole): its array as it is, not a copy
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if column.null_count:
        first = next(i for i, valid in enumerate(column.is_valid().to_pylist()) if not valid)
        raise DataError(f"{where} (row {row_ids[first]}): column {name!r} is empty (null)")
    if isinstance(column.type, pa.FixedShapeTensorType):
        return column.to_numpy_ndarray()
    if pa.types.is_fixed_size_list(column.type):
        inner = column_to_numpy(column.flatten(), name, row_ids, where)
        return inner.reshape(len(column), column.type.list_size, *inner.shape[1:])
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = np.diff(column.offsets.to_numpy())
        flat = column.flatten()
        if len(lengths) and (lengths == lengths[0]).all() and not flat.null_count:
            # lists of one length (vectors as Parquet often stores them): read as fixed-size lists, without a copy
            inner = column_to_numpy(flat, name, row_ids, where)
            return inner.reshape(len(column), int(lengths[0]), *inner.shape[1:])
        rows = [np.asarray(value) for value in column.to_pylist()]
        shapes = {r.shape for r in rows}
        if len(shapes) > 1:
            first = next(i for i, r in enumerate(rows) if r.shape != rows[0].shape)
            raise DataError(f"{where} (row {row_ids[first]}): column {name!r} holds {rows[first].shape} where "
                            f"the rows before hold {rows[0].shape}")
        return np.stack(rows) if rows else np.empty((0,))
    return column.to_numpy(zero_copy_only=False)


class RowIds(Sequence[int]):
    """A batch's row ids for error messages, read from Arrow only when one is named (not a list made per batch)."""

    def __init__(self, column: pa.Array) -> None:
        self.column = column

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, index):
        return self.column[index].as_py() if isinstance(index, int) else self.column[index].to_pylist()


def numpy_batches(batches: Iterable[pa.RecordBatch], columns: Iterable[str], fmt: DataFormat, where: str,
                  workers: int = 1, ahead: int = 1) -> Iterator[tuple[pa.RecordBatch, dict[str, np.ndarray]]]:
    """Each batch, in order, with its `columns` as NumPy arrays (a preprocess's argument, as Ray Data's map_batches
    gives it): numbers, fixed-size lists and tensors without a copy; an image folder's `image` decoded here, on the
    node, on `workers` threads or processes (the CPUs the node lends this worker), `ahead` batches at once."""
    columns = list(columns)
    decoded: Iterable[tuple[pa.RecordBatch, np.ndarray | None]]
    if fmt is DataFormat.IMAGES and "image" in columns:
        from farm.data.formats.images import decode_images

        decoded = decode_images(where, batches, workers, ahead)
    else:
        decoded = ((batch, None) for batch in batches)
    for batch, images in decoded:
        row_ids = RowIds(batch.column(ROW_ID))
        yield batch, {name: images if images is not None and name == "image"
                      else column_to_numpy(batch.column(name), name, row_ids, where) for name in columns}


def numpy_batch(batch: pa.RecordBatch, columns: Iterable[str], fmt: DataFormat, where: str, workers: int = 1
                ) -> dict[str, np.ndarray]:
    """One batch's numpy_batches."""
    return next(numpy_batches([batch], columns, fmt, where, workers))[1]


def model_inputs(arrays: dict[str, np.ndarray], columns: tuple[str, ...], where: str,
                 preprocess: Callable[[dict[str, np.ndarray]], Any] | None, preprocess_name: str = "") -> np.ndarray:
    """What the model reads for a batch: the preprocess's result, else the input column(s) as one array of numbers
    (several columns side by side; float64 made float32, PyTorch's default).

    The preprocess is the job's code: what it raises (or a result of the wrong length) fails the job, as the model's
    errors do, not only this batch's shard; it may raise DataError itself for a row it finds malformed."""
    rows = len(next(iter(arrays.values()))) if arrays else 0
    if preprocess is not None:
        try:
            value = preprocess(arrays)
        except DataError:
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise FarmError(f"preprocess {preprocess_name!r} raised {type(exc).__name__}: {first} (on a batch of "
                            f"{where})") from None
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        inputs = np.asarray(value)
        if inputs.ndim == 0 or len(inputs) != rows:
            raise FarmError(f"preprocess {preprocess_name!r} returned {inputs.shape} for a batch of {rows} rows")
        return inputs
    parts = [arrays[c] for c in columns]
    for name, part in zip(columns, parts):
        if part.dtype.kind not in "biuf":
            raise DataError(f"{where}: column {name!r} holds {part.dtype} values, not numbers: give the dataset a "
                            "preprocess that turns them into the model's inputs")
    inputs = parts[0] if len(parts) == 1 else np.stack(parts, axis=1)
    return inputs.astype(np.float32) if inputs.dtype == np.float64 else inputs


def output_column(outputs: np.ndarray) -> pa.Array:
    """The model's outputs for a batch: scalars, fixed-size lists (one vector a row) or fixed-shape tensors."""
    outputs = np.ascontiguousarray(outputs)
    if outputs.ndim == 1:
        return pa.array(outputs)
    if outputs.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(outputs.reshape(-1)), outputs.shape[1])
    return pa.FixedShapeTensorArray.from_numpy_ndarray(outputs)


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    with pa.ipc.open_stream(pa.BufferReader(data)) as reader:
        return reader.read_all()


def concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of one shard or job, whose inferred column types may differ (an integer column in one JSON batch,
    a float one in the next): widened to one schema."""
    return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({ROW_ID: pa.array(
        [], pa.int64())})
