"""A worker reads an Assignment with no ticket as its agent's word that its device is free (a warm worker then readies
the device: farm_agent.work.host). An order with no ticket from the head, broken or hostile, is no attempt: the agent
starts no worker for it, queues nothing and acknowledges nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from farm.proto.v1 import agent_pb2
from farm_agent.daemon.workers import Workers
from tests.unit.test_warm_workers import fetch, order


def test_an_order_with_no_ticket_from_the_head_starts_nothing(tmp_path: Path) -> None:
    reports: list[agent_pb2.WorkReport] = []

    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, reports.append, fetch, keep_warm_s=0)
        try:
            await workers.assign(order("j-1", ""))
            assert not workers.workers and not workers.warm
        finally:
            await workers.close()

    asyncio.run(scenario())
    assert reports == []
