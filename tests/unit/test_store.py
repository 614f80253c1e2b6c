from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pydantic import ValidationError

from farm.core.energy import Energy, EnergyScope, EnergySource
from farm.core.errors import ConflictError, NotFoundError
from farm.core.models import BackendName, BackendOffer, Hardware, JobState, NodeState, ShardState
from farm.core.spec import JobKind
from farm.head.store import Store

HW = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=2, memory_bytes=2**30)


def add_job(store: Store, job_id: str = "j-1") -> None:
    store.add_job(job_id, "digits", "inference", "name: digits\n", "/code.zip", "/out", 10, [(0, 5), (5, 10)])


def test_an_accepted_job_survives_a_new_process(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    add_job(store)
    store.close()
    job = Store(tmp_path / "state.db").job("j-1")
    assert (job.name, job.state, job.items) == ("digits", JobState.QUEUED, 10)
    assert [(s.start, s.stop, s.state) for s in job.shards] == [(0, 5, ShardState.PENDING), (5, 10, ShardState.PENDING)]


def test_the_store_uses_wal(tmp_path: Path) -> None:
    Store(tmp_path / "state.db").close()
    assert sqlite3.connect(tmp_path / "state.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_shard_lifecycle_and_accuracy_count(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    add_job(store)
    store.upsert_node("n-1", "a", HW, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.1", "hash")
    node = store.nodes()[0]
    store.shard_started("j-1", 0, node, "cpu", "cpu")
    store.shard_started("j-1", 1, node, "cpu", "cpu")
    store.shard_succeeded("j-1", 0, 5, 0.5, correct=4, energy=Energy(
        joules=2.5, seconds=0.5, source=EnergySource.MODEL_ESTIMATE, scope=EnergyScope.PACKAGE))
    store.shard_requeued("j-1", 1, "NodeDiedError")
    job = store.job("j-1")
    assert job.shards[0].state is ShardState.SUCCEEDED and job.shards[0].node_name == "a"
    assert job.shards[1].state is ShardState.PENDING and job.shards[1].attempts == 1
    assert job.items_done == 5 and job.correct == 4
    assert (job.shards[0].energy_j, job.shards[0].energy_source, job.shards[0].energy_scope) == (
        2.5, "model-estimate", "package")
    assert job.energy_j == 2.5 and job.energy_sources == ["model-estimate"]
    messages = [line["message"] for line in store.logs("j-1")]
    assert messages[0].startswith("accepted") and any("back to the queue" in m for m in messages)


def test_cancelling_a_job_cancels_its_unfinished_shards(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    add_job(store)
    store.shard_succeeded("j-1", 0, 5, 0.5, None, None)
    store.set_job_state("j-1", JobState.CANCELLED)
    job = store.job("j-1")
    assert job.state is JobState.CANCELLED and job.finished_at > 0
    assert [s.state for s in job.shards] == [ShardState.SUCCEEDED, ShardState.CANCELLED]


def test_running_shards_return_to_the_queue_after_a_restart(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    add_job(store)
    store.upsert_node("n-1", "a", HW, [], "", "hash")
    store.shard_started("j-1", 1, store.nodes()[0], "cpu", "cpu")
    assert store.requeue_running() == 1
    assert store.job("j-1").shards[1].state is ShardState.PENDING


def test_re_registering_keeps_the_node_id_and_resets_its_state(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "a", HW, [], "", "old")
    store.set_node_state("n-1", NodeState.READY, "ray-1")
    store.upsert_node("n-1", "a", HW, [], "", "new")
    (node,) = store.nodes()
    assert (node.state, node.ray_node_id, store.node_token_hash("n-1")) == (NodeState.JOINING, "", "new")


def test_unknown_jobs_are_not_found(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    with pytest.raises(NotFoundError):
        store.job("j-nope")
    with pytest.raises(NotFoundError):
        store.logs("j-nope")


def test_jobs_by_state_come_in_submission_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    for job_id in ("j-b", "j-a", "j-c"):
        add_job(store, job_id)
    store.set_job_state("j-a", JobState.RUNNING)
    assert [j.id for j in store.jobs(states=(JobState.QUEUED, JobState.RUNNING))] == ["j-b", "j-a", "j-c"]
    assert [j.id for j in store.jobs(limit=2)] == ["j-c", "j-a"]


def test_samples_are_the_latest_finished_shards_of_the_same_model(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "a", HW, [], "", "hash")
    node = store.nodes()[0]
    energy = Energy(joules=1.0, seconds=0.1, source=EnergySource.COUNTER, scope=EnergyScope.DEVICE)
    for job_id, key in (("j-1", "model-a"), ("j-2", "model-a"), ("j-3", "model-b")):
        store.add_job(job_id, "x", "inference", "", "", "", 10, [(0, 5), (5, 10)], model_key=key)
        for index in (0, 1):
            store.shard_started(job_id, index, node, "cuda", "cuda:0")
            store.shard_succeeded(job_id, index, 5, 0.1, None, energy)
    samples = store.samples("model-a", per_device=3)
    assert len(samples) == 3
    assert all((s.node_id, s.device, s.items, s.energy_source) == ("n-1", "cuda:0", 5, "counter") for s in samples)
    assert store.samples("model-c") == []
    assert all(s.finished_at > 0 for s in samples)


def test_a_models_memory_need_is_its_size_until_shards_measure_it_per_backend(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "a", HW, [], "", "hash")
    node = store.nodes()[0]
    store.add_job("j-1", "x", "inference", "", "", "", 10, [(0, 5), (5, 10)], model_key="m", model_bytes=4096)
    assert store.job("j-1").model_bytes == 4096
    assert store.peak_memory("m") == {}
    for index, peak in ((0, 10_000), (1, 30_000)):
        store.shard_started("j-1", index, node, "cuda", "cuda:0")
        store.shard_succeeded("j-1", index, 5, 0.1, None, None, peak_memory_bytes=peak)
    assert store.peak_memory("m") == {"cuda": 30_000}
    assert store.peak_memory("other") == {}


def test_a_shard_keeps_its_energy_above_idle_and_the_job_adds_it_up(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    add_job(store)
    store.upsert_node("n-1", "a", HW, [BackendOffer(name=BackendName.CUDA, device="cuda:0")], "127.0.0.1", "hash")
    node = store.nodes()[0]
    counter = Energy(joules=2040.0, seconds=3.0, source=EnergySource.COUNTER, scope=EnergyScope.DEVICE)
    store.shard_started("j-1", 0, node, "cuda", "cuda:0")
    store.shard_succeeded("j-1", 0, 5, 3.0, None, counter, marginal_j=1665.0)
    job = store.job("j-1")
    assert job.shards[0].marginal_j == 1665.0 and job.marginal_j == 1665.0
    assert store.samples(store.job("j-1").model_key)[0].marginal_j == 1665.0
    assert store.work_by_node()[0].marginal_j == 1665.0
    store.shard_started("j-1", 1, node, "cuda", "cuda:0")
    store.shard_succeeded("j-1", 1, 5, 3.0, None, counter)  # no idle draw read on that meter
    assert store.job("j-1").marginal_j is None and store.work_by_node()[0].marginal_j is None
    assert any("1665.000 J above idle" in line["message"] for line in store.logs("j-1"))


def test_a_store_written_before_marginal_energy_gains_the_column(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("CREATE TABLE shards (job_id TEXT, idx INTEGER, start INTEGER, stop INTEGER, state TEXT)")
    db.commit()
    db.close()
    Store(tmp_path / "state.db").close()
    columns = {r[1] for r in sqlite3.connect(tmp_path / "state.db").execute("PRAGMA table_info(shards)")}
    assert "marginal_j" in columns


def test_a_pending_shard_splits_into_its_front_and_a_new_shard_for_its_rest(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    add_job(store)  # shards 0: [0, 5), 1: [5, 10)
    assert store.split_shard("j-1", 1, 7) == 2
    assert [(s.index, s.start, s.stop, s.state) for s in store.job("j-1").shards] == [
        (0, 0, 5, ShardState.PENDING), (1, 5, 7, ShardState.PENDING), (2, 7, 10, ShardState.PENDING)]
    store.upsert_node("n-1", "a", HW, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.1", "hash")
    store.shard_started("j-1", 0, store.nodes()[0], "cpu", "cpu")
    for index, at in ((0, 3), (2, 7), (2, 10), (9, 1)):  # running, an end, past the end, no such shard
        with pytest.raises(ConflictError):
            store.split_shard("j-1", index, at)


def test_a_listing_reads_every_jobs_shards_in_one_query(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    for i in range(30):
        add_job(store, f"j-{i}")
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    listed = store.jobs(limit=100)
    assert len(statements) == 2  # the jobs, then their shards: not one query per job
    assert len(listed) == 30 and all(len(j.shards) == 2 for j in listed)
    statements.clear()
    assert len(store.jobs(states=(JobState.QUEUED,))) == 30 and len(statements) == 2


def test_a_job_as_read_is_frozen_and_knows_its_kind(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    add_job(store)
    job = store.job("j-1")
    assert job.kind is JobKind.INFERENCE
    with pytest.raises(ValidationError):
        job.state = JobState.RUNNING  # type: ignore[misc]
