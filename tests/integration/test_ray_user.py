"""Job code never runs as root, and a lender never holds the head's Ray credentials.

- A lender holding only a join token gets no Ray address or token at Register: the head's Ray (which runs as the
  unprivileged farm-ray where the head is root) holds only the operator's trusted nodes.
- Job code on a lent node runs in the agent's persistent workers as farm-ray: it cannot read the agent's folder (its
  join token, node key, node token), and what it starts in a session of its own ends when the agent stops
  (farm/node_group.py), with the workers' folder.

One head (its Ray as farm-ray) and one lent agent (its workers as farm-ray) serve the module. Run as root only: a head
or agent switches users only when it runs as root."""

from __future__ import annotations

import json
import os
import shutil
import stat
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
from farm.local import free_port, read_json, wait_for
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc
from farm_agent.daemon.client import NODE_IDENTITY_FILE, credentials
from farm_agent.daemon.main import worker_packages
from tests.conftest import ROOT, farm
from tests.integration.inprocess_head import HW
from tests.ports import head_ports

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                                   reason="Ray runs as another user only for a head or agent run "
                                                          "as root")]

# Job code, as any job's runs: its model's constructor, in the lent agent's worker. It reads files, says where Farm's
# worker code keeps its state, or leaves a process running in a session of its own through a parent that exits at
# once (a double fork: no longer the worker's child); what it found goes to $PROBE_OUT as JSON.
PROBE = """
import json, os, subprocess, sys
import torch

DAEMON = ("import subprocess as s; print(s.Popen(['sleep', '600'], start_new_session=True, stdin=s.DEVNULL, "
          "stdout=s.DEVNULL, stderr=s.DEVNULL).pid)")


def build():
    mode, paths = os.environ["PROBE_MODE"], json.loads(os.environ.get("PROBE_PATHS", "[]"))
    if mode == "spawn":
        started = subprocess.run([sys.executable, "-c", DAEMON], capture_output=True, text=True)
        found = int(started.stdout)
    elif mode == "state":
        from farm_agent.tuner.cache import default_dir
        default_dir().mkdir(parents=True, exist_ok=True)
        (default_dir() / "probe.json").write_text("{}")
        found = str(default_dir())
    else:
        found = {}
        for path in paths:
            try:
                with open(path, "rb"):
                    found[path] = "read"
            except OSError as exc:
                found[path] = type(exc).__name__
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump([found, os.geteuid()], out)
    return torch.nn.Identity()


def rows():
    import numpy as np
    return np.zeros((4, 2), dtype=np.float32)
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
    agent_root: Path  # the agent's own Farm folder (its --state-dir)
    user: ray_user.pwd.struct_passwd
    work: Path  # job code, and a folder farm-ray may write its findings in

    @property
    def agent_dir(self) -> Path:
        return self.agent_root / "agents" / "lent"

    def job(self, mode: str, *paths: Path) -> list[object]:
        """Run PROBE as a job's code on the lent agent; what it found, and the user it ran as."""
        out = self.work / "found" / f"{mode}.json"
        spec = {"name": f"probe-{mode}", "model": "probe:build", "dataset": "probe:rows", "shards": 1,
                "batch_size": 4, "backends": ["cpu"], "output": str(self.work / "out" / mode),
                "env": {"PROBE_MODE": mode, "PROBE_PATHS": json.dumps(list(map(str, paths))), "PROBE_OUT": str(out)}}
        (self.work / f"{mode}.yaml").write_text(yaml.safe_dump(spec))
        done = farm("submit", str(self.work / f"{mode}.yaml"), "--wait", "--json", "--no-check", "--workdir",
                    str(self.work / "code"), env={"FARM_STATE_DIR": str(self.state)})
        assert done.returncode == 0, done.stderr or _why(done.stdout, self.state)
        return list(json.loads(out.read_text()))


def _why(stdout: str, state: Path) -> str:
    """A failed job's error and the tail of its log: what a failure here needs to be understood."""
    job = json.loads(stdout)
    logs = farm("logs", job["id"], env={"FARM_STATE_DIR": str(state)}).stdout
    return f"{job.get('error')}\n{logs[-4000:]}"


@pytest.fixture(scope="module")
def farm_ray_farm(tmp_path_factory: pytest.TempPathFactory,
                  reachable_python: ray_user.pwd.struct_passwd) -> Iterator[FarmRayFarm]:
    """A head and an agent (`lent`), each with its Ray as farm-ray. The agent's folder is on a path farm-ray can
    walk (a 0755 folder in /tmp, not pytest's private one): only the agent's own modes keep job code out of it."""
    state = tmp_path_factory.mktemp("farm-ray-head")
    env = {"FARM_RAY_USER": ray_user.DEFAULT}
    ray_port = free_port()
    started = farm("head", "start", "--host", "127.0.0.1", *head_ports(ray_port), "--state-dir", str(state),
                   "--detach", env=env)
    assert started.returncode == 0, started.stderr
    agent_root = Path(tempfile.mkdtemp(prefix="farm-ray-agent-"))
    agent_root.chmod(0o755)
    try:
        head = find_head(state_dir=state)
        joined = farm("agent", "start", "--head", head.address, "--ca-hash", head.ca_hash, "--name", "lent",
                      "--cpus", "1", "--max-foreign-cpu", "100", "--state-dir", str(agent_root), "--detach",
                      env={**env, "FARM_JOIN_TOKEN": head.join_token})
        assert joined.returncode == 0, joined.stderr
        work = Path(tempfile.mkdtemp(prefix="farm-ray-work-"))
        (work / "code").mkdir()
        (work / "code" / "probe.py").write_text(PROBE)
        (work / "found").mkdir(mode=0o777)
        (work / "found").chmod(0o777)  # the worker, as farm-ray, writes its findings here
        work.chmod(0o755)
        yield FarmRayFarm(state, head, agent_root, reachable_python, work)
    finally:
        stopped = farm("agent", "stop", "--state-dir", str(agent_root))
        assert stopped.returncode in (0, 2), stopped.stderr  # 2: the test stopped it already
        farm("head", "stop", "--state-dir", str(state))
        shutil.rmtree(agent_root, ignore_errors=True)


