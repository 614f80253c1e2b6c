"""A shard's result reaches the head over the head's gRPC channel, by its attempt's upload ticket, as Arrow IPC and
protobuf; Ray only places and runs the shard (issue 18, finding 16). The head never reads what a node's Ray task
returns: Ray would unpickle it inside the head's process, and a node chooses how its objects are deserialized."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm.core.errors import DataError
from farm.core.models import BackendName, BackendOffer, NodeState, ShardState
from farm.core.tasks import ResultRoute, ShardFigures
from farm.data.batches import output_column
from farm.head.attempts import Running
from farm.head.dispatch import NO_RESULT, Dispatcher
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm_agent.work.upload import Upload, UploadFailed, send
from tests.integration.inprocess_head import HW, Head, running_head

SPEC = "name: toy\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshards: 2\n"


def rows(start: int, stop: int) -> pa.Table:
    return pa.table({"row_id": pa.array(range(start, stop), pa.int64()),
                     "output": output_column(np.full((stop - start, 2), start, np.float32))})


def add_job(store: Store, output: Path) -> None:
    store.upsert_node("n-1", "box", HW, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.1", "h")
    store.set_node_state("n-1", NodeState.READY)
    store.add_job("j-1", "toy", "inference", SPEC, "/nowhere.zip", str(output), 4, [(0, 2), (2, 4)])


def start_attempt(head: Head, index: int, ticket: str) -> None:
    """What launching an attempt leaves on the head: the shard running on n-1, its ticket issued (no Ray here)."""
    farm = head.dispatcher
    assert farm is not None

    def start() -> None:
        farm.store.shard_started("j-1", index, farm.store.nodes()[0], "cpu", "cpu")
        farm.attempts.start(("j-1", index), Running("n-1", "cpu", ticket))

    head.on_loop(start)


def route(head: Head, ticket: str) -> ResultRoute:
    return ResultRoute(head.settings.address, head.ca_pem, ticket)


def shard_state(head: Head, index: int) -> ShardState:
    assert head.dispatcher is not None
    return head.on_loop(lambda: head.dispatcher.store.job("j-1").shards[index].state)  # type: ignore[union-attr]


def wait_for(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_an_upload_needs_its_attempts_live_ticket_once(tmp_path: Path) -> None:
    """A forged ticket, a used one, and an attempt's ticket once the head took the shard back are all refused; the
    live one writes the shard's output exactly once, streamed batch by batch as a node's entry point sends it."""
    output = tmp_path / "out"
    with running_head(tmp_path / "state") as head:
        assert head.dispatcher is not None
        head.on_loop(lambda: add_job(head.dispatcher.store, output))  # type: ignore[union-attr]
        start_attempt(head, 0, "live-ticket-0")

        def work(upload: Upload) -> ShardFigures:
            upload.write(rows(0, 1))
            upload.write(rows(1, 2))
            return ShardFigures(items=2, seconds=0.1)

        with pytest.raises(UploadFailed, match="UNAUTHENTICATED"):
            send(route(head, "forged-ticket"), work)
        send(route(head, "live-ticket-0"), work)
        wait_for(lambda: shard_state(head, 0) is ShardState.SUCCEEDED)
        assert pq.read_table(output / "shard-00000.parquet").column("row_id").to_pylist() == [0, 1]
        with pytest.raises(UploadFailed, match="UNAUTHENTICATED"):  # the same ticket twice
            send(route(head, "live-ticket-0"), work)

        start_attempt(head, 1, "old-attempt-1")
        farm = head.dispatcher

        def take_back() -> None:  # as _take_back_from_lost_nodes does, without a Ray task to cancel
            farm.attempts.release(("j-1", 1))
            farm.outcomes.retry_or_fail("j-1", 1, "its node left the farm")

        head.on_loop(take_back)
        assert shard_state(head, 1) is ShardState.PENDING
        with pytest.raises(UploadFailed, match="UNAUTHENTICATED"):  # a late upload of an attempt taken back
            send(route(head, "old-attempt-1"), lambda upload: ShardFigures(items=2, seconds=0.1))
        assert sorted(p.name for p in output.iterdir()) == ["shard-00000.parquet"]


def test_a_failure_travels_sorted_with_its_log_and_traceback(tmp_path: Path) -> None:
    """A malformed input fails its shard alone; the job's others go on (farm.head.outcomes' sorting, unchanged)."""
    with running_head(tmp_path / "state") as head:
        assert head.dispatcher is not None
        head.on_loop(lambda: add_job(head.dispatcher.store, tmp_path / "out"))  # type: ignore[union-attr]
        start_attempt(head, 0, "ticket-0")

        def bad_row(upload: Upload) -> ShardFigures:
            print("reading row 7")
            raise DataError("d.jsonl (row 7): column 'x' is empty (null)")

        send(route(head, "ticket-0"), bad_row)
        wait_for(lambda: shard_state(head, 0) is ShardState.FAILED)
        job = head.on_loop(lambda: head.dispatcher.store.job("j-1"))  # type: ignore[union-attr]
        assert job.shards[0].error == "d.jsonl (row 7): column 'x' is empty (null)" and not job.state.finished
        logs = head.on_loop(lambda: head.dispatcher.store.logs("j-1", 0, 0))  # type: ignore[union-attr]
        assert any("DataError" in line["message"] for line in logs)


@pytest.mark.slow
def test_a_node_made_object_never_unpickles_in_the_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 16: a shard's task returns an object whose unpickling runs code (here: mkdir a marker). The head that
    awaited the task's ObjectRef ran it in its own process; now the head only waits (ray.wait reads no object), and a
    task that ended with no result uploaded is its node's failure: the shard goes back to the queue."""
    import ray

    from farm.head import environment, remote
    from farm.head.kinds.base import ShardCall
    from farm.head.kinds.inference import Inference
    from farm.scheduler import Assignment

    marker = tmp_path / "ran-in-the-head"

    class Payload:
        def __reduce__(self) -> tuple[object, ...]:
            return (os.mkdir, (str(marker),))

    def shard(*args: object) -> Payload:  # as a job's code, or a node's own worker, could return
        return Payload()

    store = Store(tmp_path / "state.db")
    add_job(store, tmp_path / "out")
    farm = Dispatcher(store, HeadSettings(state_dir=tmp_path, insecure=True), notify=lambda job_id: None)
    monkeypatch.setattr(Inference, "task", lambda self, *args: ShardCall(ray.remote(num_cpus=0)(shard), None))
    monkeypatch.setattr(remote, "pinned", lambda *args: {})  # one local Ray node, without Farm's labels
    monkeypatch.setattr(environment, "runtime_env", lambda *args: {})
    monkeypatch.setattr(Dispatcher, "working_dir", lambda self, job: "")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        async def scenario() -> None:
            job = store.job("j-1")
            placed = Assignment(job_id="j-1", index=0, node_id="n-1", backend=BackendName.CPU, device="cpu",
                                threads=1, score=0.0, basis="")
            farm.launch(job, farm.spec(job), farm.handler(job), placed, store.nodes()[0])
            (running,) = farm.attempts.running.values()
            ended, _ = await asyncio.to_thread(ray.wait, [running.ref], timeout=60, fetch_local=False)
            assert ended, "the task never ended"
            for _ in range(20):  # the head's next rounds (a collector awaiting the ref would have run by now)
                await asyncio.sleep(0.05)
                if hasattr(farm, "reap"):
                    await farm.reap()

        asyncio.run(scenario())
    finally:
        ray.shutdown()
    assert not marker.exists(), "a node's object was unpickled in the head: its code ran there"
    shard_0 = store.job("j-1").shards[0]
    assert shard_0.state is ShardState.PENDING and shard_0.error == NO_RESULT
