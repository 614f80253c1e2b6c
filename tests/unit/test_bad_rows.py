"""Issue 31 item 11: a shard that fails on its data is cut down to the range that does not read (a corrupt Parquet row
group, an image that does not decode); its other rows run again, and the job's error budget says whether what it
skipped lets it succeed, the manifest listing the skipped rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm import data
from farm.core.dataset import DatasetSpec
from farm.core.errors import DataError, SpecError
from farm.core.models import JobState, ShardState
from farm.core.spec import parse_spec
from farm.head import arrivals
from farm.head.dispatch import Dispatcher
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.proto.v1 import result_pb2
from farm.scheduler import bad_rows
from farm_agent.work.upload import failure_of
from tests.stores import one_node_store
from tests.uploads import succeed_shard

INFER = "name: toy\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshards: 2\n"


def corrupt_row_group(path: Path, group: int) -> None:
    """Overwrite bytes inside one row group's data page, as a bad disk sector would: its footer still reads."""
    chunk = pq.read_metadata(path).row_group(group).column(0)
    raw = bytearray(path.read_bytes())
    raw[chunk.data_page_offset + 40:chunk.data_page_offset + 80] = b"\xff\x13" * 20
    path.write_bytes(bytes(raw))


def test_a_shard_is_cut_around_the_range_that_does_not_read() -> None:
    assert bad_rows.cut((0, 100), (20, 30)) == bad_rows.Cut(bad=(20, 30), rest=((0, 20), (30, 100)))
    assert bad_rows.cut((0, 100), (0, 10)) == bad_rows.Cut(bad=(0, 10), rest=((10, 100),))
    assert bad_rows.cut((0, 100), (90, 100)).rest == ((0, 90),)
    # Unsaid, empty or outside the shard (a node's word is checked): the shard fails whole.
    for said in (None, (30, 30), (90, 110), (-5, 3)):
        assert bad_rows.cut((0, 100), said) == bad_rows.Cut(bad=(0, 100), rest=())


def test_the_error_budget_is_the_larger_of_rows_and_fraction() -> None:
    assert bad_rows.over_budget([], 1000, 0, 0.0) is None
    assert "10 rows of 1000 do not read (1 range), over the job's error budget of 0" in (
        bad_rows.over_budget([(20, 30)], 1000, 0, 0.0) or "")
    assert bad_rows.over_budget([(20, 30)], 1000, 10, 0.0) is None
    assert bad_rows.over_budget([(20, 30), (50, 51)], 1000, 10, 0.0) is not None
    assert bad_rows.over_budget([(20, 30), (50, 51)], 1000, 10, 0.011) is None  # 11 of 1000
    spec = parse_spec(INFER + "max_bad_rows: 5\nmax_failed_fraction: 0.01\n")
    assert (spec.max_bad_rows, spec.max_failed_fraction) == (5, 0.01)
    assert (parse_spec(INFER).max_bad_rows, parse_spec(INFER).max_failed_fraction) == (0, 0.0)
    with pytest.raises(SpecError, match="max_bad_rows"):
        parse_spec(INFER + "max_bad_rows: -1\n")


