"""A lender holding only a join token gets the Ray token at Register (it must, to join Ray's cluster), and Ray lets
its holder run a task on any node, the head's own included (a task needing no resources fits anywhere). The head's
Ray node runs as the unprivileged farm-ray, so such a task cannot read the head's state folder (head.json holds the
API token). Run as root only: the head switches users for its Ray only when it runs as root."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest

from farm import ray_user
from farm.local import free_port, read_json
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc
from farm_agent.client import credentials
from tests.conftest import ROOT, farm
from tests.integration.inprocess_head import HW

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                                   reason="the head runs its Ray as another user only as root")]

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


@pytest.fixture()
def reachable_python() -> Iterator[ray_user.pwd.struct_passwd]:
    """farm-ray, and the folders on the way to this Python made traversable by others (o+x, not listable) for the
    test: on these machines Python lives under /root."""
    user = ray_user.ensure(ray_user.DEFAULT)
    opened: list[tuple[Path, int]] = []
    try:
        while (closed := ray_user.first_closed(user)) is not None:
            mode = closed[1].stat().st_mode
            opened.append((closed[1], mode))
            closed[1].chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
        yield user
    finally:
        for path, mode in reversed(opened):
            path.chmod(stat.S_IMODE(mode))


def test_a_lender_s_task_on_the_head_s_node_cannot_read_the_head_s_secrets(
        tmp_path: Path, reachable_python: ray_user.pwd.struct_passwd) -> None:
    state = tmp_path / "state"
    env = {"FARM_RAY_USER": ray_user.DEFAULT}
    started = farm("head", "start", "--host", "127.0.0.1", "--port", str(free_port()), "--ray-port",
                   str(free_port()), "--state-dir", str(state), "--detach", env=env)
    assert started.returncode == 0, started.stderr
    try:
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
        assert (outcome, what, euid) == ("refused", "PermissionError", reachable_python.pw_uid), what[:80]
    finally:
        farm("head", "stop", "--state-dir", str(state))
