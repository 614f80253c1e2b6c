"""Ray's cluster is one trust domain: its token lets whoever holds it run code on any node, and job code is such
code. So Ray never runs as root: a head or agent running as root runs its Ray node as the unprivileged farm-ray.

- A lender holding only a join token gets the Ray token at Register (it must, to join Ray's cluster), and Ray lets
  it run a task on any node, the head's own included (a task needing no resources fits anywhere): such a task cannot
  read the head's state folder (head.json holds the API token).
- Job code on an agent's node cannot read the agent's folder (its join token, node key, node token), and what it
  starts in a session of its own ends when the agent stops (farm/node_group.py), with the node's Ray folder.

One head and one agent, both with their Ray as farm-ray, serve the module. Run as root only: a head or agent
switches users for its Ray only when it runs as root."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
import yaml

from farm import ray_user
from farm.client import HeadInfo, find_head
from farm.local import free_port, ray_temp_dir, read_json, wait_for
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc
from farm_agent.daemon.client import NODE_IDENTITY_FILE, credentials
from farm.core.ids import NODE_LABEL
from farm_agent.daemon.main import worker_packages
from tests.conftest import ROOT, farm
from tests.integration.inprocess_head import HW

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                                   reason="Ray runs as another user only for a head or agent run "
                                                          "as root")]

STEAL = """
import json, os, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address=sys.argv[1], log_to_driver=False)
head = next(n for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])

@ray.remote(num_cpus=0)
def steal(path):
    try:
        return ["read", open(path).read(), os.geteuid()]
    except OSError as exc:
        return ["refused", type(exc).__name__, os.geteuid()]

pinned = steal.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head["NodeID"], soft=False))
print(json.dumps(ray.get(pinned.remote(sys.argv[2]), timeout=120)))
"""


# Job code, as any job's code runs: a Ray task on the agent's node. It reads files, or leaves a process running in a
# session of its own, through a parent that exits at once (a double fork: no longer the worker's child, which Ray
# would end with the worker).
JOB = """
import json, os, subprocess, sys
import ray

ray.init(address=sys.argv[1], log_to_driver=False)
DAEMON = ("import subprocess as s; print(s.Popen(['sleep', '600'], start_new_session=True, stdin=s.DEVNULL, "
          "stdout=s.DEVNULL, stderr=s.DEVNULL).pid)")

@ray.remote(num_cpus=0)
def job(mode, paths):
    if mode == "spawn":
        started = subprocess.run([sys.executable, "-c", DAEMON], capture_output=True, text=True)
        return [int(started.stdout), os.geteuid()]
    if mode == "state":  # where Farm's worker code keeps its own state (the kernel tuner's cache): writable
        from farm_agent.tuner.cache import default_dir
        default_dir().mkdir(parents=True, exist_ok=True)
        (default_dir() / "probe.json").write_text("{}")
        return [str(default_dir()), os.geteuid()]
    read = {}
    for path in paths:
        try:
            with open(path, "rb"):
                read[path] = "read"
        except OSError as exc:
            read[path] = type(exc).__name__
    return [read, os.geteuid()]