def test_a_corrupt_row_group_names_its_own_rows_not_the_files(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    for i in range(2):
        x = np.arange(i * 100, (i + 1) * 100, dtype=np.float64)
        pq.write_table(pa.table({"x": x}), folder / f"part-{i}.parquet", row_group_size=25)
    corrupt_row_group(folder / "part-1.parquet", 2)  # the file's rows 50-74: row ids 150-174
    plan = data.plan(DatasetSpec(location=str(folder), format="parquet", inputs=["x"]))
    with pytest.raises(DataError, match=r"d/part-1\.parquet: rows 50-74 \(row group 2\) do not read") as caught:
        for _ in data.read(plan, 0, 200, None, 10):
            pass
    assert caught.value.rows == (150, 175)
    read = sum(b.num_rows for b in data.read(plan, 0, 150, None, 10)) + \
        sum(b.num_rows for b in data.read(plan, 175, 200, None, 10))
    assert read == 175  # the rest of the file reads


def test_the_range_travels_from_the_node_to_the_head() -> None:
    sent = failure_of(DataError("d/p.parquet: rows 50-74 (row group 2) do not read", rows=(150, 175)))
    assert (sent.kind, sent.bad_start, sent.bad_stop) == (result_pb2.ShardFailure.DATA, 150, 175)
    assert arrivals.failure_from_pb(sent).failure.bad_rows == (150, 175)  # type: ignore[union-attr]
    unsaid = arrivals.failure_from_pb(failure_of(DataError("d.jsonl: rows from byte 9 do not read")))
    assert unsaid.failure is not None and unsaid.failure.data and unsaid.failure.bad_rows is None
    model = arrivals.failure_from_pb(result_pb2.ShardFailure(kind=result_pb2.ShardFailure.JOB, message="boom",
                                                             bad_start=1, bad_stop=9))
    assert model.failure is not None and model.failure.bad_rows is None  # only a data failure names rows


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return one_node_store(tmp_path)


def run_job(store: Store, tmp_path: Path, budget: str = "") -> tuple[Store, Path]:
    """A 2-shard job of 100 rows whose shard 1 fails on rows 60-69, then every shard that runs again succeeds."""
    farm_ = Dispatcher(store, HeadSettings(state_dir=tmp_path / "state"), notify=lambda job_id: None)
    output = tmp_path / "out"
    store.add_job("j-1", "toy", "inference", INFER + budget, "/nowhere.zip", str(output), 100, [(0, 50), (50, 100)])
    job = store.job("j-1")
    handler, spec, node = farm_.handler(job), farm_.spec(job), store.nodes()[0]

    def succeed(index: int) -> None:
        succeed_shard(store, farm_, "j-1", index, node)

    succeed(0)
    store.shard_started("j-1", 1, node, "cpu", "cpu")
    failed = arrivals.failure_from_pb(failure_of(DataError("d/p.parquet: rows 10-19 (row group 1) do not read",
                                                           rows=(60, 70))))
    assert failed.failure is not None
    farm_.outcomes.shard_failed("j-1", 1, failed.failure, handler, spec)
    shards = store.job("j-1").shards
    assert [(s.index, s.start, s.stop, s.state) for s in shards] == [
        (0, 0, 50, ShardState.SUCCEEDED), (1, 60, 70, ShardState.FAILED),
        (2, 50, 60, ShardState.PENDING), (3, 70, 100, ShardState.PENDING)]
    assert store.job("j-1").state is JobState.QUEUED  # not done: its other rows run again
    succeed(2)
    succeed(3)
    return store, output


def test_a_shard_that_fails_on_data_is_cut_down_and_the_rest_completes_within_the_budget(store: Store,
                                                                                         tmp_path: Path) -> None:
    store, output = run_job(store, tmp_path, "max_bad_rows: 10\n")
    job = store.job("j-1")
    assert job.state is JobState.SUCCEEDED and job.items_done == 90
    manifest = json.loads((output / "_manifest.json").read_text())
    assert manifest["skipped"] == [{"start": 60, "stop": 70,
                                    "error": "d/p.parquet: rows 10-19 (row group 1) do not read"}]
    assert [(s["start"], s["stop"]) for s in manifest["shards"]] == [(0, 50), (50, 60), (70, 100)]
    assert all((output / s["file"]).is_file() for s in manifest["shards"])


def test_over_the_budget_the_rest_completes_and_the_job_fails_naming_the_rows(store: Store, tmp_path: Path) -> None:
    store, output = run_job(store, tmp_path)
    job = store.job("j-1")
    assert job.state is JobState.FAILED and job.items_done == 90  # every good row has its results
    assert job.error.startswith("10 rows of 100 do not read (1 range), over the job's error budget of 0")
    assert "shard 1: d/p.parquet: rows 10-19 (row group 1) do not read" in job.error
    assert not (output / "_manifest.json").exists()
