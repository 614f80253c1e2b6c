"""A job's results from its head, from anywhere the API token reaches it: streamed as Arrow record batches
(`stream`), or downloaded into a folder with resumption (`download`).

Results travel as the Parquet files the head keeps (one per finished shard), over DataService.ReadResult in chunks:
a download broken off resumes at the byte where it stopped (each file goes to a hidden `.NAME.part` until whole).
"""

from __future__ import annotations

import io
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from farm.core.dataset import ROW_ID
from farm.core.errors import FarmError, UserError
from farm.proto.v1 import data_pb2, data_pb2_grpc

if TYPE_CHECKING:
    import pandas
    import pyarrow as pa

    from farm.client.api import Client

FORMATS = ("parquet", "jsonl", "npy")


def _stub(client: Client) -> data_pb2_grpc.DataServiceStub:
    return data_pb2_grpc.DataServiceStub(client.channel)


def listing(client: Client, job_id: str) -> data_pb2.ListResultsReply:
    """The job's state and its result files so far."""
    try:
        return _stub(client).ListResults(data_pb2.ListResultsRequest(job_id=job_id), metadata=client.metadata,
                                         timeout=client.timeout)
    except grpc.RpcError as exc:
        raise client._error(exc) from None


def chunks(client: Client, job_id: str, name: str, offset: int = 0) -> Iterator[bytes]:
    """One result file's bytes from `offset` on."""
    request = data_pb2.ReadResultRequest(job_id=job_id, name=name, offset=offset)
    try:
        for chunk in _stub(client).ReadResult(request, metadata=client.metadata):
            yield chunk.data
    except grpc.RpcError as exc:
        raise client._error(exc) from None


def _shards(reply: data_pb2.ListResultsReply) -> list[data_pb2.ResultFile]:
    return sorted((f for f in reply.files if f.shard >= 0), key=lambda f: f.shard)


class ResultBatches:
    """A job's results as Arrow record batches, shard by shard (each shard's rows in row order), as they are read:
    one shard file in memory at a time. `to_table()` and `to_pandas()` gather them all, in row order."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.job_id = job_id

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        for file in _shards(listing(self.client, self.job_id)):
            data = b"".join(chunks(self.client, self.job_id, file.name))
            yield from pq.read_table(io.BytesIO(data)).to_batches()

    def to_table(self) -> pa.Table:
        import pyarrow as pa

        from farm.data.batches import concat

        table = concat([pa.Table.from_batches([b]) for b in self])
        return table.sort_by(ROW_ID) if table.num_rows else table

    def to_pandas(self) -> pandas.DataFrame:
        return self.to_table().to_pandas()


def stream(client: Client, job_id: str) -> ResultBatches:
    return ResultBatches(client, job_id)


@dataclass
class Download:
    state: str  # the job's state when the listing was taken
    files: list[Path]  # the result files now whole in the folder
    fetched: int  # bytes transferred by this call (a resumed file's earlier bytes not counted)
    total: int  # bytes of the listed files


class HostileHeadError(FarmError):
    """The head answered what no Farm head sends (a file name with a path in it, more bytes than it listed)."""


def plain_name(name: str) -> str:
    """A result file's name as the head listed it, refused unless it is a plain name: the head decides what files
    come, never where they land (a fake or compromised head once sent `../../.bashrc`)."""
    if (not name or len(name) > 255 or name.startswith(".") or os.path.basename(name) != name or "\\" in name
            or "\0" in name or not name.isprintable()):
        raise HostileHeadError(f"the head sent a result file name that is not a plain file name: {name[:80]!r}")
    return name


def download(client: Client, job_id: str, out: Path,
             on_bytes: Callable[[int, int], None] = lambda done, total: None) -> Download:
    """Fetch the job's result files into `out`: those already whole there are kept, a partial one resumes where it
    stopped. `on_bytes(done, total)` follows the transfer (a progress bar). Every name is checked before anything
    is written (all in `out`, none a path), and no file is written through a link."""
    reply = listing(client, job_id)
    names = [plain_name(f.name) for f in reply.files]
    if any(f.size < 0 for f in reply.files):
        raise HostileHeadError("the head listed a result file of negative size")
    out.mkdir(parents=True, exist_ok=True)
    total = sum(f.size for f in reply.files)
    done = fetched = 0
    whole = []
    for file, name in zip(reply.files, names):
        target = out / name
        if _regular_size(target) == file.size:
            done += file.size
            on_bytes(done, total)
            whole.append(target)
            continue
        partial = out / f".{name}.part"
        # Not following a link planted as the partial file (it would write wherever the link points).
        fd = _open_nofollow(partial)
        with os.fdopen(fd, "r+b") as handle:
            offset = os.fstat(fd).st_size
            if offset > file.size:  # a different file of that name: start again
                offset = 0
            done += offset
            handle.seek(offset)
            handle.truncate()
            written = offset
            for data in chunks(client, job_id, name, offset):
                written += len(data)
                if written > file.size:  # what it sends is bounded by what it listed
                    raise HostileHeadError(f"the head sent more of {name} than the {file.size} bytes it listed")
                handle.write(data)
                done += len(data)
                fetched += len(data)
                on_bytes(done, total)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, target)  # replaces a link at `target` itself, never what it points to
        whole.append(target)
    return Download(state=reply.state, files=whole, fetched=fetched, total=total)


def _regular_size(path: Path) -> int | None:
    """The size of `path` if it is a regular file itself (not a link to one)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _open_nofollow(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise UserError(f"cannot write {path} (a link there is not followed): {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{path} is not a regular file: remove it")
    return fd


def convert(out: Path, fmt: str) -> Path | None:
    """The downloaded shards of `out` written as one file of another format, in row order: results.jsonl (one
    object a row) or results.npy (the model's outputs; row_ids.npy beside it). None for parquet (kept as it is)."""
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        return None
    from farm.data.batches import column_to_numpy
    from farm.data.results import OUTPUT, Results

    table = Results(str(out.resolve())).read_table()
    if fmt == "jsonl":
        target = out / "results.jsonl"
        with target.open("w") as handle:
            for batch in table.to_batches():
                for row in batch.to_pylist():
                    handle.write(json.dumps(row, default=_plain) + "\n")
        return target
    import numpy as np

    ids = table.column(ROW_ID).to_pylist()
    np.save(out / "row_ids.npy", np.asarray(ids, dtype=np.int64))
    np.save(out / "results.npy", column_to_numpy(table.column(OUTPUT), OUTPUT, ids, str(out)), allow_pickle=False)
    return out / "results.npy"


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        import base64

        return base64.b64encode(value).decode()
    return str(value)
