"""An output folder opens as a Parquet dataset as it is (issue 28, item 5): the manifest is `_manifest.json`, a name
dataset readers skip, and an output written before the rename (`manifest.json`) still reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from farm.core.dataset import ROW_ID
from farm.data.batches import output_column
from farm.data.results import MANIFEST, OLD_MANIFEST, Results, read_predictions, shard_file


def _write_job(folder: Path) -> Results:
    results = Results(str(folder))
    for index in range(3):
        ids = np.arange(index * 4, index * 4 + 4)
        results.write_table(index, pa.table({ROW_ID: pa.array(ids, pa.int64()),
                                             "output": output_column(np.stack([ids, -ids], 1).astype(np.float32))}))
    results.write_manifest({"format": "parquet", "shards": [{"index": i, "file": shard_file(i)} for i in range(3)]})
    return results


def test_an_output_folder_opens_with_pyarrow_dataset_and_pandas_as_written(tmp_path: Path) -> None:
    _write_job(tmp_path / "out")
    assert (tmp_path / "out" / MANIFEST).is_file() and MANIFEST.startswith("_")
    table = ds.dataset(tmp_path / "out", format="parquet").to_table()
    assert sorted(table.column(ROW_ID).to_pylist()) == list(range(12))  # each row once
    frame = pd.read_parquet(tmp_path / "out")
    assert len(frame) == 12 and frame[ROW_ID].is_unique
    assert read_predictions(tmp_path / "out")[:, 1].tolist() == [-float(i) for i in range(12)]


def test_an_output_written_before_the_rename_still_reads(tmp_path: Path) -> None:
    results = _write_job(tmp_path / "old")
    (tmp_path / "old" / MANIFEST).rename(tmp_path / "old" / OLD_MANIFEST)
    assert [name for name, _ in results.files()] == [OLD_MANIFEST, *(shard_file(i) for i in range(3))]
    with results.open(OLD_MANIFEST) as handle:
        assert json.loads(handle.read())["format"] == "parquet"
    assert read_predictions(tmp_path / "old")[:, 0].tolist() == [float(i) for i in range(12)]
    assert pq.read_table(tmp_path / "old" / shard_file(0)).num_rows == 4
