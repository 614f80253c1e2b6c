"""Draining nodes with real processes: an operator's drain (gRPC, CLI and dashboard) and the idle policy's drain."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from farm.cli.render import node_state
from farm.client import Client
from farm.data.results import read_predictions
from farm.local import wait_for
from farm.proto.v1 import fleet_pb2
from tests.conftest import FIXTURES, Cluster

pytestmark = pytest.mark.slow

WAIT_S = 120  # on a busy two-core machine; every wait ends as soon as its condition holds


def write_spec(folder: Path, **fields: object) -> Path:
    path = folder / f"{fields['name']}.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


@pytest.fixture()
def toy(tmp_path: Path) -> Path:
    """The toy job's code and datasets of n rows (the slow model: half a second a row)."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", work / "toyjob.py")
    for rows in (24, 90):
        np.savez(work / f"rows{rows}.npz", x=np.arange(2 * rows, dtype=np.float32).reshape(rows, 2))
    return work


def node_named(client: Client, name: str) -> fleet_pb2.Node:
    return next(n for n in client.nodes() if n.name == name)


def run_to_end(client: Client, job_id: str) -> list[str]:
    """Follow the job to its end; the explanations it went through."""
    return [record.explanation for record in client.watch(job_id)]


def test_a_drained_node_keeps_its_shards_and_gets_no_new_ones_until_undrained(cluster: Cluster, toy: Path) -> None:
    # throughput: the plan spreads the shards over both nodes (efficiency could give them all to the thriftier one)
    slow = write_spec(toy, name="drain-slow", model="toyjob:slow", dataset="rows24.npz", shards=6, batch_size=1,
                      policy="throughput")  # 2 s a shard
    # 2 shards of ~1 s on agent-b alone: the watch sees a round while one waits (warm workers ran 4 quick shards
    # before the watch had begun, and a job's last round names only where it placed)
    quick = write_spec(toy, name="drain-quick", model="toyjob:slow", dataset="rows24.npz", shards=2, batch_size=12,
                       policy="throughput")
    with Client(cluster.head) as client:
        try:
            job_id = cluster.farm("submit", str(slow), "--workdir", str(toy)).stdout.strip()
            for record in client.watch(job_id):
                if any(s.state == "running" and s.node_name == "agent-a" for s in record.shards):
                    break
            drained = client.drain_node("agent-a")
            assert drained.drain and drained.name == "agent-a"
            held = {s.index for s in client.job(job_id).shards
                    if s.node_name == "agent-a" and s.state in ("running", "succeeded")}
            assert held
            run_to_end(client, job_id)
            final = client.job(job_id)
            assert final.state == "succeeded", final.error
            for shard in final.shards:  # what agent-a ran finished there, once; everything after went to agent-b
                expected = "agent-a" if shard.index in held else "agent-b"
                assert (shard.node_name, shard.state, shard.attempts) == (expected, "succeeded", 1), shard
            np.testing.assert_array_equal(read_predictions(Path(final.output)), np.arange(48).reshape(24, 2) * 2)

            wait_for(lambda: node_named(client, "agent-a").state == "draining", WAIT_S)
            assert node_state(node_named(client, "agent-a")) == "drained"  # draining, and nothing left running
            listed = {n["name"]: n for n in json.loads(cluster.farm("nodes", "--json").stdout)}
            assert (listed["agent-a"]["state"], listed["agent-a"]["drain"]) == ("draining", True)
            assert (listed["agent-b"]["state"], listed["agent-b"]["drain"]) == ("ready", False)

            new_id = cluster.farm("submit", str(quick), "--workdir", str(toy)).stdout.strip()
            explanations = run_to_end(client, new_id)
            new = client.job(new_id)
            assert new.state == "succeeded" and {s.node_name for s in new.shards} == {"agent-b"}
            assert any("agent-a/cpu: node is draining: an operator drained it" in e for e in explanations), explanations

            undrained = cluster.farm("undrain", "agent-a")
            assert undrained.returncode == 0 and "undrained" in undrained.stdout, undrained.stderr
            wait_for(lambda: node_named(client, "agent-a").state == "ready", WAIT_S)
            again_id = cluster.farm("submit", str(quick), "--workdir", str(toy), "--overwrite").stdout.strip()
            run_to_end(client, again_id)
            again = client.job(again_id)
            assert again.state == "succeeded", (again.error, [line.message for line in client.logs(again_id)])
            assert "agent-a" in {s.node_name for s in again.shards}
        finally:
            client.drain_node("agent-a", False)


