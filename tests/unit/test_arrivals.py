"""A shard's upload as the head reads it (farm.head.arrivals): the table's Arrow IPC stream written to Parquet as it
comes, widened where a later batch's inferred types differ; anything else a node could send is refused, and nothing
of it is left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm.core.tasks import ShardFigures
from farm.head import arrivals
from farm.head.arrivals import Arrival, BadUpload, Void
from farm.proto.v1 import result_pb2
from tests.uploads import parts, stream


def receive(sent: list[result_pb2.UploadPart], staging: Path | None, wanted: bool = True) -> Arrival:
    return asyncio.run(arrivals.receive(stream(sent), staging, lambda: wanted))


def test_a_table_whose_types_widen_batch_by_batch_is_one_parquet_file(tmp_path: Path) -> None:
    staging = tmp_path / ".shard-00000.parquet.x"
    batches = [pa.table({"row_id": [0, 1], "score": [1, 2]}), pa.table({"row_id": [2], "score": [2.5]}),
               pa.table({"row_id": [3], "score": [4.0], "note": ["late"]})]
    arrived = receive(parts(batches, ShardFigures(items=4, seconds=0.1)), staging)
    assert arrived.table is not None and arrived.table.rows == 4 and arrived.figures is not None
    table = pq.read_table(arrived.table.path)
    assert table.column("score").to_pylist() == [1.0, 2.0, 2.5, 4.0]
    assert table.column("note").to_pylist() == [None, None, None, "late"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [arrived.table.path.name]


def test_a_shards_small_batches_go_in_full_parts_and_land_in_few_row_groups(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A small model's outputs come in many batches of a few hundred kilobytes: one part and one Parquet row group
    each made the head's writing the shard's bottleneck (252 row groups for a million rows of 16 floats)."""
    import numpy as np

    from farm.data.batches import output_column
    from farm_agent.work import upload

    monkeypatch.setattr(upload, "CHUNK", 64 * 1024)
    monkeypatch.setattr(arrivals, "ROW_GROUP_BYTES", 1024 * 1024)
    batches = [pa.table({"row_id": pa.array(np.arange(i * 200, (i + 1) * 200), pa.int64()),
                         "output": output_column(np.full((200, 16), i, np.float32))}) for i in range(200)]
    sent = parts(batches, ShardFigures(items=40_000, seconds=0.1))
    tables = [p.table for p in sent if p.WhichOneof("part") == "table"]
    assert all(len(t) == 64 * 1024 for t in tables[:-1]) and len(tables) < len(batches)  # ~2.9 MB in 64 KiB parts
    arrived = receive(sent, tmp_path / ".shard-00000.parquet.x")
    assert arrived.table is not None and arrived.table.rows == 40_000
    written = pq.ParquetFile(arrived.table.path)
    assert written.metadata.num_row_groups == 3  # 1 MiB each (~14,600 rows of 72 bytes), not 200
    assert written.read().column("row_id").to_pylist() == list(range(40_000))


def test_only_text_columns_are_dictionary_encoded(tmp_path: Path) -> None:
    """A model's float outputs and the row ids rarely repeat: trying their dictionaries first took 40 % of the time a
    million rows of 16 floats took to stage."""
    import numpy as np

    from farm.data.batches import output_column

    rows = 5_000
    batch = pa.table({"row_id": pa.array(np.arange(rows), pa.int64()), "label": ["cat", "dog"] * (rows // 2),
                      "output": output_column(np.random.default_rng(0).standard_normal((rows, 4), np.float32))})
    arrived = receive(parts([batch], ShardFigures(items=rows, seconds=0.1)), tmp_path / ".shard-00000.parquet.x")
    assert arrived.table is not None
    group = pq.ParquetFile(arrived.table.path).metadata.row_group(0)
    encoded = {group.column(i).path_in_schema: group.column(i).has_dictionary_page for i in range(group.num_columns)}
    assert encoded == {"row_id": False, "label": True, "output.list.element": False}
    assert pq.read_table(arrived.table.path).equals(batch)


@pytest.mark.parametrize("upload, why", [
    ([result_pb2.UploadPart(table=b"not arrow at all, not at all"),
      result_pb2.UploadPart(figures=result_pb2.ShardFigures(items=1))], "not an Arrow IPC stream"),
    (parts([], ShardFigures(items=1, seconds=0.1)) * 2, "after its last one"),
    ([], "ended without its figures"),
    (parts([], ShardFigures(items=-1, seconds=0.1)), "out of range"),
])
def test_what_no_shard_sends_is_refused_and_leaves_nothing(tmp_path: Path, upload: list[result_pb2.UploadPart],
                                                           why: str) -> None:
    staging = tmp_path / ".shard-00000.parquet.x"
    staging.touch()
    with pytest.raises(Exception, match=why):
        receive(upload, staging)
    assert list(tmp_path.iterdir()) == []


def test_a_kind_that_takes_no_table_refuses_one() -> None:
    with pytest.raises(BadUpload, match="carries a table"):
        receive(parts([pa.table({"row_id": [0]})], ShardFigures(items=1, seconds=0.1)), None)


def test_an_attempt_taken_back_while_it_arrives_keeps_nothing(tmp_path: Path) -> None:
    staging = tmp_path / ".shard-00000.parquet.x"
    staging.touch()
    with pytest.raises(Void):
        receive(parts([pa.table({"row_id": [0]})], ShardFigures(items=1, seconds=0.1)), staging, wanted=False)
    assert list(tmp_path.iterdir()) == []


def test_a_failure_is_sorted_as_its_node_sent_it(tmp_path: Path) -> None:
    failure = result_pb2.ShardFailure(kind=result_pb2.ShardFailure.DATA, message="d.csv (row 3): bad\nmore",
                                      traceback="Traceback ...", log="printed")
    arrived = receive(parts([pa.table({"row_id": [0]})], failure=failure), tmp_path / "staged")
    assert arrived.failure is not None and arrived.failure.data and not arrived.failure.node
    assert (arrived.failure.message, arrived.log, arrived.traceback) == ("d.csv (row 3): bad", "printed",
                                                                        "Traceback ...")
    assert list(tmp_path.iterdir()) == []


def test_a_worker_ended_by_ray_is_its_nodes_failure_not_the_jobs() -> None:
    """Ray ends a worker whose raylet went (a node stopping, a head killed) with SystemExit(1) inside its task: sent
    as the job's failure, it failed the chaos test's whole job after a head kill. The node's: the shard runs again."""
    from farm.core.errors import DataError
    from farm.proto.v1 import result_pb2
    from farm_agent.work.upload import failure_of

    assert failure_of(SystemExit(1)).kind == result_pb2.ShardFailure.NODE
    assert failure_of(ValueError("bad")).kind == result_pb2.ShardFailure.JOB
    assert failure_of(DataError("rows 3-4 do not read")).kind == result_pb2.ShardFailure.DATA
