"""Draining a node: the store's drain flag, the node states derived from it and from the owner's busy reason, the
scheduler's filter, and the agent's busy file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from farm.core.errors import NotFoundError
from farm.core.models import BackendName, BackendOffer, Hardware, Node, NodeState, ShardState
from farm.head.liveness import NodeLiveness, derive_state
from farm.head.store import Store
from farm.scheduler import ShardRequest, place
from farm.scheduler.filters import node_ready
from farm_agent.daemon.idle import IdlePolicy

HW = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=2, memory_bytes=2**30)
CPU = BackendOffer(name=BackendName.CPU, device="cpu", threads=2, slots=1)


def node(node_id: str, state: NodeState = NodeState.READY, drain: bool = False, busy: str = "") -> Node:
    return Node(id=node_id, name=node_id, state=state, hardware=HW, backends=(CPU,), drain=drain, busy=busy)


def shards(count: int) -> list[ShardRequest]:
    return [ShardRequest(job_id="j-1", index=i, items=10, backends=(BackendName.CPU,)) for i in range(count)]


# ---- the store


def test_a_drain_survives_a_head_restart_and_the_agents_register(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "mac", HW, [CPU], "", "hash")
    drained = store.set_node_drain("mac", True)  # by name
    assert (drained.id, drained.drain) == ("n-1", True)
    store.close()
    store = Store(tmp_path / "state.db")  # the head again
    assert store.nodes()[0].drain and store.node_liveness()[0].drain
    store.upsert_node("n-1", "mac", HW, [CPU], "", "new-hash")  # the agent registers again
    assert store.nodes()[0].drain
    assert not store.set_node_drain("n-1", False).drain  # by id
    assert not store.nodes()[0].drain


def test_draining_an_unknown_node_is_not_found(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    with pytest.raises(NotFoundError, match="no node 'ghost'"):
        store.set_node_drain("ghost", True)


def test_an_older_store_gains_the_drain_column(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as db:  # the nodes table as stores wrote it before draining existed
        db.execute("""CREATE TABLE nodes (id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL,
            hardware TEXT NOT NULL, backends TEXT NOT NULL, address TEXT NOT NULL DEFAULT '',
            ray_node_id TEXT NOT NULL DEFAULT '', token_hash TEXT NOT NULL, registered_at REAL NOT NULL,
            last_heartbeat REAL NOT NULL DEFAULT 0, cpu_percent REAL NOT NULL DEFAULT 0,
            memory_percent REAL NOT NULL DEFAULT 0, power TEXT NOT NULL DEFAULT '[]', busy TEXT NOT NULL DEFAULT '')""")
        db.execute("INSERT INTO nodes (id, name, state, hardware, backends, token_hash, registered_at) "
                   "VALUES ('n-1', 'old', 'ready', ?, '[]', 'h', 1.0)", (HW.model_dump_json(),))
    store = Store(path)
    assert not store.nodes()[0].drain
    assert store.set_node_drain("old", True).drain


def test_the_liveness_read_carries_the_latest_busy_reason(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "mac", HW, [CPU], "", "hash")
    store.heartbeat("n-1", 1.0, 2.0, (), busy="owner's CPU load 95% > 90%")
    (live,) = store.node_liveness()  # from memory, before any save
    assert live.busy == "owner's CPU load 95% > 90%" and live.draining and not live.drain
    store.save_heartbeats()
    store.heartbeat("n-1", 1.0, 2.0, (), busy="")
    assert not store.node_liveness()[0].draining


def test_running_shards_are_counted_per_node(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "mac", HW, [CPU], "", "hash")
    store.add_job("j-1", "toy", "inference", "name: toy\n", "/code.zip", "/out", 10, [(0, 5), (5, 10)])
    mac = store.nodes()[0]
    store.shard_started("j-1", 0, mac, "cpu", "cpu")
    store.shard_started("j-1", 1, mac, "cpu", "cpu")
    store.shard_succeeded("j-1", 1, 5, 0.1, None, None)
    assert store.running_shards_by_node() == {"n-1": 1}
    assert store.job("j-1").shards[0].state is ShardState.RUNNING


# ---- states and filters


@pytest.mark.parametrize(("drain", "busy", "alive", "silent_s", "expected"), [
    (False, "", True, 1.0, NodeState.READY),
    (True, "", True, 1.0, NodeState.DRAINING),
    (False, "owner busy", True, 1.0, NodeState.DRAINING),
    (True, "", False, 1.0, NodeState.JOINING),  # no Ray worker: it holds nothing, whatever its flag
    (True, "", True, 60.0, NodeState.OFFLINE),
])
def test_node_states_follow_ray_the_drain_flag_and_the_owner(drain: bool, busy: str, alive: bool, silent_s: float,
                                                              expected: NodeState) -> None:
    live = NodeLiveness(id="n-1", name="mac", state=NodeState.READY, ray_node_id="r", last_heartbeat=0.0, busy=busy,
                        drain=drain)
    assert derive_state(live, alive, silent_s, offline_after_s=10.0) is expected


def test_a_drained_node_is_turned_away_even_before_its_state_follows() -> None:
    assert node_ready(node("a", drain=True), CPU, shards(1)[0]) == (
        "node is draining: an operator drained it (`farm undrain` gives it work again)")
    assert node_ready(node("a", NodeState.DRAINING, busy="on battery"), CPU, shards(1)[0]) == (
        "node is draining: owner busy: on battery")
    assert node_ready(node("a"), CPU, shards(1)[0]) is None


def test_new_shards_go_to_the_node_that_is_not_drained_and_the_reason_is_explained() -> None:
    placement = place(shards(3), [node("a", drain=True), node("b")])
    assert [a.node_id for a in placement.assignments] == ["b"]
    assert all("a/cpu: node is draining: an operator drained it" in w.why for w in placement.waiting)
    again = place(shards(3), [node("a"), node("b")])
    assert {a.node_id for a in again.assignments} == {"a", "b"}


# ---- the agent's busy file


def test_the_busy_file_makes_the_owner_busy_while_it_exists(tmp_path: Path) -> None:
    switch = tmp_path / "busy"
    idle = IdlePolicy(100.0, cpu_percent=lambda: 0.0, farm_percent=lambda: 0.0, cores=1, owner_signals=None,
                      busy_file=switch)
    assert idle.busy() == ""
    switch.touch()
    assert idle.busy() == f"busy file {switch}"
    switch.write_text("owner presenting\nsecond line\n")
    assert idle.busy() == "owner presenting"
    switch.unlink()
    assert idle.busy() == ""