def test_a_lender_gets_no_ray_credentials_and_the_heads_ray_runs_as_farm_ray(farm_ray_farm: FarmRayFarm) -> None:
    """Issue 27: the Ray token Register handed every lender let one run a task on the head's own Ray node."""
    state = farm_ray_farm.state
    recorded = (read_json(state / "ray-head.json") or {}).get("processes", [])
    assert recorded and {psutil.Process(pid).username() for pid, _ in recorded} == {ray_user.DEFAULT}
    info = read_json(state / "head.json") or {}
    ca = (state / "tls" / "ca.pem").read_bytes()
    with grpc.secure_channel(info["address"], grpc.ssl_channel_credentials(ca)) as channel:  # a lender joins
        reply = agent_pb2_grpc.AgentServiceStub(channel).Register(agent_pb2.RegisterRequest(
            join_token=info["join_token"], name="lender", hardware=convert.hardware_to_pb(HW)),
            metadata=credentials(info["join_token"]), timeout=10)
    assert (reply.ray_address, reply.ray_token) == ("", "")
    assert not (farm_ray_farm.agent_dir / "ray.token").exists()


def test_job_code_cannot_read_the_agent_s_tokens_and_key(farm_ray_farm: FarmRayFarm) -> None:
    """Finding 4: a job's code returned the agent's join token and node key in its output."""
    folder = farm_ray_farm.agent_dir
    secrets = [folder / "join.token", folder / NODE_IDENTITY_FILE, folder / "node.json"]
    read, euid = farm_ray_farm.job("read", *secrets)
    assert read == {str(p): "PermissionError" for p in secrets}
    assert euid == farm_ray_farm.user.pw_uid  # the agent's workers run as farm-ray
    # The worker's own state (the kernel tuner's cache, Core ML conversions) lives where its user may write: not in
    # the agent's folder (on the H200 every cuda shard failed with PermissionError on the tuner's cache there).
    cache, _ = farm_ray_farm.job("state")
    assert not Path(str(cache)).is_relative_to(farm_ray_farm.agent_root), cache
    assert Path(str(cache)).stat().st_uid == farm_ray_farm.user.pw_uid
    info = folder.stat()  # the agent's folder is root's and private, its secrets 0600
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
    assert {stat.S_IMODE(p.stat().st_mode) for p in secrets} == {0o600}


def test_a_job_runs_on_the_agent_s_node_as_farm_ray(farm_ray_farm: FarmRayFarm, tmp_path: Path) -> None:
    """Farm's own job path (its code unpacked in a worker, torch, the data plane, results to the head) works as
    farm-ray."""
    spec = yaml.safe_load((ROOT / "examples/digits/infer.yaml").read_text())
    spec.update(output=str(tmp_path / "out"), shards=2)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    done = farm("submit", str(tmp_path / "job.yaml"), "--wait", "--json", "--workdir", str(ROOT),
                env={"FARM_STATE_DIR": str(farm_ray_farm.state)})
    assert done.returncode == 0, done.stderr or _why(done.stdout, farm_ray_farm.state)
    job = json.loads(done.stdout)
    assert job["state"] == "succeeded" and job["items"] == 540 and job["metrics"]["accuracy"] >= 0.90
    assert {s["node_name"] for s in job["shards"]} == {"lent"}


def test_what_job_code_starts_ends_when_the_agent_stops(farm_ray_farm: FarmRayFarm) -> None:
    """Finding 4: a process a job started in a new session survived `farm agent stop`; and the workers' folder (their
    unpacked job code) stays behind no more. Stops the module's agent: the module's last test."""
    pid, euid = farm_ray_farm.job("spawn")
    child = psutil.Process(int(pid))  # with its start time: a pid reused meanwhile is not taken for it
    assert os.getsid(child.pid) != os.getsid(0)  # a session of its own: ending the worker's misses it
    # This agent's workers' folder: where the job's child runs (its worker's code folder, farm-work-*/w<N>-*/code);
    # another agent on this machine (another test run's) has its own.
    folders = [Path(child.cwd()).parents[1]]
    assert folders[0].name.startswith("farm-work-") and folders[0].stat().st_uid == farm_ray_farm.user.pw_uid

    stopped = farm("agent", "stop", "--state-dir", str(farm_ray_farm.agent_root))
    assert stopped.returncode == 0, stopped.stderr
    try:
        assert wait_for(lambda: gone(child), 10), f"{child} outlived the agent"
    finally:
        if not gone(child):
            child.kill()
    assert euid == farm_ray_farm.user.pw_uid
    assert not any(folder.exists() for folder in folders)


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
