"""A shard's result reaches the head over the head's gRPC channel, by its attempt's upload ticket, as Arrow IPC and
protobuf; Ray only places and runs the shard (issue 18, finding 16). The head never reads what a node's Ray task
returns: Ray would unpickle it inside the head's process, and a node chooses how its objects are deserialized."""

from __future__ import annotations

import asyncio
import hashlib
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
from farm.head.dispatch import Dispatcher
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


def test_a_shard_reaches_its_node_as_protobuf_and_its_end_comes_back_as_words(tmp_path: Path) -> None:
    """Finding 16 and issue 27: a node's Ray task made an object that the head's driver unpickled, running the node's
    code in the head. Now a shard goes to its node as an Assignment on the node's work stream (its task as JSON), with
    no Ray in the head's path, and what the node says of an attempt's end is a line of text: a node failure, bounded,
    the shard back in the queue."""
    import ray

    from farm.core.wire import decode_task
    from farm.head.links import MAX_REASON
    from farm.proto.v1 import agent_pb2
    from farm.scheduler import Assignment

    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "box", HW, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.1", "h")
    store.set_node_state("n-1", NodeState.READY)
    code = tmp_path / "code.zip"
    code.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: the job's code package, hashed for the node
    store.add_job("j-1", "toy", "inference", SPEC, str(code), str(tmp_path / "out"), 4, [(0, 2), (2, 4)])
    farm = Dispatcher(store, HeadSettings(state_dir=tmp_path / "state", insecure=True), notify=lambda job_id: None)

    async def scenario() -> tuple[agent_pb2.WorkOrder, str]:
        link = farm.links.attach("n-1")
        job = store.job("j-1")
        placed = Assignment(job_id="j-1", index=0, node_id="n-1", backend=BackendName.CPU, device="cpu", threads=1,
                            score=0.0, basis="")
        farm.launch(job, farm.spec(job), farm.handler(job), placed, store.nodes()[0])
        order = link.orders.get_nowait()
        farm.links.report(link, agent_pb2.WorkReport(ended=agent_pb2.WorkEnded(
            ticket=order.assign.ticket, reason="x" * 10 * MAX_REASON)))
        return order, store.job("j-1").shards[0].error

    order, error = asyncio.run(scenario())
    assert not ray.is_initialized()  # the head's path to a lent node has no Ray in it
    task = decode_task(order.assign.entry, order.assign.task_json)
    assert (task.job_id, task.index, task.device) == ("j-1", 0, "cpu")
    assert not farm.attempts.running and store.job("j-1").shards[0].state is ShardState.PENDING
    assert error == "x" * MAX_REASON  # the node's word, cut to its bound
    assert order.assign.code_sha256 == hashlib.sha256(code.read_bytes()).hexdigest()
