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
