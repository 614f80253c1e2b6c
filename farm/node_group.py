"""Every process of one Ray node, found again to end them all, however they left the node's session.

Job code runs in a Ray node's workers, and a process it starts may leave the node's session (setsid, a double fork):
ending the session (farm.local.stop_session) misses it, and it would outlive the agent, holding the machine. So each
Ray node Farm starts is a group of processes, found in two ways, both used:

- its own cgroup (v2), under this process's, where this process may make one (root on the machine; a systemd unit
  with `Delegate=yes`, as the agent's is): the kernel keeps every descendant of the node in it, a process of the
  node's unprivileged user cannot move itself out, and `cgroup.kill` ends them all at once;
- every process of the node's user whose environment carries the node's marker (`FARM_RAY_NODE=<the node's folder
  name>`, inherited by every descendant). Without a cgroup, a process that starts with an emptied environment and
  leaves the session escapes this: README's Security section says so.

A process is signalled only as the psutil.Process found, which checks its start time first: a pid reused since by
another process is never touched. The marker names one node of one farm (its folder, unique on the machine): another
farm's processes, or another node's, never carry it."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

MARKER = "FARM_RAY_NODE"


@dataclass(frozen=True)
class NodeGroup:
    name: str  # the node's folder name (farm-ray-<node id>): its marker's value and its cgroup's name
    uid: int  # the account the node's processes run as
    cgroup: Path | None  # its cgroup folder; None where this machine lets this process make none

    @classmethod
    def make(cls, name: str, uid: int) -> NodeGroup:
        """The group for a node about to start: what a previous run of the same node left is ended first."""
        stale = cls(name, uid, _cgroup_folder(name))
        stale.end()
        return cls(name, uid, _new_cgroup(stale.cgroup))

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "uid": self.uid, "cgroup": str(self.cgroup) if self.cgroup else ""}

    @classmethod
    def from_json(cls, saved: dict[str, object]) -> NodeGroup:
        cgroup = str(saved.get("cgroup") or "")
        return cls(str(saved["name"]), int(str(saved["uid"])), Path(cgroup) if cgroup else None)

    def env(self) -> dict[str, str]:
        return {MARKER: self.name}

    def add(self, pid: int) -> None:
        """Move process `pid` (a node just spawned, by this process's user) into the node's cgroup: the node's user
        may not move itself, and what it starts from then on is born inside. A failure leaves it to the marker."""
        if self.cgroup is None:
            return
        try:
            (self.cgroup / "cgroup.procs").write_text(str(pid))
        except OSError:
            pass

    def processes(self) -> list[psutil.Process]:
        """The group's live processes (this one excepted): its cgroup's, and the node's user's that carry its
        marker."""
        found: dict[int, psutil.Process] = {}
        for pid in _cgroup_pids(self.cgroup):
            try:
                found[pid] = psutil.Process(pid)
            except psutil.Error:
                continue
        marker = f"{MARKER}={self.name}"
        for proc in psutil.process_iter(["uids"]):
            try:
                if proc.pid in found or proc.info["uids"] is None or proc.info["uids"].real != self.uid:
                    continue
                if _environ_has(proc, marker):
                    found[proc.pid] = proc
            except psutil.Error:
                continue
        found.pop(os.getpid(), None)
        return [p for p in found.values() if _alive(p)]

    def end(self, timeout: float = 10.0) -> list[int]:
        """SIGKILL every process of the group, wait until they are gone, and remove its cgroup. Returns the pids."""
        members = self.processes()
        if self.cgroup is not None and (self.cgroup / "cgroup.kill").exists():  # also those forked meanwhile
            try:
                (self.cgroup / "cgroup.kill").write_text("1")
            except OSError:
                pass
        for proc in members:
            try:
                proc.send_signal(signal.SIGKILL)  # psutil checks the start time: a reused pid is left alone
            except psutil.Error:
                continue
        psutil.wait_procs(members, timeout=timeout)
        if self.cgroup is not None:
            _remove_cgroup(self.cgroup, timeout)
        return [p.pid for p in members]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _environ_has(proc: psutil.Process, entry: str) -> bool:
    """Whether a process started with `entry` (NAME=VALUE) in its environment: read raw from /proc on Linux
    (psutil's environ() parses every entry, for hundreds of processes), through psutil elsewhere (macOS)."""
    if sys.platform != "linux":
        name, _, value = entry.partition("=")
        return proc.environ().get(name) == value
    try:
        with open(f"/proc/{proc.pid}/environ", "rb") as handle:
            return entry.encode() in handle.read().split(b"\0")
    except OSError:
        return False


def _cgroup_root() -> tuple[Path, str] | None:
    """Where this process's cgroup v2 folder is: the unified hierarchy's mount point and this process's path in it,
    from /proc (None: no cgroup v2 here, or not Linux)."""
    if sys.platform != "linux":
        return None
    try:
        own = next((line[3:].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if line.startswith("0::")), None)
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    if own is None or own.endswith("(deleted)"):
        return None
    for line in mounts:
        fields, _, fstype = line.partition(" - ")
        parts = fields.split()
        if fstype.split()[:1] == ["cgroup2"] and len(parts) >= 5:
            root, point = parts[3], Path(parts[4])
            if own == root or own.startswith(root.rstrip("/") + "/"):  # a cgroup namespace mounts its own root
                return point, own[len(root.rstrip("/")):].lstrip("/")
    return None


def _cgroup_folder(name: str) -> Path | None:
    found = _cgroup_root()
    return None if found is None else found[0] / found[1] / name


def _new_cgroup(folder: Path | None) -> Path | None:
    if folder is None:
        return None
    try:
        folder.mkdir(exist_ok=True)  # one left by a run whose processes would not die: used as it is
    except OSError:  # not root, not delegated, a read-only mount: the marker alone
        return None
    if not os.access(folder / "cgroup.procs", os.W_OK):
        _remove_cgroup(folder, 0)
        return None
    return folder


def _cgroup_pids(folder: Path | None) -> list[int]:
    """The pids in a cgroup and in any cgroup under it."""
    if folder is None or not folder.is_dir():
        return []
    pids = []
    for procs in folder.rglob("cgroup.procs"):
        try:
            pids += [int(line) for line in procs.read_text().split()]
        except (OSError, ValueError):
            continue
    return pids


def _remove_cgroup(folder: Path, timeout: float) -> None:
    """Remove a cgroup and those under it, deepest first, once its processes are gone (the kernel refuses before)."""
    deadline = time.monotonic() + timeout
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        _rmdir(sub, deadline)
    _rmdir(folder, deadline)


def _rmdir(folder: Path, deadline: float) -> None:
    while True:
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)
