"""A job's results: one Parquet file per shard (row_id, the passthrough columns, the model's `output`) and
_manifest.json once every shard is in, at the job's output location: a folder on the head's machine (the default) or
an S3-compatible bucket (s3://bucket/prefix, with the head's own credentials from its environment).

Each file is written once, whole: on a disk through a hidden temporary file, fsync and rename; in a bucket as one
PUT (an object appears whole or not at all). The head writes a shard's file only after claiming its result (farm.head
dispatch), so a shard's file is written exactly once.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from farm.core.dataset import ROW_ID
from farm.data.batches import column_to_numpy
from farm.data.locations import filesystem, is_local, join

# `_`-prefixed, as dataset readers (pyarrow.dataset, pandas.read_parquet, Spark) skip it: an output folder opens as a
# Parquet dataset as it is. Outputs written before the rename have OLD_MANIFEST, still read.
MANIFEST = "_manifest.json"
OLD_MANIFEST = "manifest.json"
MANIFESTS = (MANIFEST, OLD_MANIFEST)
FORMAT = "parquet"
OUTPUT = "output"  # the model's outputs' column
SHARD_FILE = re.compile(r"^shard-(\d{5,})\.parquet$")
# How the temporary files of unfinished writes start (".shard-00007.parquet.k3j_a9", "._manifest.json.x81q"): hidden,
# and never a finished file's name.
PARTIAL_PREFIXES = (".shard-", f".{MANIFEST}.", f".{OLD_MANIFEST}.")


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file whole or not at all: a hidden temporary file beside it, fsynced, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)  # readers see the whole file or none of it
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_result_file(name: str) -> bool:
    return bool(SHARD_FILE.match(name)) or name in MANIFESTS


def shard_file(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


class Results:
    """The result files of one job at its output location."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.fs, self.root = filesystem(output)
        self.local = is_local(self.fs)

    def _write(self, name: str, data: bytes) -> None:
        path = join(self.root, name)
        if self.local:
            atomic_write(Path(path), data)
        else:
            self.fs.pipe_file(path, data)

    def staging(self, index: int) -> Path:
        """Where a shard's table is written as it arrives, before `commit_shard`: a hidden file beside its final one
        (one rename away; removed as partial by a head that restarts), or a local temporary file for a bucket."""
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            fd, path = tempfile.mkstemp(dir=self.root, prefix=f".{shard_file(index)}.")
        else:
            fd, path = tempfile.mkstemp(prefix=f".{shard_file(index)}.")
        os.close(fd)
        return Path(path)

    def commit_shard(self, index: int, staged: Path) -> None:
        """A staged shard file (written and fsynced) made the shard's file, whole: renamed over it on a disk, one PUT
        to a bucket (an object appears whole or not at all)."""
        target = join(self.root, shard_file(index))
        if self.local:
            os.replace(staged, target)
            return
        try:
            self.fs.put_file(str(staged), target)
        finally:
            staged.unlink(missing_ok=True)

    def write_table(self, index: int, table: pa.Table) -> None:
        self._write(shard_file(index), parquet_bytes(table))

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self._write(MANIFEST, json.dumps(manifest, indent=2).encode())

    def remove_manifest(self) -> None:
        """The manifest gone (its job runs again: its results are not complete until it is written anew)."""
        for name in MANIFESTS:
            path = join(self.root, name)
            if self.local:
                Path(path).unlink(missing_ok=True)
            elif self.fs.exists(path):
                self.fs.rm_file(path)

    def remove_partial_files(self) -> int:
        """Remove the temporary files of writes that never finished (a head killed mid-write); how many. Only for
        a job with no write in flight: at the head's start, before it runs anything. (A bucket has none.)"""
        folder = Path(self.root)
        if not self.local or not folder.is_dir():
            return 0
        partial = [p for p in folder.iterdir() if p.name.startswith(PARTIAL_PREFIXES) and p.is_file()]
        for path in partial:
            path.unlink(missing_ok=True)
        return len(partial)

    def files(self) -> list[tuple[str, int]]:
        """(name, size) of the finished result files: the shards' and the manifest, sorted."""
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "file" and is_result_file(name):
                found.append((name, int(entry["size"])))
        return sorted(found)

    def open(self, name: str) -> IO[bytes]:
        if not is_result_file(name):
            raise FileNotFoundError(name)
        return self.fs.open(join(self.root, name), "rb")

    def read_table(self) -> pa.Table:
        """Every finished shard's rows, in row order."""
        from farm.data.batches import concat

        tables = []
        for name, _ in self.files():
            if SHARD_FILE.match(name):
                with self.open(name) as handle:
                    tables.append(pq.read_table(handle))
        table = concat(tables)
        return table.sort_by(ROW_ID) if table.num_rows else table


def outputs_array(table: pa.Table, where: str = "results") -> np.ndarray:
    """A results table's `output` column as one array, in the table's row order."""
    return column_to_numpy(table.column(OUTPUT), OUTPUT, table.column(ROW_ID).to_pylist(), where)


def read_predictions(output: Path | str) -> np.ndarray:
    """Every shard's outputs joined back in input order (a job's whole results: its manifest must be there)."""
    results = Results(str(output))
    if not any(name in MANIFESTS for name, _ in results.files()):
        raise FileNotFoundError(join(results.root, MANIFEST))
    return outputs_array(results.read_table(), str(output))
