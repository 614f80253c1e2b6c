"""How long the head takes to stage a shard's outputs (farm.head.arrivals.stage: the upload's Arrow IPC stream to a
Parquet file), as it does now (row groups of ROW_GROUP_BYTES, dictionaries for text columns only) against what it did
before: pyarrow's default dictionaries on every column, in 8 MiB row groups, or in one row group a batch. The head
counts a node's device free only once this is done, so it is on the device's path between shards.

    PYTHONPATH=.:agents python benchmarks/stage_outputs.py [--rows 1032192] [--batch 4096] [--width 16] [--repeat 2]

The stream: --rows rows of a row id and --width float32 outputs in batches of --batch rows, fed from a thread in
1 MiB parts as a node sends them. 2026-12-06, the 2-core dev box, defaults: one row group a batch 0.95-1.11 s (252
groups), row groups of 8 MiB 0.47-0.53 s (9 groups); again at commit: 0.92-0.94 s and 0.45 s. On an H100 host (16
cores): 1.65, 1.37 s and 0.65, 0.86 s. Dictionaries for text columns only (the 2-core box, three runs each): 0.30 s
against 0.47-0.49 s with every column's.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from farm.data.batches import output_column
from farm.head import arrivals


def stream(rows: int, batch: int, width: int) -> bytes:
    sink = pa.BufferOutputStream()
    rng = np.random.default_rng(0)
    for start in range(0, rows, batch):
        stop = min(start + batch, rows)
        table = pa.table({"row_id": pa.array(np.arange(start, stop), pa.int64()),
                          "output": output_column(rng.random((stop - start, width), dtype=np.float32))})
        if start == 0:
            writer = pa.ipc.new_stream(sink, table.schema)
        writer.write_table(table)
    writer.close()
    return sink.getvalue().to_pybytes()


def staged(data: bytes, path: Path) -> tuple[float, int]:
    pipe = arrivals.Pipe()

    def feed() -> None:
        for start in range(0, len(data), 1 << 20):
            pipe.put(data[start:start + (1 << 20)])
        pipe.put(None)

    began = time.perf_counter()
    feeder = threading.Thread(target=feed)
    feeder.start()
    arrivals.stage(pipe, path)
    feeder.join()
    return time.perf_counter() - began, pq.ParquetFile(path).metadata.num_row_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_032_192)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    data = stream(args.rows, args.batch, args.width)
    grouped, text_only = arrivals.ROW_GROUP_BYTES, arrivals.parquet_writer
    every_column = lambda path, schema: pq.ParquetWriter(path, schema)  # noqa: E731 - pyarrow's default
    print("| row groups | dictionaries | runs s | groups |\n|---|---|---|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for name, size, writer, which in (("one a batch", 1, every_column, "every column"),
                                          (f"{grouped // 2**20} MiB", grouped, every_column, "every column"),
                                          (f"{grouped // 2**20} MiB", grouped, text_only, "text columns only")):
            arrivals.ROW_GROUP_BYTES, arrivals.parquet_writer = size, writer
            runs = [staged(data, Path(folder) / "shard.parquet") for _ in range(args.repeat)]
            print(f"| {name} | {which} | {', '.join(f'{s:.2f}' for s, _ in runs)} | {runs[-1][1]} |")
    arrivals.ROW_GROUP_BYTES, arrivals.parquet_writer = grouped, text_only


if __name__ == "__main__":
    main()
