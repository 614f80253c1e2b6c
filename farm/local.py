"""Helpers for the processes and files Farm keeps on one machine: state files, background processes, Ray.

Shared by the head, the agent and the CLI; none of it is domain logic.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import psutil

from farm import ray_user, switch_user
from farm.core.errors import AgentError
from farm.node_group import NodeGroup


def default_state_dir() -> Path:
    return Path(os.environ.get("FARM_STATE_DIR") or Path.home() / ".farm").expanduser()


def private_folder(path: Path) -> None:
    """Make `path` and its missing parents, each 0700 (state folders hold tokens and keys)."""
    for folder in reversed([p for p in (path, *path.parents) if not p.exists()]):
        folder.mkdir(mode=0o700, exist_ok=True)


def keep_private(folder: Path) -> None:
    """Make `folder` 0700 and what this user owns in it this user's alone (folders 0700, files without group or
    other bits): a state folder, as a head or agent starts, whatever made its files (an older Farm, SQLite's own
    files, a copy). What another user owns there (a Ray node's account) is left as it is, and not entered."""
    private_folder(folder)
    folder.chmod(0o700)
    me = os.geteuid()
    for parent, folders, files in os.walk(folder):
        for name in list(folders):
            info = os.lstat(os.path.join(parent, name))
            if info.st_uid != me or stat.S_ISLNK(info.st_mode):
                folders.remove(name)
            else:
                os.chmod(os.path.join(parent, name), 0o700)
        for name in files:
            path = os.path.join(parent, name)
            info = os.lstat(path)
            if info.st_uid == me and stat.S_ISREG(info.st_mode):
                os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)


