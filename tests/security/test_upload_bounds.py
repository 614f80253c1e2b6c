"""Finding 2: a shard's upload was unbounded. A 1 GiB batch was held whole by the head (1.1 GB to 4.1 GB), and 8.6
billion rows were written before the row check refused them. Now a batch's size is checked from its message header
before its body is read, and the upload is refused at the first batch past its range, or past the bytes its range
takes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from farm.core.errors import FarmError
from farm.core.models import Shard
from farm.core.tasks import ShardFigures
from farm.head import arrivals
from farm.head.kinds.inference import Inference
from farm.head.settings import HeadSettings
from farm.proto.v1 import result_pb2
from tests.uploads import parts


def staging_for(tmp_path: Path, rows: int) -> Path:
    """Where the head stages shard 0's table, for a range of `rows` rows: as the inference kind makes it."""
    job = SimpleNamespace(output=str(tmp_path / "out"), shards=[Shard(index=0, start=0, stop=rows)])
    return Inference(HeadSettings(state_dir=tmp_path / "state")).staging(job, 0)  # type: ignore[arg-type]


class Counted:
    """An upload's parts as a node would send them, counting how many the head took."""

    def __init__(self, sent: Iterator[result_pb2.UploadPart]) -> None:
        self.sent = sent
        self.taken = 0

    async def __aiter__(self) -> AsyncIterator[result_pb2.UploadPart]:
        for part in self.sent:
            self.taken += 1
            yield part


def endless_rows(batches: int, rows: int) -> Iterator[result_pb2.UploadPart]:
    """`batches` batches of `rows` rows each, then figures claiming them all."""
    for b in range(batches):
        yield from parts([pa.table({"row_id": list(range(b * rows, (b + 1) * rows))})])
    yield from parts([], ShardFigures(items=batches * rows, seconds=0.1))


def test_an_upload_is_refused_at_the_first_batch_past_its_range(tmp_path: Path) -> None:
    staging = staging_for(tmp_path, rows=10)
    upload = Counted(endless_rows(batches=2_000, rows=10))
    with pytest.raises(FarmError, match="rows"):
        asyncio.run(asyncio.wait_for(arrivals.receive(upload, staging, lambda: True), 60))
    assert upload.taken < 100  # not the 2,000 batches: the pipe's few parts ahead of the writer at most
    assert not list((tmp_path / "out").iterdir())  # nothing staged is left


def test_a_batch_larger_than_a_message_may_be_is_refused_before_its_body_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrivals, "MAX_IPC_MESSAGE", 1024 * 1024, raising=False)  # 256 MiB, made small for a test
    staging = staging_for(tmp_path, rows=10_000_000)
    big = pa.table({"row_id": list(range(500_000))})  # 4 MB in one batch
    upload = Counted(iter(parts([big], ShardFigures(items=500_000, seconds=0.1))))
    with pytest.raises(FarmError, match="message"):
        asyncio.run(arrivals.receive(upload, staging, lambda: True))


def test_bytes_past_what_the_range_takes_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrivals, "MAX_ROW_BYTES", 1024, raising=False)
    monkeypatch.setattr(arrivals, "SLACK_BYTES", 0, raising=False)
    staging = staging_for(tmp_path, rows=10)
    fat = pa.table({"row_id": list(range(10)), "blob": [b"x" * 100_000] * 10})  # 10 rows of 100 KB
    with pytest.raises(FarmError, match="MiB|bytes"):
        asyncio.run(arrivals.receive(Counted(iter(parts([fat], ShardFigures(items=10, seconds=0.1)))), staging,
                                     lambda: True))


def test_a_table_within_its_range_arrives(tmp_path: Path) -> None:
    staging = staging_for(tmp_path, rows=20)
    arrived = asyncio.run(arrivals.receive(Counted(endless_rows(batches=2, rows=10)), staging, lambda: True))
    assert arrived.table is not None and arrived.table.rows == 20


def test_a_lenders_one_row_batches_are_held_a_bounded_number_at_a_time(tmp_path: Path) -> None:
    """The head holds a shard's batches until they fill a row group (arrivals.ROW_GROUP_BYTES): bounded in bytes
    alone, a lender's one-row batches would have it hold a million tables. At most HELD_BATCHES are held."""
    import pyarrow.parquet as pq

    from farm.core.dataset import ROW_ID

    rows = 3 * arrivals.HELD_BATCHES + 5
    batches = [pa.table({ROW_ID: pa.array([i], pa.int64()), "output": [float(i)]}) for i in range(rows)]
    arrived = asyncio.run(arrivals.receive(_stream(parts(batches, ShardFigures(items=rows, seconds=0.1))),
                                           staging_for(tmp_path, rows), lambda: True))
    assert arrived.table is not None and arrived.table.rows == rows
    assert pq.ParquetFile(arrived.table.path).metadata.num_row_groups == 4  # written every HELD_BATCHES


async def _stream(sent: list[result_pb2.UploadPart]) -> AsyncIterator[result_pb2.UploadPart]:
    for part in sent:
        yield part


def test_a_node_that_says_its_shard_took_no_time_grows_at_most_16x() -> None:
    """A device's shard grows to 1/4 of its floor at its speed, and its speed is its node's word (the shards'
    seconds): a node saying its first shard took a microsecond would be handed the job's rows in its second."""
    from farm.scheduler.sizing import size_for
    from farm.scheduler.types import Rate

    liar = Rate(items_per_s=256 / 1e-6, max_items=256, samples=1)
    rows, why = size_for(liar, 0.1, 64)  # NVML's 100 ms steps: a floor of 2 s
    assert rows == 16 * 256 and "growing 16x from 256" in why
