"""A head started with `--host 127.0.0.1` (the shared cluster's) keeps everything it and its agents listen on to
loopback, Ray's ports included; its state folder is 0700 and every file in it 0600 (issue 18, finding 15)."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

import psutil
import pytest

from farm.local import processes_in_sessions, read_json
from tests.conftest import Cluster

pytestmark = pytest.mark.slow


def ray_processes(record: Path) -> set[int]:
    """The processes of the Ray node whose session `record` (ray-head.json, an agent's ray-node.json) names."""
    session = int((read_json(record) or {}).get("session", 0))
    assert session, f"no Ray session recorded in {record}"
    return processes_in_sessions({session})


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return bool((getattr(ip, "ipv4_mapped", None) or ip).is_loopback)  # ::ffff:127.0.0.1 too


def test_ray_and_the_head_listen_on_loopback_only(cluster: Cluster) -> None:
    # The head's Ray node and the shared farm's two agents' (other tests' agents, some killed outright, come and go).
    records = [cluster.state_dir / "ray-head.json",
               *(cluster.state_dir / "agents" / name / "ray-node.json" for name in ("agent-a", "agent-b"))]
    assert all(record.is_file() for record in records), records
    pids = {int((read_json(cluster.state_dir / "head.json") or {})["pid"])}
    for record in records:
        pids |= ray_processes(record)
    listening = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            sockets = process.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        for sock in sockets:
            if sock.status == psutil.CONN_LISTEN:
                listening[(sock.laddr.ip, sock.laddr.port)] = " ".join(process.cmdline()[:3])
    assert len(listening) >= 6, listening  # gRPC, mTLS, the dashboard; GCS, raylets, object managers, ...
    exposed = {address: name for address, name in listening.items() if not loopback(address[0])}
    assert not exposed, exposed


def test_the_state_folder_is_private(cluster: Cluster) -> None:
    """Every file of the head's and the agents' state 0600, every folder 0700: tokens, keys, the store (and its WAL),
    the logs (head.log, ray-head.log, each agent's)."""
    state = cluster.state_dir
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    names = set()
    wrong = {}
    for folder, dirs, files in os.walk(state):
        for name in dirs:
            mode = stat.S_IMODE((Path(folder) / name).lstat().st_mode)
            if mode != 0o700:
                wrong[str(Path(folder, name).relative_to(state))] = oct(mode)
        for name in files:
            path = Path(folder) / name
            names.add(name)
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode & 0o077:
                wrong[str(path.relative_to(state))] = oct(mode)
    assert {"state.db", "head.log", "ray-head.log", "head.json", "agent.log"} <= names, names
    assert not wrong, wrong
