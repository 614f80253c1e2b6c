"""Node liveness: heartbeats kept in memory, read by the offline check and by node listings, saved in batches."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from farm.core.energy import DevicePower, EnergyScope, EnergySource
from farm.core.models import BackendName, BackendOffer, Hardware, NodeState
from farm.head.liveness import Beat, Liveness
from farm.head.store import Store

HW = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=2, memory_bytes=2**30)
WATTS = (DevicePower(device="cpu", watts=12.5, source=EnergySource.MODEL_ESTIMATE, scope=EnergyScope.PACKAGE),)


def saved(store: Store, node_id: str) -> tuple[float, float, str]:
    """A node's row as another process would read it: the figures actually written."""
    row = sqlite3.connect(store.path).execute(
        "SELECT last_heartbeat, cpu_percent, power FROM nodes WHERE id=?", (node_id,)
    ).fetchone()
    return row[0], row[1], row[2]


def test_only_the_latest_beat_per_node_is_taken_once() -> None:
    liveness = Liveness()
    liveness.record("n-1", Beat(1.0, 10.0, 1.0, (), ""))
    liveness.record("n-1", Beat(2.0, 20.0, 1.0, (), ""))
    liveness.record("n-2", Beat(3.0, 30.0, 1.0, (), ""))
    assert sorted((node, beat.cpu_percent) for node, beat in liveness.take_unsaved()) == [("n-1", 20.0), ("n-2", 30.0)]
    assert liveness.take_unsaved() == []
    assert (liveness.last_beat("n-1"), liveness.last_beat("n-3")) == (2.0, None)


def test_a_beat_is_not_written_until_saved_but_listings_show_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "a", HW, [BackendOffer(name=BackendName.CPU, device="cpu")], "", "hash")
    registered_at = saved(store, "n-1")[0]
    time.sleep(0.01)  # a clock tick apart
    store.heartbeat("n-1", 42.0, 7.0, WATTS, "owner busy")
    assert saved(store, "n-1")[:2] == (registered_at, 0.0)
    (node,) = store.nodes()
    assert (node.cpu_percent, node.memory_percent, node.power, node.busy) == (42.0, 7.0, WATTS, "owner busy")
    assert node.last_heartbeat > registered_at

    assert store.save_heartbeats() == 1
    last, cpu, power = saved(store, "n-1")
    assert (last, cpu) == (node.last_heartbeat, 42.0)
    assert [DevicePower.model_validate(p) for p in json.loads(power)] == list(WATTS)
    assert store.save_heartbeats() == 0  # nothing new


def test_a_new_process_reads_the_saved_beats(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "a", HW, [], "", "hash")
    store.heartbeat("n-1", 42.0, 7.0, WATTS, "")
    store.save_heartbeats()
    store.close()
    (node,) = Store(tmp_path / "state.db").nodes()
    assert (node.cpu_percent, node.power) == (42.0, WATTS)


def test_an_older_beat_does_not_overwrite_a_newer_registration(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "a", HW, [], "", "hash")
    store.heartbeat("n-1", 42.0, 7.0, WATTS, "")
    stale = store.liveness.take_unsaved()
    time.sleep(0.01)  # a clock tick apart: the agent restarts and registers again
    store.upsert_node("n-1", "a", HW, [], "", "new-hash")
    registered_at = saved(store, "n-1")[0]
    store.save_heartbeats(stale)
    assert saved(store, "n-1")[:2] == (registered_at, 0.0)
    (node,) = store.nodes()
    assert (node.last_heartbeat, node.cpu_percent) == (registered_at, 0.0)  # the stale beat in memory is older


def test_the_offline_check_reads_unsaved_beats_and_skips_offline_nodes(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    for node_id in ("n-1", "n-2", "n-3"):
        store.upsert_node(node_id, node_id, HW, [], "", "hash")
    store.set_node_state("n-3", NodeState.OFFLINE)
    saved_at = saved(store, "n-1")[0]
    time.sleep(0.01)  # a clock tick apart
    store.heartbeat("n-1", 1.0, 1.0, (), "")
    by_id = {n.id: n for n in store.node_liveness()}
    assert sorted(by_id) == ["n-1", "n-2"]
    assert by_id["n-1"].last_heartbeat > saved_at and by_id["n-2"].last_heartbeat == saved(store, "n-2")[0]
    assert by_id["n-1"].state is NodeState.JOINING


def test_the_agent_probe_reports_hardware_and_offers_as_json() -> None:
    """The daemon learns its hardware and backends from this child process (the backend modules stay out of it)."""
    done = subprocess.run([sys.executable, "-m", "farm_agent", "--probe", "--cpus", "2"], capture_output=True,
                          text=True, timeout=120, check=True)
    found = json.loads(done.stdout)
    hardware = Hardware.model_validate(found["hardware"])
    offers = [BackendOffer.model_validate(o) for o in found["offers"]]
    assert hardware.cpu_cores >= 1
    assert [(o.name, o.threads) for o in offers if o.name is BackendName.CPU and o.available] == [(BackendName.CPU, 2)]
    assert isinstance(found["no_gpus_because"], str)


def test_node_states_read_after_every_change(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    assert store.node_state("n-1") is NodeState.OFFLINE  # unknown
    store.upsert_node("n-1", "a", HW, [], "", "hash")
    assert store.node_state("n-1") is NodeState.JOINING
    store.set_node_state("n-1", NodeState.READY, "ray-1")
    assert store.node_state("n-1") is NodeState.READY
    store.upsert_node("n-1", "a", HW, [], "", "new-hash")  # the agent restarted
    assert store.node_state("n-1") is NodeState.JOINING
    store.set_node_state("n-1", NodeState.OFFLINE)
    assert store.node_state("n-1") is NodeState.OFFLINE