pinned = job.options(label_selector={sys.argv[2]: sys.argv[3]})
print(json.dumps(ray.get(pinned.remote(sys.argv[4], sys.argv[5:]), timeout=120)))
"""


@pytest.fixture(scope="module")
def reachable_python() -> Iterator[ray_user.pwd.struct_passwd]:
    """farm-ray, and the folders on the way to this Python and Farm's packages made traversable by others (o+x, not
    listable) for the test: on these machines Python lives under /root (and CI's checkout may too)."""
    user = ray_user.ensure(ray_user.DEFAULT)
    opened: list[tuple[Path, int]] = []
    try:
        while (closed := ray_user.first_closed(user, worker_packages())) is not None:
            mode = closed[1].stat().st_mode
            opened.append((closed[1], mode))
            closed[1].chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
        yield user
    finally:
        for path, mode in reversed(opened):
            path.chmod(stat.S_IMODE(mode))


@dataclass
class FarmRayFarm:
    state: Path  # the head's state folder
    head: HeadInfo
    ray_address: str
    agent_root: Path  # the agent's own Farm folder (its --state-dir)
    user: ray_user.pwd.struct_passwd

    @property
    def agent_dir(self) -> Path:
        return self.agent_root / "agents" / "lent"

    @property
    def node_id(self) -> str:
        return str((read_json(self.agent_dir / "node.json") or {})["node_id"])

    def job(self, mode: str, *paths: Path) -> list[object]:
        """Run JOB on the agent's node with the Ray token (as a lender, or job code, holds it)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=(self.state / "ray.token").read_text().strip(),
                   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")  # a Ray kept on loopback: see the lender's below
        done = subprocess.run([sys.executable, "-c", JOB, self.ray_address, NODE_LABEL, self.node_id, mode,
                               *map(str, paths)], capture_output=True, text=True, timeout=180, env=env,
                              cwd=self.agent_root)
        assert done.returncode == 0, done.stderr[-2000:]
        return list(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def farm_ray_farm(tmp_path_factory: pytest.TempPathFactory,
                  reachable_python: ray_user.pwd.struct_passwd) -> Iterator[FarmRayFarm]:
    """A head and an agent (`lent`), each with its Ray as farm-ray. The agent's folder is on a path farm-ray can
    walk (a 0755 folder in /tmp, not pytest's private one): only the agent's own modes keep job code out of it."""
    state = tmp_path_factory.mktemp("farm-ray-head")
    env = {"FARM_RAY_USER": ray_user.DEFAULT}
    ray_port = free_port()
    started = farm("head", "start", "--host", "127.0.0.1", "--port", str(free_port()), "--ray-port", str(ray_port),
                   "--state-dir", str(state), "--detach", env=env)
    assert started.returncode == 0, started.stderr
    agent_root = Path(tempfile.mkdtemp(prefix="farm-ray-agent-"))
    agent_root.chmod(0o755)
    try:
        head = find_head(state_dir=state)
        joined = farm("agent", "start", "--head", head.address, "--ca-hash", head.ca_hash, "--name", "lent",
                      "--cpus", "1", "--max-foreign-cpu", "100", "--state-dir", str(agent_root), "--detach",
                      env={**env, "FARM_JOIN_TOKEN": head.join_token})
        assert joined.returncode == 0, joined.stderr
        yield FarmRayFarm(state, head, f"127.0.0.1:{ray_port}", agent_root, reachable_python)
    finally:
        stopped = farm("agent", "stop", "--state-dir", str(agent_root))
        assert stopped.returncode in (0, 2), stopped.stderr  # 2: the test stopped it already
        farm("head", "stop", "--state-dir", str(state))
        shutil.rmtree(agent_root, ignore_errors=True)


def test_a_lender_s_task_on_the_head_s_node_cannot_read_the_head_s_secrets(
        farm_ray_farm: FarmRayFarm, tmp_path: Path) -> None:
    state = farm_ray_farm.state
    recorded = (read_json(state / "ray-head.json") or {}).get("processes", [])
    assert recorded and {psutil.Process(pid).username() for pid, _ in recorded} == {ray_user.DEFAULT}

    info = read_json(state / "head.json") or {}
    ca = (state / "tls" / "ca.pem").read_bytes()
    with grpc.secure_channel(info["address"], grpc.ssl_channel_credentials(ca)) as channel:  # the lender joins
        reply = agent_pb2_grpc.AgentServiceStub(channel).Register(agent_pb2.RegisterRequest(
            join_token=info["join_token"], name="lender", hardware=convert.hardware_to_pb(HW)),
            metadata=credentials(info["join_token"]), timeout=10)
    lender = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: Ray's local-only mode, in which a driver reaches a Ray kept on
    # loopback (farm.local.RAY_START_ON_LOOPBACK) at 127.0.0.1, not at the machine's reachable address.
    lender.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=reply.ray_token, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    stolen = subprocess.run([sys.executable, "-c", STEAL, reply.ray_address, str(state / "head.json")],
                            capture_output=True, text=True, timeout=180, env=lender, cwd=tmp_path)
    assert stolen.returncode == 0, stolen.stderr[-2000:]
    outcome, what, euid = json.loads(stolen.stdout.strip().splitlines()[-1])
    assert (outcome, what, euid) == ("refused", "PermissionError", farm_ray_farm.user.pw_uid), what[:80]


def test_job_code_cannot_read_the_agent_s_tokens_and_key(farm_ray_farm: FarmRayFarm) -> None:
    """Finding 4: a job's code returned the agent's join token, Ray token and node key in its output."""
    folder = farm_ray_farm.agent_dir
    secrets = [folder / "join.token", folder / NODE_IDENTITY_FILE, folder / "node.json", folder / "ray.token"]
    read, euid = farm_ray_farm.job("read", *secrets)
    assert read == {str(p): "PermissionError" for p in secrets}

    assert euid == farm_ray_farm.user.pw_uid  # the agent's Ray node runs as farm-ray, every process of it
    recorded = (read_json(folder / "ray-node.json") or {}).get("processes", [])
    assert recorded and {psutil.Process(pid).username() for pid, _ in recorded} == {ray_user.DEFAULT}
    # The worker's own state (the kernel tuner's cache, Core ML conversions) lives where its user may write: not in
    # the agent's folder (on the H200 every cuda shard failed with PermissionError on the tuner's cache there).
    cache, _ = farm_ray_farm.job("state")
    assert Path(str(cache)).is_relative_to(ray_temp_dir(farm_ray_farm.node_id)), cache
    info = folder.stat()  # the agent's folder is root's and private, its secrets 0600
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
    assert {stat.S_IMODE(p.stat().st_mode) for p in secrets} == {0o600}


def test_a_job_runs_on_the_agent_s_node_as_farm_ray(farm_ray_farm: FarmRayFarm, tmp_path: Path) -> None:
    """Farm's own job path (its code unpacked by Ray, torch, the data plane, results to the head) works as farm-ray."""
    spec = yaml.safe_load((ROOT / "examples/digits/infer.yaml").read_text())
    spec.update(output=str(tmp_path / "out"), shards=2)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    done = farm("submit", str(tmp_path / "job.yaml"), "--wait", "--json", "--workdir", str(ROOT),
                env={"FARM_STATE_DIR": str(farm_ray_farm.state)})
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["state"] == "succeeded" and job["items"] == 540 and job["metrics"]["accuracy"] >= 0.90
    assert {s["node_name"] for s in job["shards"]} == {"lent"}


def test_what_job_code_starts_ends_when_the_agent_stops(farm_ray_farm: FarmRayFarm) -> None:
    """Finding 4: a process a job started in a new session survived `farm agent stop`; and the node's Ray folder
    (its logs, unpacked job code) stays behind no more. Stops the module's agent: the module's last test."""
    node_folder = ray_temp_dir(farm_ray_farm.node_id)
    pid, euid = farm_ray_farm.job("spawn")
    child = psutil.Process(int(pid))  # with its start time: a pid reused meanwhile is not taken for it
    ray_session = int((read_json(farm_ray_farm.agent_dir / "ray-node.json") or {})["session"])
    assert os.getsid(child.pid) not in (ray_session, os.getsid(0))  # out of the node's session: stop_session misses it
    assert node_folder.is_dir()

    stopped = farm("agent", "stop", "--state-dir", str(farm_ray_farm.agent_root))
    assert stopped.returncode == 0, stopped.stderr
    try:
        assert wait_for(lambda: gone(child), 10), f"{child} outlived the agent"
    finally:
        if not gone(child):
            child.kill()
    assert not node_folder.exists()
    assert euid == farm_ray_farm.user.pw_uid


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
