"""A node is ready only while its work stream is open (farm.head.links): that stream is how its shards reach it. A
node that beats but never opened one (a lender's agent that skips it, or one whose stream closed) holds no shards.
The dispatcher's refresh against the links (the store is real; no gRPC is needed for this path)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from farm.core.models import BackendName, BackendOffer, Hardware, NodeState
from farm.head.dispatch import Dispatcher
from farm.head.settings import HeadSettings
from farm.head.store import Store

HW = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)
CPU = BackendOffer(name=BackendName.CPU, device="cpu", slots=2)


def test_a_node_is_ready_only_while_its_work_stream_is_open(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-streams", "streams", HW, [CPU], "127.0.0.1", "h1")
    store.upsert_node("n-silent", "silent", HW, [CPU], "127.0.0.1", "h2")  # beats, but no work stream
    for node_id in ("n-streams", "n-silent"):
        store.heartbeat(node_id, 1.0, 1.0, ())

    async def rounds() -> tuple[dict[str, NodeState], dict[str, NodeState]]:
        farm = Dispatcher(store, HeadSettings(state_dir=tmp_path), notify=lambda job_id: None)
        link = farm.links.attach("n-streams")
        await farm.refresh_nodes()
        open_ = {n.id: n.state for n in store.nodes()}
        farm.links.detach(link)
        await farm.refresh_nodes()
        return open_, {n.id: n.state for n in store.nodes()}

    open_, closed = asyncio.run(rounds())
    assert open_ == {"n-streams": NodeState.READY, "n-silent": NodeState.JOINING}
    assert closed == {"n-streams": NodeState.JOINING, "n-silent": NodeState.JOINING}


def test_a_closed_work_stream_takes_its_nodes_shards_back_even_when_it_reopens_at_once(tmp_path: Path) -> None:
    """An agent stops its workers when its stream closes: the attempts it held are gone even if it is back (a new
    stream) before the next round. Without this they held the node's slots for ever (found by the chaos tests)."""
    from farm.core.models import ShardState
    from farm.head.attempts import Running

    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "box", HW, [CPU], "127.0.0.1", "h1")
    store.heartbeat("n-1", 1.0, 1.0, ())
    store.add_job("j-1", "toy", "inference", "name: toy\nmodel: m:b\ndataset: d:x\nshards: 2\n", "/nowhere.zip",
                  str(tmp_path / "out"), 4, [(0, 2), (2, 4)])

    async def flap() -> tuple[int, ShardState]:
        farm = Dispatcher(store, HeadSettings(state_dir=tmp_path / "state"), notify=lambda job_id: None)
        farm.links.attach("n-1")
        store.shard_started("j-1", 0, store.nodes()[0], "cpu", "cpu")
        farm.attempts.start(("j-1", 0), Running("n-1", "cpu", "ticket-0"))
        farm.links.attach("n-1")  # the agent reconnected: its old stream is replaced
        return len(farm.attempts.running), store.job("j-1").shards[0].state

    assert asyncio.run(flap()) == (0, ShardState.PENDING)


def test_an_ended_jobs_attempts_free_their_devices_at_the_next_round(tmp_path: Path) -> None:
    """Whatever path ended a job, its attempts hold no device after the next round (a finished job once held an
    agent's only slot, and the next job waited for ever)."""
    from farm.core.models import JobState
    from farm.head.attempts import Running

    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "box", HW, [CPU], "127.0.0.1", "h1")
    store.heartbeat("n-1", 1.0, 1.0, ())
    store.add_job("j-1", "toy", "inference", "name: toy\nmodel: m:b\ndataset: d:x\nshards: 1\n", "/nowhere.zip",
                  str(tmp_path / "out"), 2, [(0, 2)])

    async def round_after_the_end() -> int:
        farm = Dispatcher(store, HeadSettings(state_dir=tmp_path / "state"), notify=lambda job_id: None)
        farm.links.attach("n-1")
        farm.attempts.start(("j-1", 0), Running("n-1", "cpu", "ticket-0"))
        store.set_job_state("j-1", JobState.FAILED)  # ended by a path that left its attempt behind
        await farm.refresh_nodes()
        return len(farm.attempts.running)

    assert asyncio.run(round_after_the_end()) == 0
