"""Dataset formats: one module per format, each planning a dataset (its files and units, without reading data) and
streaming Arrow record batches of a range of it. Chosen by farm.core.dataset.DataFormat from FORMATS.

A format module has:
    plan(fs, root) -> (files: list[(path, units)], columns, rows or None)
    read(fs, root, location, pieces, columns, batch_rows, workers=1) -> Iterator[pyarrow.RecordBatch]
        pieces: (DataFile, first, end) in file units; every batch has `row_id` (int64, the row's place in the
        dataset) and the columns asked for (all when None); a malformed input raises DataError naming file and row.
        workers: the CPUs the reader may decode on (the shard's threads), for a format whose parts decode apart
        (Parquet's row groups); the others read in the calling thread.
"""

from __future__ import annotations

from types import ModuleType

from farm.core.dataset import DataFormat
from farm.data.formats import csv, hf, images, jsonl, npy, parquet, text

FORMATS: dict[DataFormat, ModuleType] = {
    DataFormat.PARQUET: parquet, DataFormat.JSONL: jsonl, DataFormat.CSV: csv, DataFormat.TEXT: text,
    DataFormat.IMAGES: images, DataFormat.NPY: npy, DataFormat.HF: hf,
}
