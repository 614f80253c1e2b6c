"""`farm job ID --retry-missing` on the head: an ended job's shards without a result go back to the queue as they were
(farm.head.store.retries), what cannot run again is refused in one line, and a job that succeeded with rows skipped
loses its manifest until the retry writes it anew, each row once (farm.head.jobs.Jobs.retry_missing). A real store
and the real dispatcher's outcomes; no gRPC."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from farm.core.errors import ConflictError, DataError, NotFoundError
from farm.core.models import JobState, ShardState
from farm.head import arrivals
from farm.head.attempts import Running
from farm.head.dispatch import Dispatcher
from farm.head.events import JobEvents
from farm.head.jobs import Jobs
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm_agent.work.upload import failure_of
from tests.stores import one_node_store
from tests.uploads import succeed_shard

INFER = "name: toy\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshards: 3\n"


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return one_node_store(tmp_path)


def ended_job(store: Store) -> None:
    """j-1: shard 0 succeeded, shard 1 failed after 3 tries, shard 2 cancelled when the job failed."""
    store.add_job("j-1", "toy", "inference", INFER, "/nowhere.zip", "/nowhere/out", 30, [(0, 10), (10, 20), (20, 30)])
    node = store.nodes()[0]
    store.shard_started("j-1", 0, node, "cpu", "cpu")
    store.shard_succeeded("j-1", 0, 10, 0.5, None, None)
    for _ in range(3):
        store.shard_started("j-1", 1, node, "cpu", "cpu")
    store.shard_failed("j-1", 1, "ValueError: row 12")
    store.set_job_state("j-1", JobState.FAILED, "shard 1: ValueError: row 12")


def test_an_ended_job_s_shards_without_results_run_again_as_they_were(store: Store) -> None:
    ended_job(store)
    before = store.job("j-1")
    assert [s.state for s in before.shards] == [ShardState.SUCCEEDED, ShardState.FAILED, ShardState.CANCELLED]

    assert store.retry_missing("j-1") == [1, 2]
    job = store.job("j-1")
    assert job.state is JobState.RUNNING and job.run == 2 and job.error == "" and job.finished_at == 0
    assert job.started_at == before.started_at
    assert [(s.index, s.start, s.stop, s.state) for s in job.shards] == [
        (0, 0, 10, ShardState.SUCCEEDED), (1, 10, 20, ShardState.PENDING), (2, 20, 30, ShardState.PENDING)]
    assert job.shards[0] == before.shards[0]  # its result, node and figures untouched
    assert job.shards[1].attempts == 0 and job.shards[1].error == ""  # its tries counted afresh
    last = store.logs("j-1")[-1]["message"]
    assert last.startswith("retry of the rows without results began (run 2, the job was failed)")
    assert "shards 1, 2 (20 rows) run again" in last


def test_a_job_that_has_not_ended_or_misses_nothing_is_refused(store: Store) -> None:
    store.add_job("j-q", "toy", "inference", INFER, "/nowhere.zip", "/nowhere/q", 10, [(0, 10)])
    with pytest.raises(ConflictError, match="job j-q is queued: only a job that has ended"):
        store.retry_missing("j-q")
    store.set_job_state("j-q", JobState.RUNNING)
    with pytest.raises(ConflictError, match="job j-q is running"):
        store.retry_missing("j-q")
    store.shard_succeeded("j-q", 0, 10, 0.5, None, None)
    store.set_job_state("j-q", JobState.SUCCEEDED)
    with pytest.raises(ConflictError, match="job j-q has nothing missing: every shard has its result"):
        store.retry_missing("j-q")
    with pytest.raises(NotFoundError):
        store.retry_missing("j-none")
    job = store.job("j-q")
    assert job.state is JobState.SUCCEEDED and job.run == 1  # a refusal changes nothing


def test_an_auto_sized_job_cancelled_before_its_last_cut_misses_its_uncut_rows(store: Store) -> None:
    store.add_job("j-a", "toy", "inference", INFER.replace("3", "auto"), "/nowhere.zip", "/nowhere/a", 100, [])
    store.add_shards("j-a", [(0, 40)])
    store.shard_succeeded("j-a", 0, 40, 0.5, None, None)
    store.set_job_state("j-a", JobState.CANCELLED)
    assert store.retry_missing("j-a") == []
    assert store.job("j-a").state is JobState.RUNNING
    assert "rows [40, 100) not cut yet are cut as it runs" in store.logs("j-a")[-1]["message"]


def test_a_training_job_is_refused_in_one_line(store: Store, tmp_path: Path) -> None:
    store.add_job("j-t", "train", "training", "name: train\n", "/nowhere.zip", str(tmp_path / "t"), 10, [(0, 10)])
    store.set_job_state("j-t", JobState.FAILED, "it broke")
    jobs = Jobs(store, Dispatcher(store, HeadSettings(state_dir=tmp_path / "state"), notify=lambda job_id: None),
                JobEvents(), HeadSettings(state_dir=tmp_path / "state"))
    with pytest.raises(ConflictError, match="is a training job: it runs as a whole"):
        asyncio.run(jobs.retry_missing("j-t"))


def test_a_job_that_skipped_rows_runs_them_again_and_has_every_row_once(store: Store, tmp_path: Path) -> None:
    """Shard 1 fails on rows 15-17 within the budget: the job succeeds, its manifest listing them skipped. The retry
    takes the manifest away while it runs, runs only [15, 17), and its end writes the manifest with every row once."""
    settings = HeadSettings(state_dir=tmp_path / "state")
    farm_ = Dispatcher(store, settings, notify=lambda job_id: None)
    output = tmp_path / "out"
    store.add_job("j-1", "toy", "inference", INFER + "max_bad_rows: 5\n", "/nowhere.zip", str(output), 30,
                  [(0, 10), (10, 20), (20, 30)])
    job = store.job("j-1")
    handler, spec, node = farm_.handler(job), farm_.spec(job), store.nodes()[0]

    def succeed(index: int) -> None:
        succeed_shard(store, farm_, "j-1", index, node)

    succeed(0)
    succeed(2)
    store.shard_started("j-1", 1, node, "cpu", "cpu")
    failed = arrivals.failure_from_pb(failure_of(DataError("rows 15-17 do not read", rows=(15, 17))))
    assert failed.failure is not None
    farm_.outcomes.shard_failed("j-1", 1, failed.failure, handler, spec)
    succeed(3)
    succeed(4)
    assert store.job("j-1").state is JobState.SUCCEEDED
    assert json.loads((output / "_manifest.json").read_text())["skipped"][0]["start"] == 15

    jobs = Jobs(store, farm_, JobEvents(), settings)
    retried = asyncio.run(jobs.retry_missing("j-1"))
    assert retried.state is JobState.RUNNING and retried.run == 2
    assert [(s.index, s.start, s.stop) for s in retried.shards if s.state is ShardState.PENDING] == [(1, 15, 17)]
    assert not (output / "_manifest.json").exists()  # the results are not complete while it runs

    succeed(1)
    job = store.job("j-1")
    assert job.state is JobState.SUCCEEDED and job.items_done == 30
    manifest = json.loads((output / "_manifest.json").read_text())
    assert manifest["skipped"] == []
    rows = sorted(r for s in manifest["shards"] for r in pq.read_table(output / s["file"])["row_id"].to_pylist())
    assert rows == list(range(30))


def test_a_job_whose_last_attempts_are_still_out_is_refused_until_they_end(store: Store, tmp_path: Path) -> None:
    """An ended job's attempt still being stopped (its upload may be landing) would race the retry's run of the same
    shard: refused in one line until it ends."""
    ended_job(store)
    dispatcher = Dispatcher(store, HeadSettings(state_dir=tmp_path / "state"), notify=lambda job_id: None)
    jobs = Jobs(store, dispatcher, JobEvents(), HeadSettings(state_dir=tmp_path / "state"))
    dispatcher.attempts.start(("j-1", 1), Running("n-1", "cpu", "t-1"))
    with pytest.raises(ConflictError, match="still being stopped: retry it in a moment"):
        asyncio.run(jobs.retry_missing("j-1"))
    assert store.job("j-1").run == 1
    dispatcher.attempts.release(("j-1", 1))
    assert asyncio.run(jobs.retry_missing("j-1")).run == 2


def test_a_retried_job_s_wall_time_leaves_out_the_time_it_lay_ended(store: Store) -> None:
    from farm.head.outcomes import job_metrics

    ended_job(store)  # it ran 10 s and lay ended for 990 s before the retry
    store._db.execute("UPDATE jobs SET started_at=?, finished_at=? WHERE id='j-1'", (time.time() - 1000,
                                                                                    time.time() - 990))
    store.retry_missing("j-1")
    assert 989 < store.job("j-1").metrics["paused_s"] < 992
    assert 9 < job_metrics(store.job("j-1"))["wall_s"] < 12
