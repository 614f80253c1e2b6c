"""What a head finds when it starts again after a SIGKILL, and a result that arrives as its node is lost: a real store
(SQLite) and real output files, the head's dispatcher without Ray (none of these paths call it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm.core.models import BackendName, BackendOffer, Hardware, JobState, Node, ShardState
from farm.core.tasks import ShardFigures
from farm.head.attempts import Running
from farm.head.dispatch import Dispatcher
from farm.data.batches import output_column
from farm.data.results import Results, read_predictions
from farm.head.settings import HeadSettings
from farm.head.store import Store
from tests.uploads import parts, stream

SPEC = "name: toy\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshards: 3\n"
HW = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)
RANGES = [(0, 2), (2, 4), (4, 6)]


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    opened = Store(tmp_path / "state.db")
    opened.upsert_node("n-1", "box", HW, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.1", "hash")
    return opened


def node(store: Store) -> Node:
    (found,) = store.nodes()
    return found


def outputs(index: int) -> np.ndarray:
    start, stop = RANGES[index]
    return np.arange(start * 2, stop * 2, dtype=np.float32).reshape(-1, 2)


def results(index: int) -> pa.Table:
    """A shard's results as its node makes them: row ids and outputs."""
    start, stop = RANGES[index]
    return pa.table({"row_id": pa.array(range(start, stop), pa.int64()), "output": output_column(outputs(index))})


def add_job(store: Store, output: Path) -> str:
    store.add_job("j-1", "toy", "inference", SPEC, "/nowhere/code.zip", str(output), 6, RANGES)
    store.set_job_state("j-1", JobState.RUNNING)
    return "j-1"


def finish_shard(store: Store, output: Path, index: int) -> None:
    store.shard_started("j-1", index, node(store), "cpu", "cpu")
    Results(str(output)).write_table(index, results(index))
    store.shard_succeeded("j-1", index, 2, 0.1, None, None)


def dispatcher(store: Store, tmp_path: Path) -> Dispatcher:
    return Dispatcher(store, HeadSettings(state_dir=tmp_path / "state"), notify=lambda job_id: None)


def test_a_head_killed_mid_write_leaves_no_partial_file_and_the_shard_runs_again(store: Store, tmp_path: Path
                                                                                 ) -> None:
    output = tmp_path / "out"
    add_job(store, output)
    finish_shard(store, output, 0)
    store.shard_started("j-1", 1, node(store), "cpu", "cpu")
    (output / ".shard-00001.parquet.k3j_a9").write_bytes(b"PAR1 half of it")  # what the dead head was writing

    dispatcher(store, tmp_path).recover()

    assert sorted(p.name for p in output.iterdir()) == ["shard-00000.parquet"]
    job = store.job("j-1")
    assert job.state is JobState.RUNNING
    assert [s.state for s in job.shards] == [ShardState.SUCCEEDED, ShardState.PENDING, ShardState.PENDING]


def test_a_head_killed_between_the_last_shard_and_the_manifest_finishes_the_job_on_start(store: Store,
                                                                                         tmp_path: Path) -> None:
    output = tmp_path / "out"
    add_job(store, output)
    for index in range(3):
        finish_shard(store, output, index)
    (output / ".manifest.json.x81q").write_text('{"job_id": ')

    dispatcher(store, tmp_path).recover()

    assert store.job("j-1").state is JobState.SUCCEEDED
    files = sorted(p.name for p in output.iterdir())
    assert files == sorted(["_manifest.json", *(f"shard-{i:05d}.parquet" for i in range(3))])
    assert [s["index"] for s in json.loads((output / "_manifest.json").read_text())["shards"]] == [0, 1, 2]
    np.testing.assert_array_equal(read_predictions(output), np.arange(12, dtype=np.float32).reshape(6, 2))
    np.testing.assert_array_equal(read_predictions(str(output)), read_predictions(output))  # a str too (issue 20)


def test_a_result_that_arrived_is_claimed_before_its_file_is_written(store: Store, tmp_path: Path) -> None:
    """Losing the node that ran a shard while the head writes its file must not hand the shard to another node: the
    shard leaves `running` (what taking back from lost nodes walks) in the same step its result arrives."""
    output = tmp_path / "out"
    add_job(store, output)
    farm = dispatcher(store, tmp_path)

    async def scenario() -> None:
        farm.attempts.start(("j-1", 0), Running("n-1", "cpu", "ticket-0"))
        store.shard_started("j-1", 0, node(store), "cpu", "cpu")
        await farm.receive("ticket-0", stream(parts([results(0)], ShardFigures(items=2, seconds=0.1))))
        assert ("j-1", 0) not in farm.attempts.running and not farm.attempts.tickets  # claimed as the upload is taken, before its write
        await asyncio.gather(*farm.tasks)

    asyncio.run(scenario())
    shard = store.job("j-1").shards[0]
    assert (shard.state, shard.attempts) == (ShardState.SUCCEEDED, 1)
    written = pq.read_table(output / "shard-00000.parquet")
    assert written.column("row_id").to_pylist() == [0, 1]
    np.testing.assert_array_equal(np.stack(written.column("output").to_numpy(zero_copy_only=False)), outputs(0))


def test_a_result_short_of_its_range_does_not_pass_as_done(store: Store, tmp_path: Path) -> None:
    """A shard claiming its items with fewer output rows "succeeded" with a short file."""
    output = tmp_path / "out"
    add_job(store, output)
    farm = dispatcher(store, tmp_path)

    async def scenario() -> None:
        farm.attempts.start(("j-1", 0), Running("n-1", "cpu", "ticket-0"))
        store.shard_started("j-1", 0, node(store), "cpu", "cpu")
        short = pa.table({"row_id": pa.array([0], pa.int64()), "output": output_column(outputs(0)[:1])})
        await farm.receive("ticket-0", stream(parts([short], ShardFigures(items=2, seconds=0.1))))
        await asyncio.gather(*farm.tasks)

    asyncio.run(scenario())
    shard = store.job("j-1").shards[0]
    assert shard.state is not ShardState.SUCCEEDED
    assert "says 2 items and holds 1 output rows" in store.job("j-1").error + (shard.error or "")
    assert not (output / "shard-00000.parquet").exists()