def write_private(path: Path, data: bytes) -> None:
    """Write atomically, readable by the owner only (state files hold tokens)."""
    private_folder(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    write_private(path, json.dumps(data, indent=2).encode())


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def this_process() -> dict[str, Any]:
    """This process as a state file records it (head.json, agent.json): its pid and its start time, which together
    name it. A pid alone does not: once the process exits, the system gives its number to the next process."""
    return {"pid": os.getpid(), "pid_started": psutil.Process().create_time()}


def pid_alive(pid: int, started: float) -> bool:
    """Whether process `pid` runs and is the one that started at `started` (its psutil create_time, recorded with
    the pid): a process that has since taken the pid over has another start time."""
    try:
        process = psutil.Process(pid)
        # create_time is the kernel's start tick (1/100 s) over the boot time: the same in every process that reads it
        return abs(process.create_time() - started) < 0.01 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def recorded_alive(record: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    """Whether the process a state file records (this_process()) still runs. A record without a start time is not
    trusted: its pid may be anyone's by now."""
    if not record:
        return False
    try:
        return pid_alive(int(record.get("pid", 0)), float(record.get("pid_started", 0)))
    except (TypeError, ValueError):
        return False


# Ports Farm picks for itself come from here: below Linux's ephemeral range (32768+), where Ray's own components bind
# port 0, and above Ray's worker ports (10002-19999). A pick from the ephemeral range was seen to be taken by a
# Ray component in the moment between the pick and its use.
PICKED_PORTS = range(20000, 32768)


def free_port(avoid: Collection[int] = ()) -> int:
    """A port nothing listens on now, on any interface, and not in `avoid` (ports to be bound later)."""
    return free_ports(1, avoid)[0]


def free_ports(count: int, avoid: Collection[int] = ()) -> list[int]:
    """`count` distinct ports nothing listens on now, on any interface, none in `avoid` (each is held until all are
    found: picks one by one can name the same port twice)."""
    held: list[socket.socket] = []
    try:
        for port in picked_ports(avoid):
            sock = bound("0.0.0.0", port)
            if sock is not None:
                held.append(sock)
            if len(held) == count:
                return [s.getsockname()[1] for s in held]
    finally:
        for sock in held:
            sock.close()
    raise OSError(f"no {count} free ports in {PICKED_PORTS.start}-{PICKED_PORTS.stop - 1}")


def picked_ports(avoid: Collection[int] = ()) -> Iterator[int]:
    """PICKED_PORTS in a random order, none in `avoid`: where a free port is looked for."""
    return (port for port in random.sample(PICKED_PORTS, len(PICKED_PORTS)) if port not in avoid)


def bound(host: str, port: int, reuse: bool = False) -> socket.socket | None:
    """A socket bound to `port` on `host` (IPv6 where it is an IPv6 address), or None where the port is taken.
    `reuse`: SO_REUSEADDR, as a server that keeps it binds it (aiohttp's sites do), so that a restart finds it free."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if reuse:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    return sock


def primary_ip() -> str:
    """The first non-loopback IPv4 address, read from the interfaces (no packet is sent)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return "127.0.0.1"


def local_ip_towards(host: str) -> str:
    """The address this machine's Ray node should bind to reach `host`: loopback for a head on loopback."""
    if host in ("localhost", "::1") or host.startswith("127."):
        return "127.0.0.1"
    return primary_ip()


def spawn_detached(args: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                   die_with_parent: bool = False, user: pwd.struct_passwd | None = None,
                   group: NodeGroup | None = None, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a process in its own session (it outlives the terminal), output appended to `log`. With
    `die_with_parent` (Linux), it gets SIGTERM when the calling thread dies, however it dies. With `user`, it runs
    as that user (this process being root), with no supplementary groups. With `group`, this process moves it into
    that node's cgroup as soon as it is spawned (before it has started anything of its own).

    This process is never forked (farm.switch_user says why): subprocess spawns with vfork and no Python in the
    child; the user switch and the death signal happen in the spawned process, before it execs `args`."""
    private_folder(log.parent)
    command = switch_user.command_as(user, args, death_signal=die_with_parent)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # a log is state: the owner's alone
    os.fchmod(fd, 0o600)
    with open(fd, "ab") as out:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(env) if env is not None else None, cwd=cwd,
        )
    if group is not None:
        group.add(proc.pid)
    return proc


def python_command(module: str, *args: str) -> list[str]:
    """`python -P -m MODULE ARGS`: this interpreter, never importing from the current folder (a folder that holds a
    `farm/` of its own, as a checkout of Farm does, would shadow the installed package)."""
    return [sys.executable, "-P", "-m", module, *args]


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def stop_session(leader: int, grace: float = 15.0) -> None:
    """SIGTERM a session leader and everything in its session, SIGKILL what outlives the grace period.

    Ray's worker processes take process groups of their own, so the session, not the group, is what holds a Ray
    node together.
    """
    members = [p for p in psutil.process_iter(["pid"]) if _session(p) == leader]
    for proc in members:
        _signal(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(members, timeout=grace)
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)


def terminate(*pids: int, grace: float = 60.0) -> None:
    """SIGTERM processes and wait for them together (each cleans up after itself); SIGKILL what outlives the grace
    period."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for straggler in alive:
        _signal(straggler, signal.SIGKILL)


def _session(proc: psutil.Process) -> int | None:
    try:
        return os.getsid(proc.pid)
    except OSError:
        return None


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass  # already gone


def ray_executable() -> str:
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def on_loopback(address: str) -> bool:
    return address in ("localhost", "::1") or address.startswith("127.")


# `ray start` for a node on loopback. Ray 2.60 never keeps a node there: it turns `--node-ip-address 127.0.0.1`, and a
# GCS address on 127.0.0.1, into the machine's reachable address (ray._private.services.resolve_ip_for_localhost),
# and its GCS, raylet and object manager then listen on every interface: a head started with --host 127.0.0.1 had
# Ray open to the network. This program keeps loopback addresses as they are; the node's Ray processes get Ray's
# local-only mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, see ray_env), in which they take this host's address to be
# 127.0.0.1, and the one check that mode makes (no worker node may join) is lifted for `ray start` alone. It imports
# Ray's modules only: the node may run as a user who cannot reach Farm's.
RAY_START_ON_LOOPBACK = """\
import sys
from ray._private import ray_constants, services
from ray._raylet import get_localhost_ip, is_localhost
services.resolve_ip_for_localhost = lambda host: get_localhost_ip() if is_localhost(host) else host
ray_constants.ENABLE_RAY_CLUSTER = True
from ray.scripts.scripts import main
sys.exit(main())
"""


def ray_start_command(args: Sequence[str], loopback: bool) -> list[str]:
    """`ray start ARGS`; for a node on loopback through RAY_START_ON_LOOPBACK."""
    if loopback:
        return [sys.executable, "-P", "-c", RAY_START_ON_LOOPBACK, "start", *args]
    return [ray_executable(), "start", *args]


# What a Ray node Farm starts keeps of its starter's environment (scrubbed_env): never the rest, where the head's and
# the agent's secrets are (FARM_TOKEN, a cloud's keys), since every task on that node could read it.
RAY_NODE_KEEPS = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "CUDA_VISIBLE_DEVICES",
                  "NVIDIA_VISIBLE_DEVICES")
RAY_NODE_KEEPS_PREFIXES = ("RAY_", "NCCL_", "MALLOC_")


def scrubbed_env() -> dict[str, str]:
    """This process's environment as a Ray node it starts may see it (RAY_NODE_KEEPS)."""
    return {name: value for name, value in os.environ.items()
            if name in RAY_NODE_KEEPS or name.startswith(RAY_NODE_KEEPS_PREFIXES)}


def ray_env(token_path: Path, loopback: bool = False, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for Ray processes and drivers (`base`, default this process's): token authentication, with
    Farm's own token file; for a node on loopback, Ray's local-only mode (RAY_START_ON_LOOPBACK says why)."""
    env = dict(os.environ if base is None else base)
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("FARM_JOIN_TOKEN", None)  # `farm agent start`'s: Ray's processes, job code among them, get none of it
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER: Ray 2.60 refuses worker nodes on macOS without it (the default on Linux).
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path), RAY_USAGE_STATS_ENABLED="0",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0" if loopback else "1")
    # NVLink multicast (NVLS) off for the NCCL groups of multi-GPU training: on shared multi-GPU hosts a program
    # using it can put the host's GPUs out of service for everyone. An environment that sets these keeps its values.
    for name, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                        ("NVSHMEM_DISABLE_NVLS", "1")):
        env.setdefault(name, value)
    # Two malloc arenas, not glibc's 8 a core: a Ray worker's threads (Ray's, gRPC's, a shard's reader) each drew
    # multi-MB buffers from an arena of their own, and the free memory each arena kept raised a worker's peak the
    # longer its shards ran (benchmark 1's largest worker from 100k to 1M rows: +13.7 %; with two, +6.7 % and +9.1 %).
    env.setdefault("MALLOC_ARENA_MAX", "2")
    return env


RAY_START_LOCK = "ray-start.lock"  # in the caller's own state folder: never a fixed name in a shared /tmp
RAY_START_WAIT_S = 600.0  # how long a start waits for another Ray node of this user to finish starting


def ray_start_lock(timeout: float = RAY_START_WAIT_S) -> int:
    """The lock that serialises this user's Ray starts (nodes starting side by side race for the same ports), held:
    a file descriptor to close. In the caller's private state folder (a fixed name in /tmp let another user plant a
    link, hold the lock forever, or make it root's), opened without following a link; AgentError, in one line, after
    `timeout` seconds of waiting."""
    folder = default_state_dir()
    private_folder(folder)
    path = folder / RAY_START_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise AgentError(f"cannot open the Ray start lock {path} (a link there is not followed): "
                         f"{exc.strerror}") from None

    def taken() -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    if not wait_for(taken, timeout, interval=0.2):
        os.close(fd)
        raise AgentError(f"another Ray node of this user has been starting for over {timeout:.0f} s (it holds "
                         f"{path}): stop it, or try again")
    return fd


def ray_temp_dir(node_id: str) -> Path:
    """A worker node's own Ray folder. By default a worker node takes the head's (/tmp/ray on its host), and Ray
    unpacks a job's code there afresh at each node's first task of the job, deleting what was there: agents sharing a
    host (the demo, the tests, an agent restarted beside others) pulled the folder from under each other's running
    workers (FileNotFoundError from os.getcwd()). Short, for Ray's socket paths (at most 107 bytes)."""
    return Path(os.environ.get("RAY_TMPDIR") or "/tmp") / f"farm-ray-{node_id}"


class RayProcess:
    """A Ray node (`ray start --block`) owned by this process: it lives in its own session and dies with `stop`.

    A head or agent killed outright (SIGKILL, the out-of-memory killer) cannot stop it, and its GCS would hold the
    port the next start needs: so `ray start` gets SIGTERM when the thread that started it dies (Linux), and its
    session's processes, with their start times, are recorded in `record`, from which the next start of the same
    head or agent clears them (see clear_left_behind)."""

    def __init__(self, args: Sequence[str], token_path: Path, log: Path, record: Path | None = None,
                 user: pwd.struct_passwd | None = None, folder: Path | None = None) -> None:
        """`user`: the account the node runs as (farm.ray_user; None: this process's). `folder`: the node's own
        folder, made afresh at each start, private to `user` (0700: Ray makes its --temp-dir, `folder`/r, and the
        folders it unpacks job code into 0777, so nobody else on the machine may reach them), its HOME, holding its
        own copy of the Ray token; removed when the node stops. A node with a folder is also a NodeGroup named
        after it: stopping it ends every process it started, however they left its session."""
        temp_dir = ["--temp-dir", str(folder / "r")] if folder is not None else []
        node_ip = next((args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--node-ip-address"), "")
        self.loopback = on_loopback(node_ip)
        self.args = ray_start_command(["--block", "--disable-usage-stats", *args, *temp_dir], self.loopback)
        self.token_path = token_path
        self.log = log
        self.record = record
        self.user = user
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None
        self.group: NodeGroup | None = None
        self.stopped = False  # set by stop(), possibly from another thread while start() waits

    def start(self, timeout: float = 120.0) -> None:
        """Start the node and wait until Ray says it runs (or the process dies).

        Ray nodes starting side by side on one host race for the same local ports, so starts are serialised by a
        lock of this user's (ray_start_lock); once up, a node keeps its ports.
        """
        if self.record is not None:
            clear_left_behind(self.record)
        token_path = self.token_path
        if self.folder is not None:  # after what a killed owner left is ended: its processes used the old one
            self.group = NodeGroup.make(self.folder.name, self.user.pw_uid if self.user else os.geteuid())
            self._use_folder(ray_user.private_folder(self.folder, self.user))
            token_path = ray_user.hand_token(self.token_path, self.folder, self.user)
        lock = ray_start_lock()
        with os.fdopen(lock, "rb"):  # closing it lets the next start go
            try:
                if self.stopped:  # stopped before it was spawned: its folder and group are made, and go
                    self.stop()
                    return
                offset = self.log.stat().st_size if self.log.exists() else 0
                env = ray_env(token_path, loopback=self.loopback, base=scrubbed_env())
                if self.folder is not None:
                    env["HOME"] = str(self.folder)
                    # Farm's own state in the workers (the kernel tuner's cache, Core ML conversions) where the node's
                    # user may write: the owner's state folder is closed to it (learned again after a restart).
                    env["FARM_STATE_DIR"] = str(self.folder / "state")
                if self.group is not None:
                    env.update(self.group.env())
                if self.user is not None:
                    env["USER"] = env["LOGNAME"] = self.user.pw_name
                self.proc = spawn_detached(self.args, self.log, env=env, user=self.user, group=self.group,
                                           die_with_parent=threading.current_thread() is threading.main_thread(),
                                           cwd=self.folder if self.user is not None else None)  # one it can enter
                wait_for(lambda: self.stopped or not self.running or self._started(offset), timeout, interval=0.2)
                if self.stopped:  # stop() ran while this node was being spawned: finish its work
                    self.stop()
                elif self.running and self.record is not None:
                    record_session(self.record, self.proc.pid, self.group, self.folder)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _use_folder(self, folder: Path) -> None:
        """The node's folder as made: another name than asked where someone else took that one (a planted link)."""
        assert self.folder is not None  # only a node given a folder moves it
        if folder != self.folder:
            self.args = [str(folder / "r") if arg == str(self.folder / "r") else arg for arg in self.args]
            self.folder = folder

    def _started(self, offset: int) -> bool:
        with open(self.log, "rb") as handle:
            handle.seek(offset)
            return b"Ray runtime started" in handle.read()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM `ray start`, which drains the node and stops its processes; then clear what is left of the
        session. (Signalling the whole session at once leaves `ray start` draining against a dead GCS.)"""
        self.stopped = True
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            stop_session(self.proc.pid, grace=5)
            self.proc.wait()
        if self.group is not None:  # what job code started outside the session (setsid, a double fork)
            self.group.end()
        if self.record is not None:
            self.record.unlink(missing_ok=True)
        if self.folder is not None:  # its sessions' logs, spilled objects, unpacked job code: GBs left per node
            shutil.rmtree(self.folder, ignore_errors=True)

    def failure(self) -> AgentError:
        tail = self.log.read_text(errors="replace").strip().splitlines()[-5:] if self.log.exists() else []
        return AgentError(f"Ray exited with {self.proc.returncode if self.proc else '?'}: " + " | ".join(tail))


def record_session(record: Path, leader: int, group: NodeGroup | None = None, folder: Path | None = None) -> None:
    """Write down the session of a Ray node this process started, and its processes with their start times (and
    its NodeGroup and folder): what clear_left_behind needs to find exactly these processes again, and never another
    farm's."""
    members = []
    for proc in psutil.process_iter(["pid", "create_time"]):
        if _session(proc) == leader:
            members.append([proc.info["pid"], proc.info["create_time"]])
    saved: dict[str, Any] = {"session": leader, "processes": members}
    if group is not None:
        saved["group"] = group.to_json()
    if folder is not None:
        saved["folder"] = str(folder)
    write_json(record, saved)


def clear_left_behind(record: Path) -> list[int]:
    """SIGKILL what is left of a Ray node recorded by record_session whose owner was killed outright; return the
    pids ended. A session is this farm's while one of its recorded processes still runs with its recorded start
    time: a session id cannot be taken by another process while any member of it lives, so all its members are the
    ones Ray started for us (a pid reused since by something else has another start time, and is left alone)."""
    saved = read_json(record)
    if saved is None:
        return []
    session = int(saved.get("session", 0))
    ours = False
    for pid, started in saved.get("processes", []):
        try:
            proc = psutil.Process(int(pid))
            ours = ours or (abs(proc.create_time() - float(started)) < 0.01 and _session(proc) == session)
        except psutil.Error:
            continue
    ended = []
    if ours and session > 1:
        members = [p for p in psutil.process_iter(["pid"]) if _session(p) == session and p.pid != os.getpid()]
        for proc in members:
            _signal(proc, signal.SIGKILL)
        psutil.wait_procs(members, timeout=10)
        ended = [p.pid for p in members]
    if isinstance(saved.get("group"), dict):  # what left the session: the node's cgroup, its user's marked processes
        ended += NodeGroup.from_json(saved["group"]).end()
    folder = Path(str(saved.get("folder") or ""))
    if folder.name.startswith("farm-ray-") and not folder.is_symlink():  # its logs, unpacked job code: GBs at times
        shutil.rmtree(folder, ignore_errors=True)
    record.unlink(missing_ok=True)
    return ended


def sessions_of(pids: list[int]) -> set[int]:
    """The sessions of these processes and of all their descendants. A detached head or agent runs in a session of
    its own, and so does each Ray node they start; Ray's workers stay in their node's session even when their parent
    dies. Other users of this machine (other farms, test runs) are in none of them: stopping what these sessions
    hold stops one farm and nothing else."""
    sessions = set()
    for pid in pids:
        if pid <= 1:  # "no pid" read from a missing record, or init: never a farm's process
            continue
        try:
            family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            continue
        for proc in family:
            try:
                sessions.add(os.getsid(proc.pid))
            except OSError:
                continue
    return sessions


def processes_in_sessions(sessions: set[int]) -> set[int]:
    """The live processes of these sessions, this one excepted (to find what a farm left behind)."""
    sessions = sessions - {0, 1}  # the kernel's and init's: never a farm's, whatever a caller passed
    found = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) in sessions and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found - {os.getpid()}
