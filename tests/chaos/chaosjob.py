"""Job code for the fault tests: a model slow enough that kills land mid-shard, and one that kills its own worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import torch

ITEMS = 400  # 200 shards of 2 items
DELAY_S = 0.2  # per batch: a shard of one batch takes about this long on a warm worker


class Sleeper(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(DELAY_S)
        return x * 2


class WorkerKiller(torch.nn.Module):
    """Ends its worker process as a native crash would: a message on stderr, then SIGSEGV."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        os.write(2, b"native library: giving up\n")
        os.kill(os.getpid(), signal.SIGSEGV)
        return x


def sleeper() -> torch.nn.Module:
    return Sleeper()


def worker_killer() -> torch.nn.Module:
    return WorkerKiller()


def numbers() -> np.ndarray:
    return np.arange(ITEMS * 2, dtype=np.float32).reshape(ITEMS, 2)


def write_parquet(folder: Path, files: int = 4) -> None:
    """numbers() as a Parquet folder on the head's machine: column `x`, two float32 a row, small row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for part, rows in enumerate(np.array_split(numbers(), files)):
        x = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), 2)
        pq.write_table(pa.table({"x": x}), folder / f"part-{part}.parquet", row_group_size=10)
