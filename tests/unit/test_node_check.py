"""A node claiming at Register a device its Ray worker does not offer never becomes ready: a shard placed there would
wait on Ray for ever ("running", no error, no timeout). The dispatcher's refresh against Ray's view of its nodes (a
recorded view here: the store is real, Ray is not needed for this path)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from farm.core.models import BackendName, BackendOffer, Hardware, NodeState
from farm.head import dispatch, remote
from farm.head.dispatch import Dispatcher
from farm.head.node_check import unbacked
from farm.head.settings import HeadSettings
from farm.head.store import Store

HW = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)
CPU = BackendOffer(name=BackendName.CPU, device="cpu", slots=2)
CUDA = BackendOffer(name=BackendName.CUDA, device="cuda:0")


def test_unbacked_names_what_ray_does_not_offer() -> None:
    assert unbacked([CPU, CUDA], {"farm.cpu": 2.0, "farm.cuda": 1.0}) == []
    assert unbacked([CPU, CUDA], {"farm.cpu": 2.0}) == ["cuda (1 claimed, Ray offers 0)"]
    assert unbacked([CPU.model_copy(update={"available": False})], {}) == []


def test_a_node_claiming_a_device_its_ray_worker_lacks_is_never_ready(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-honest", "honest", HW, [CPU], "127.0.0.1", "h1")
    store.upsert_node("n-liar", "liar", HW, [CPU, CUDA], "127.0.0.1", "h2")  # no GPU behind it
    for node_id in ("n-honest", "n-liar"):
        store.heartbeat(node_id, 1.0, 1.0, ())
    ray_view = [{"NodeID": f"ray-{name}", "Alive": True, "Labels": {remote.NODE_LABEL: f"n-{name}"},
                 "Resources": {"farm.cpu": 2.0, "CPU": 2.0}} for name in ("honest", "liar")]
    monkeypatch.setattr(dispatch.ray, "nodes", lambda: ray_view)
    farm = Dispatcher(store, HeadSettings(state_dir=tmp_path), notify=lambda job_id: None)
    asyncio.run(farm.refresh_nodes())
    assert {n.id: n.state for n in store.nodes()} == {"n-honest": NodeState.READY, "n-liar": NodeState.JOINING}
