"""A Ray node's processes are ended together, however they left its session (farm/node_group.py): by its cgroup
where this machine lets Farm make one, else by the marker its user's processes carry. Only that node's processes:
a bystander of the same user, and another node's, live on. Plain processes stand for the node (no Ray here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from farm.local import clear_left_behind, record_session, spawn_detached, wait_for
from farm.node_group import MARKER, NodeGroup

# As job code in a Ray worker would: a child in a session of its own, another that also starts with an empty
# environment (no marker), then the worker goes on. Their pids go to the file named by argv[1].
ESCAPES = """
import os, subprocess, sys, time
kept = subprocess.Popen(["sleep", "300"], start_new_session=True)
bare = subprocess.Popen(["sleep", "301"], start_new_session=True, env={})
open(sys.argv[1], "w").write(f"{kept.pid} {bare.pid}")
time.sleep(300)
"""


def escaped(tmp_path: Path, group: NodeGroup, name: str) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    pids = tmp_path / f"{name}.pids"
    node = spawn_detached([sys.executable, "-c", ESCAPES, str(pids)], tmp_path / f"{name}.log",
                          env={**os.environ, **group.env()}, group=group)
    assert wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, 30)
    return node, [psutil.Process(int(pid)) for pid in pids.read_text().split()]


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def test_the_marker_ends_what_left_the_session_and_nothing_else(tmp_path: Path) -> None:
    group = NodeGroup(f"farm-ray-test-{os.getpid()}", os.geteuid(), cgroup=None)  # as where no cgroup can be made
    other = NodeGroup(f"farm-ray-other-{os.getpid()}", os.geteuid(), cgroup=None)
    bystander = subprocess.Popen(["sleep", "300"])
    node, (kept, bare) = escaped(tmp_path, group, "node")
    other_node, (other_kept, other_bare) = escaped(tmp_path, other, "other")
    try:
        assert {p.pid for p in group.processes()} == {node.pid, kept.pid}  # the empty environment hides `bare`
        assert sorted(group.end()) == sorted([node.pid, kept.pid])
        assert gone(kept) and node.wait(10) is not None
        assert bystander.poll() is None and not gone(other_kept) and not gone(bare)
    finally:
        other.end()
        for proc in (bystander, bare, other_bare):
            proc.kill()
    assert gone(other_kept)


def test_a_cgroup_ends_even_a_process_without_the_marker(tmp_path: Path) -> None:
    group = NodeGroup.make(f"farm-ray-test-{os.getpid()}", os.geteuid())
    if group.cgroup is None:
        pytest.skip("this process may make no cgroup v2 here (not root, or no writable unified hierarchy)")
    record = tmp_path / "ray-node.json"
    node, (kept, bare) = escaped(tmp_path, group, "node")
    try:
        assert {node.pid, kept.pid, bare.pid} <= {p.pid for p in group.processes()}
        folder = tmp_path / group.name  # the node's Ray folder
        folder.mkdir()
        record_session(record, node.pid, group, folder)
        # As at the next start after the owner was killed outright: the record names the group and the folder.
        assert {node.pid, kept.pid, bare.pid} <= set(clear_left_behind(record))
        assert gone(kept) and gone(bare) and node.wait(10) is not None
        assert not group.cgroup.exists() and not folder.exists()
    finally:
        group.end()


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="switching users needs root")
def test_a_node_is_in_its_cgroup_as_its_user(tmp_path: Path) -> None:
    from farm import ray_user

    user = ray_user.ensure(ray_user.DEFAULT)
    group = NodeGroup.make(f"farm-ray-test-{os.getpid()}", user.pw_uid)
    proc = spawn_detached(["sleep", "300"], tmp_path / "log", env={MARKER: group.name}, user=user, group=group)
    try:
        assert wait_for(lambda: psutil.Process(proc.pid).uids().real == user.pw_uid, 10)
        assert psutil.Process(proc.pid).uids() == (user.pw_uid,) * 3 and psutil.Process(proc.pid).gids().real == \
            user.pw_gid
        if group.cgroup is not None:
            assert Path(f"/proc/{proc.pid}/cgroup").read_text().strip().endswith("/" + group.name)
        assert group.end() == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
