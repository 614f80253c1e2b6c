"""A head's store as the tests that drive the head's side in this process start it: one ready node with a cpu."""

from __future__ import annotations

from pathlib import Path

from farm.core.models import BackendName, BackendOffer, Hardware, NodeState
from farm.head.store import Store

HW = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)


def one_node_store(tmp_path: Path) -> Store:
    """A store in `tmp_path` with node n-1 ("box"), ready, lending its cpu with two slots."""
    opened = Store(tmp_path / "state.db")
    opened.upsert_node("n-1", "box", HW, [BackendOffer(name=BackendName.CPU, device="cpu", slots=2)], "127.0.0.1", "h")
    opened.set_node_state("n-1", NodeState.READY)
    return opened