def test_drain_names_an_unknown_node_in_one_line(cluster: Cluster) -> None:
    result = cluster.farm("drain", "no-such-node")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: no node 'no-such-node'"]


def test_the_dashboard_drains_only_with_the_api_token(cluster: Cluster) -> None:
    with Client(cluster.head) as client:
        node_id = node_named(client, "agent-b").id
        try:
            status, body = cluster.dashboard_call(f"api/nodes/{node_id}/drain", "POST", token=None)
            assert status == 401 and "API token" in str(body["error"])
            status, body = cluster.dashboard_call(f"api/nodes/{node_id}/drain", "POST", token="not-the-token")
            assert status == 401
            assert not node_named(client, "agent-b").drain

            status, body = cluster.dashboard_call("api/nodes/agent-b/drain", "POST")
            assert status == 200 and body["drain"] is True and body["id"] == node_id
            assert node_named(client, "agent-b").drain
            status, body = cluster.dashboard_call(f"api/nodes/{node_id}/undrain", "POST")
            assert status == 200 and body["drain"] is False
            assert not node_named(client, "agent-b").drain
            status, body = cluster.dashboard_call("api/nodes/ghost/drain", "POST")
            assert status == 404
        finally:
            client.drain_node("agent-b", False)
    status, body = cluster.dashboard_call("metrics")  # Prometheus, with the API token as a bearer
    assert status == 200 and b"farm_node_busy" in body
    assert cluster.dashboard_call("metrics", token=None)[0] == 401


def test_a_busy_owner_drains_the_node_and_its_idle_return_brings_it_back(cluster: Cluster, toy: Path,
                                                                          tmp_path: Path) -> None:
    switch = tmp_path / "busy"  # the idle policy's busy file: what an owner at the keyboard would be
    started = cluster.farm("agent", "start", "--head", cluster.head.address, "--token", cluster.head.join_token,
                           "--name", "agent-idle", "--cpus", "1", "--state-dir", str(cluster.state_dir), "--detach",
                           "--max-foreign-cpu", "100", "--drain-grace-s", "1", "--busy-file", str(switch))
    assert started.returncode == 0, started.stderr
    try:
        # Three shards of 30 rows (15 s each), one per node: agent-idle's cannot end before its agent stops Ray (the
        # first busy beat, a 1 s grace, the next beat, a 2 s stop).
        spec = write_spec(toy, name="idle-drain", model="toyjob:slow", dataset="rows90.npz", shards=3, batch_size=1,
                          policy="throughput")
        with Client(cluster.head) as client:
            job_id = cluster.farm("submit", str(spec), "--workdir", str(toy)).stdout.strip()
            for record in client.watch(job_id):
                on_idle = [s.index for s in record.shards if s.state == "running" and s.node_name == "agent-idle"]
                if on_idle:
                    break
            switch.write_text("owner at the keyboard\n")
            # The agent (a lent one: no Ray node) stops its workers once the owner has been busy for the grace...
            assert wait_for(lambda: node_named(client, "agent-idle").busy == "owner at the keyboard"
                            and node_named(client, "agent-idle").state != "ready", WAIT_S)
            # ...and the head hands the shard it ran to another node, once.
            run_to_end(client, job_id)
            final = client.job(job_id)
            logs = [line.message for line in client.logs(job_id)]
            assert final.state == "succeeded", final.error
            assert any(f"shard {on_idle[0]} goes back to the queue: its node drained" in m for m in logs), logs
            assert final.shards[on_idle[0]].node_name in ("agent-a", "agent-b")
            assert final.shards[on_idle[0]].attempts == 2
            assert all(s.state == "succeeded" for s in final.shards)
            np.testing.assert_array_equal(read_predictions(Path(final.output)), np.arange(180).reshape(90, 2) * 2)

            switch.unlink()  # the owner leaves: the node offers work again
            wait_for(lambda: node_named(client, "agent-idle").state == "ready", WAIT_S)
            assert node_named(client, "agent-idle").busy == ""
            quick = write_spec(toy, name="idle-back", model="toyjob:doubler", dataset="rows24.npz", shards=3,
                               batch_size=5, policy="throughput")
            back_id = cluster.farm("submit", str(quick), "--workdir", str(toy)).stdout.strip()
            run_to_end(client, back_id)
            back = client.job(back_id)
            assert back.state == "succeeded" and "agent-idle" in {s.node_name for s in back.shards}
    finally:
        stopped = cluster.farm("agent", "stop", "--name", "agent-idle", "--state-dir", str(cluster.state_dir))
        assert stopped.returncode == 0, stopped.stderr
