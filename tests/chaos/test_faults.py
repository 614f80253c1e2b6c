"""Faults of one shard or one node on the shared test cluster (tests/conftest.py: a real head and two agents)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from farm.local import ray_temp_dir, read_json, wait_for
from tests.chaos import chaosjob
from tests.conftest import Cluster

pytestmark = pytest.mark.slow


def job_folder(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(Path(chaosjob.__file__), work / "chaosjob.py")
    return work


@pytest.mark.timeout(240)  # a shard failing for ever must end the job, not hang it
def test_a_shard_that_keeps_killing_its_worker_fails_the_job_after_the_retry_limit(cluster: Cluster,
                                                                                   tmp_path: Path) -> None:
    work = job_folder(tmp_path)
    spec = work / "crash.yaml"
    spec.write_text(yaml.safe_dump({"name": "crash", "model": "chaosjob:worker_killer", "dataset": "chaosjob:numbers",
                                    "shards": 1, "batch_size": 2, "backends": ["cpu"]}))
    # --no-check: the preflight would run the model here (and see its process die) before it reaches a node.
    result = cluster.farm("submit", str(spec), "--wait", "--json", "--workdir", str(work), "--no-check",
                          timeout=220)
    assert result.returncode == 1, result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "failed"
    # A crashed worker is the node's failure, not the job code's: the shard is tried max_attempts (3) times; its node
    # says how its worker ended (farm_agent.daemon.workers), in words, never as an object the head unpickles.
    # The signal by name and the worker's last output (faulthandler's stack included), in one line.
    assert job["error"].startswith("shard 0: its worker was killed by SIGSEGV; its last output: ")
    assert "native library: giving up" in job["error"] and "Fatal Python error" in job["error"]
    assert job["error"].endswith("(after 3 attempts)")
    assert "\n" not in job["error"]
    assert [s["attempts"] for s in job["shards"]] == [3]


def test_an_agent_started_again_registers_under_the_same_node_id(cluster: Cluster) -> None:
    before = {n["name"]: n["id"] for n in json.loads(cluster.farm("nodes", "--json").stdout)}
    identity = read_json(cluster.state_dir / "agents" / "agent-b" / "node.json") or {}
    assert identity.get("node_id") == before["agent-b"]
    stopped = cluster.farm("agent", "stop", "--name", "agent-b")
    assert stopped.returncode == 0, stopped.stderr
    assert not ray_temp_dir(before["agent-b"]).exists()  # its Ray folder goes with it (40 were left on one box)
    started = cluster.farm("agent", "start", "--head", cluster.head.address, "--token", cluster.head.join_token,
                           "--ca-hash", cluster.head.ca_hash, "--name", "agent-b", "--cpus", "1", "--state-dir",
                           str(cluster.state_dir), "--detach",
                           "--max-foreign-cpu", "100")
    assert started.returncode == 0, started.stderr
    after = [(n["id"], n["state"]) for n in json.loads(cluster.farm("nodes", "--json").stdout)
             if n["name"] == "agent-b"]
    assert after == [(before["agent-b"], "ready")]  # one node, the same one: not a second record of the machine


def test_an_agent_started_again_by_hand_needs_neither_the_head_nor_the_join_token(cluster: Cluster) -> None:
    """`farm agent start` after a stop (or a reboot) rejoins on the node's own credentials, which its last Register
    saved (node.json, its certificate node.pem, the head's CA): no join token, no --head, no --ca-hash; and
    `farm agent status` reports it, though no service runs it."""
    state = str(cluster.state_dir)
    before = {n["name"]: n["id"] for n in json.loads(cluster.farm("nodes", "--json").stdout)}
    stopped = cluster.farm("agent", "stop", "--name", "agent-b")
    assert stopped.returncode == 0, stopped.stderr
    status = json.loads(cluster.farm("agent", "status", "--state-dir", state, "--json").stdout)
    assert {a["name"]: (a["node_id"], a["running"]) for a in status["by_hand"]}["agent-b"] == (before["agent-b"], None)

    started = cluster.farm("agent", "start", "--name", "agent-b", "--cpus", "1", "--state-dir", state, "--detach",
                           "--max-foreign-cpu", "100")
    assert started.returncode == 0, started.stderr
    after = [(n["id"], n["state"]) for n in json.loads(cluster.farm("nodes", "--json").stdout)
             if n["name"] == "agent-b"]
    assert after == [(before["agent-b"], "ready")]
    status = json.loads(cluster.farm("agent", "status", "--state-dir", state, "--json").stdout)
    running = {a["name"]: a for a in status["by_hand"]}["agent-b"]
    assert (running["head"], running["node_id"]) == (cluster.head.address, before["agent-b"])
    assert running["running"]["pid"] == cluster.agent_pids()["agent-b"]
    text = cluster.farm("agent", "status", "--state-dir", state).stdout
    assert f"agent agent-b (not a service) -> head {cluster.head.address}, node {before['agent-b']}: ready (pid" in text


def test_an_agent_whose_join_token_expired_since_rejoins_on_its_own_credentials(cluster: Cluster,
                                                                               tmp_path: Path) -> None:
    """As an installed service starts it after a reboot (`farm agent start --token-file FILE`, the file holding the
    join token it was installed with): the token has expired since, and the node rejoins all the same."""
    state = str(cluster.state_dir)
    made = cluster.farm("head", "token", "create", "--ttl", "1s", "--json", "--state-dir", state)
    assert made.returncode == 0, made.stderr
    expiring = json.loads(made.stdout)
    token_file = tmp_path / "join.token"
    token_file.write_text(expiring["token"] + "\n")
    before = {n["name"]: n["id"] for n in json.loads(cluster.farm("nodes", "--json").stdout)}
    stopped = cluster.farm("agent", "stop", "--name", "agent-b")
    assert stopped.returncode == 0, stopped.stderr
    assert wait_for(lambda: time.time() > expiring["expires_at"] + 0.5, 10)

    started = cluster.farm("agent", "start", "--head", cluster.head.address, "--token-file", str(token_file),
                           "--ca-hash", cluster.head.ca_hash, "--name", "agent-b", "--cpus", "1", "--state-dir", state,
                           "--detach", "--max-foreign-cpu", "100")
    assert started.returncode == 0, started.stderr  # the old agent: "join token jt-... has expired"
    after = [(n["id"], n["state"]) for n in json.loads(cluster.farm("nodes", "--json").stdout)
             if n["name"] == "agent-b"]
    assert after == [(before["agent-b"], "ready")]
