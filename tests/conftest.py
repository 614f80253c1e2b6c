"""Shared fixtures. `cluster` starts a real head (Ray head, gRPC, SQLite) and two real trusted agents (they join the
head's Ray, as training needs) as separate processes on 127.0.0.1 with free ports, once per test session. Lent
agents, which never join the head's Ray, are what tests/security starts."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import EllipsisType
from typing import Any

import pytest

from farm.client import HeadInfo, find_head
from farm.local import processes_in_sessions, read_json, recorded_alive, sessions_of, terminate, wait_for
from tests.servers import s3_environment, serve_s3
from tests.ports import head_ports

ROOT = Path(__file__).resolve().parents[1]
# Heads and agents the tests start keep Ray as the tests' own user (farm.ray_user: as root they would run it as
# farm-ray, who may not reach a Python installed under /root, as on the test machines); test_ray_user.py runs a head
# with its Ray as farm-ray.
os.environ.setdefault("FARM_RAY_USER", "root")
# The tests choose their heads themselves: a user's profiles (~/.config/farm/config.toml, farm.client.config) and
# FARM_HEAD, FARM_PROFILE, ... would send their commands elsewhere. FARM_CONFIG names a file of the tests' own (none
# there: no profile); a test of profiles points it at its own file.
TEST_CONFIG = Path(tempfile.gettempdir()) / f"farm-tests-{os.getuid()}" / "config.toml"
os.environ["FARM_CONFIG"] = str(TEST_CONFIG)
for _name in ("FARM_HEAD", "FARM_PROFILE", "FARM_TOKEN", "FARM_TOKEN_FILE", "FARM_CA", "FARM_INSECURE"):
    os.environ.pop(_name, None)
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def farm(*args: str, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path = ROOT
         ) -> subprocess.CompletedProcess[str]:
    """Run the real `farm` command line."""
    return subprocess.run(
        [sys.executable, "-m", "farm.cli.main", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, **(env or {})},
    )


@dataclass
class Cluster:
    state_dir: Path
    head: HeadInfo
    s3: dict[str, str]  # the loopback bucket server's endpoint and credentials, in the head's and agents' environment

    def env(self) -> dict[str, str]:
        # The bucket's too: an agent a test starts on this farm reads a bucket's dataset as the others do.
        return {"FARM_STATE_DIR": str(self.state_dir), **self.s3}

    def farm(self, *args: str, timeout: float = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
        return farm(*args, env=self.env(), timeout=timeout, cwd=cwd)

    @property
    def dashboard(self) -> str:
        return str((read_json(self.state_dir / "head.json") or {})["dashboard"])

    def dashboard_call(self, path: str, method: str = "GET", token: str | None | EllipsisType = ...
                       ) -> tuple[int, Any]:
        """A request to the head's dashboard over its TLS, trusting the head's CA, with the API token (or `token`;
        None: none); its status and its body (JSON, else bytes)."""
        token = self.head.api_token if token is ... else token
        request = urllib.request.Request(self.dashboard + path, method=method,
                                         headers={"Authorization": f"Bearer {token}"} if token else {})
        trusted = ssl.create_default_context(cadata=(self.head.ca_pem or b"").decode())
        try:
            with urllib.request.urlopen(request, timeout=30, context=trusted) as reply:
                status, body = reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def agent_pids(self) -> dict[str, int]:
        found = {}
        for path in (self.state_dir / "agents").glob("*/agent.json"):
            status = read_json(path) or {}
            if recorded_alive(status):
                found[str(status["name"])] = int(status["pid"])
        return found


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    """A job's folder holding tests/fixtures/jobs/workerjob.py (the execution path's tests: workers, attacks)."""
    folder = tmp_path / "work"
    folder.mkdir()
    shutil.copy(FIXTURES / "jobs" / "workerjob.py", folder / "workerjob.py")
    return folder


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 for the whole session (tests.servers): the stand-in for a real bucket."""
    with serve_s3() as url:
        yield url


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("farm-state")
    s3 = s3_environment(s3_endpoint)  # as an operator gives a farm a bucket: in its processes' environment
    started = farm("head", "start", "--host", "127.0.0.1", *head_ports(), "--state-dir", str(state), "--detach",
                   env=s3)
    assert started.returncode == 0, started.stderr
    head = find_head(state_dir=state)
    cluster = Cluster(state_dir=state, head=head, s3=s3)
    try:  # an agent that fails to start must not leave the head and the other agent running
        agents = [
            subprocess.Popen(
                [sys.executable, "-m", "farm.cli.main", "agent", "start", "--head", head.address, "--token",
                 head.join_token, "--ca-hash", head.ca_hash, "--name", name, "--cpus", "1", "--state-dir", str(state),
                 "--detach", "--max-foreign-cpu", "100",  # both agents share this host: neither is the other's owner
                 "--trusted"],  # the operator's own (the head's state folder gives the API token): training runs here
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **s3},
            )
            for name in ("agent-a", "agent-b")
        ]
        for proc in agents:
            _, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err
        yield cluster
    finally:
        stop_cluster(cluster)


def stop_cluster(cluster: Cluster) -> None:
    """This farm's processes only: the head's, the agents' and their Ray nodes' sessions (others may share the host)."""
    state = cluster.state_dir
    sessions = sessions_of([int((read_json(state / "head.json") or {}).get("pid", 0)), *cluster.agent_pids().values()])
    sessions.discard(os.getsid(0))
    stopped = farm("agent", "stop", "--state-dir", str(state))
    assert stopped.returncode in (0, 2), stopped.stderr  # 2: a test already stopped them all, or none started
    assert farm("head", "stop", "--state-dir", str(state)).returncode == 0
    wait_for(lambda: not processes_in_sessions(sessions), 20, 0.5)
    leftover = processes_in_sessions(sessions)
    terminate(*leftover, grace=5)
    assert not leftover, f"processes left behind: {leftover}"
