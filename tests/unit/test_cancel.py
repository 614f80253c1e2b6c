"""Cancelling a job ends its running attempts at once (farm.head.dispatch.Dispatcher.cancel): their devices are free
and their upload tickets void, without waiting for the next round. The store is real; no gRPC is needed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from farm.core.models import BackendName, BackendOffer, Hardware
from farm.head.attempts import Running
from farm.head.dispatch import Dispatcher
from farm.head.settings import HeadSettings
from farm.head.store import Store

HW = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)


def test_cancelling_a_job_ends_its_attempts_and_voids_their_tickets(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "box", HW, [BackendOffer(name=BackendName.CPU, device="cpu", slots=2)], "127.0.0.1", "h1")
    store.add_job("j-1", "toy", "inference", "name: toy\nmodel: m:b\ndataset: d:x\nshards: 2\n", "/nowhere.zip",
                  str(tmp_path / "out"), 2, [(0, 1), (1, 2)])

    async def cancel() -> tuple[int, bool]:
        farm = Dispatcher(store, HeadSettings(state_dir=tmp_path / "state"), notify=lambda job_id: None)
        farm.attempts.start(("j-1", 0), Running("n-1", "cpu", "ticket-0"))
        farm.attempts.start(("j-1", 1), Running("n-1", "cpu", "ticket-1"))
        farm.cancel("j-1")
        return len(farm.attempts.running), farm.attempts.takes_upload("ticket-0")

    assert asyncio.run(cancel()) == (0, False)
