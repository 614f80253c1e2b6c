"""Issue 27's attacks on the execution path, against a real head and a real lent agent (no --trusted) on loopback.

Each was reproduced on the code before lent nodes left the head's Ray: a lent node got the head's Ray address and
token at Register; an error made by job code on a node, unpickled by the head's driver, ran code in the head; the
head's Ray processes inherited its whole environment (a cloud secret among it)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from farm.client import find_head
from farm.core.models import Hardware
from farm.local import read_json
from tests.conftest import Cluster, farm, stop_cluster
from tests.integration.test_cluster import write_spec
from tests.ports import head_ports

HEAD_SECRET = "head-secret-7f3a"  # in the head's environment, as an operator's cloud key is
OWNER_SECRET = "owner-secret-91c2"  # in the lent agent's environment


@pytest.fixture(scope="module")
def lent_farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("lent-farm")
    started = farm("head", "start", "--host", "127.0.0.1", *head_ports(), "--state-dir", str(state), "--detach",
                   env={"AWS_SECRET_ACCESS_KEY": HEAD_SECRET, "HEAD_ONLY_SECRET": HEAD_SECRET})
    assert started.returncode == 0, started.stderr
    head = find_head(state_dir=state)
    cluster = Cluster(state_dir=state, head=head, s3={})
    try:
        agent = subprocess.run(
            [sys.executable, "-m", "farm.cli.main", "agent", "start", "--head", head.address, "--ca-hash",
             head.ca_hash, "--name", "lender", "--cpus", "1", "--state-dir", str(state), "--detach",
             "--max-foreign-cpu", "100"],
            capture_output=True, text=True, timeout=180,
            env={**os.environ, "FARM_JOIN_TOKEN": head.join_token, "OWNER_SECRET": OWNER_SECRET})
        assert agent.returncode == 0, agent.stderr
        yield cluster
    finally:
        stop_cluster(cluster)


def submit(cluster: Cluster, work: Path, model: str, **env: str) -> dict[str, object]:
    spec = write_spec(work, name=f"sec-{model}", kind="inference", model=f"workerjob:{model}",
                      dataset="workerjob:numbers", shards=2, batch_size=50, backends=["cpu"],
                      output=str(work / "out"), env=env)
    result = cluster.farm("submit", str(spec), "--wait", "--json", "--no-check", "--workdir", str(work),
                          timeout=240)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_a_lent_node_never_gets_the_heads_ray_address_or_token(lent_farm: Cluster, tmp_path: Path) -> None:
    agent = lent_farm.state_dir / "agents" / "lender"
    status = read_json(agent / "agent.json") or {}
    assert status["trusted"] is False and status["ray_pid"] == 0  # no Ray node of any kind
    assert not (agent / "ray.token").exists()
    # What Register answers any holder of a join token (the lender's own modified agent included)
    from farm_agent.daemon.client import HeadClient

    key_path = tmp_path / "node.key"  # a lender's own modified agent: its key, its CSR

    async def register() -> tuple[str, str]:
        client = HeadClient(lent_farm.head.address, lent_farm.head.ca_pem, key_path)
        try:
            hardware = Hardware(hostname="x", os="linux", arch="x86_64", cpu_model="c", cpu_cores=1,
                                memory_bytes=2**30)
            reply = await client.register(lent_farm.head.join_token, "probe", hardware, [], "127.0.0.1", "")
            return reply.ray_address, reply.ray_token
        finally:
            await client.close()

    assert asyncio.run(register()) == ("", "")


def test_a_trusted_join_needs_the_api_token(lent_farm: Cluster) -> None:
    """--trusted with a join token alone (a lender claiming to be the operator's) is refused in one line."""
    result = lent_farm.farm("agent", "start", "--head", lent_farm.head.address, "--ca-hash", lent_farm.head.ca_hash,
                            "--name", "pretender", "--state-dir", str(lent_farm.state_dir / "elsewhere"),
                            "--trusted", "--detach", "--token", lent_farm.head.join_token)
    assert result.returncode == 2
    assert "API token" in result.stderr and "Traceback" not in result.stderr


def test_an_error_planted_to_run_code_when_unpickled_runs_nothing_in_the_head(lent_farm: Cluster,
                                                                              work: Path) -> None:
    marker = work / "marker"
    job = submit(lent_farm, work, "planting", MARKER=str(marker))
    assert job["state"] == "succeeded"  # its results were in before its worker raised
    assert not marker.exists(), marker.read_text()


def test_no_head_or_owner_secret_reaches_a_ray_process_or_a_worker(lent_farm: Cluster, work: Path) -> None:
    env_file = work / "env.txt"
    job = submit(lent_farm, work, "environment", ENV_FILE=str(env_file))
    assert job["state"] == "succeeded"
    names = set(env_file.read_text().split())
    assert "OWNER_SECRET" not in names and "FARM_JOIN_TOKEN" not in names and "HEAD_ONLY_SECRET" not in names
    assert "ENV_FILE" in names  # the job's own `env:` does
    record = read_json(lent_farm.state_dir / "ray-head.json") or {}
    ray = [psutil.Process(pid) for pid, _ in record["processes"] if psutil.pid_exists(pid)]
    assert ray
    for proc in ray:
        assert HEAD_SECRET not in "\n".join(proc.environ().values()), proc.cmdline()[:3]
