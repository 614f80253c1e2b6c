"""The node id a head returns names folders on the agent's machine (its Ray folder, removed and made afresh at each
start): a head must not be able to point it anywhere else."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from farm.core.errors import AgentError
from farm.core.models import Hardware
from farm_agent.daemon.main import Agent
from farm_agent.daemon.settings import AgentSettings

HW = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)


@pytest.mark.parametrize("node_id", ["../../etc", "n-1/..", "", "x" * 100])
def test_a_node_id_from_the_head_that_is_a_path_is_refused(tmp_path: Path, node_id: str) -> None:
    async def register(*args: object) -> SimpleNamespace:
        return SimpleNamespace(node_id=node_id, node_token="tok", heartbeat_interval_s=2.0, mtls_port=0,
                               ray_token="r", ray_address="127.0.0.1:2")

    async def scenario() -> None:
        agent = Agent(AgentSettings(head="127.0.0.1:1", token="t", name="n", state_dir=tmp_path, insecure=True))
        agent.hardware, agent.offers, agent.address = HW, [], "127.0.0.1"
        agent.client.register = register  # type: ignore[method-assign]
        try:
            await agent._register()
        finally:
            await agent.client.close()

    with pytest.raises(AgentError, match="an id that is not one"):
        asyncio.run(scenario())
    assert not (tmp_path / "node.json").exists()
