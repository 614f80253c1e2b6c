"""A local farm for benchmarks: a head and agents on 127.0.0.1, stopped with everything they started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Self

import psutil
from rich.console import Console

from farm.client import Client, HeadInfo, find_head
from farm.local import free_port, processes_in_sessions, read_json, recorded_alive, sessions_of, terminate, wait_for

ROOT = Path(__file__).resolve().parents[1]
# As the tests do (tests/conftest.py): a benchmark's farm runs its Ray nodes as the invoking user, whose Python may sit
# where no other account can read it (/root here); `farm head start` alone would run them as farm-ray.
os.environ.setdefault("FARM_RAY_USER", "root")
JOBS = {"digits": "examples/digits/infer.yaml", "embeddings": "examples/embeddings/embed.yaml"}


def _farm_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)


class LocalFarm:
    """A real head and `agents` real agents (each `--detach`, `--cpus cpus`) in a temporary state directory."""

    def __init__(self, agents: int, cpus: int, insecure: bool = False) -> None:
        self.agents, self.cpus = agents, cpus
        self.insecure = insecure  # a head without TLS (the control-plane benchmark measures gRPC itself)
        self.state = Path(tempfile.mkdtemp(prefix="farm-bench-"))
        self.head: HeadInfo | None = None
        self.leftover: set[int] = set()

    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _start(self) -> None:
        done = _farm_cli("head", "start", "--host", "127.0.0.1", "--port", str(free_port()), "--ray-port",
                         str(free_port()), "--state-dir", str(self.state), "--detach",
                         *(["--insecure"] if self.insecure else []))
        if done.returncode != 0:
            raise RuntimeError(f"farm head start: {done.stderr.strip()}")
        self.head = find_head(state_dir=self.state)
        procs = [
            subprocess.Popen([sys.executable, "-m", "farm.cli.main", "agent", "start", "--head", self.head.address,
                              "--token", self.head.join_token, "--name", f"bench-{i}", "--cpus", str(self.cpus),
                              *(["--insecure"] if self.insecure else ["--ca-hash", self.head.ca_hash]),
                              "--state-dir", str(self.state), "--detach",
                              "--max-foreign-cpu", "100"],  # agents sharing one host are not each other's owner
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
            for i in range(1, self.agents + 1)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=240)
            if proc.returncode != 0:
                raise RuntimeError(f"farm agent start: {err.strip()}")
        with Client(self.head) as client:  # every agent's Ray node seen by the head
            if not wait_for(lambda: sum(n.state == "ready" for n in client.nodes()) >= self.agents, 120, 0.5):
                raise RuntimeError("agents did not become ready in 120 s")

    def agent_status(self) -> list[dict[str, Any]]:
        return [read_json(p) or {} for p in sorted((self.state / "agents").glob("*/agent.json"))]

    def head_json(self) -> dict[str, Any]:
        return read_json(self.state / "head.json") or {}

    def stop(self) -> None:
        """Agents first (they deregister from a head that still listens), then the head, then any straggler of
        theirs (only processes in the sessions they and their Ray nodes run in)."""
        agents = [int(s["pid"]) for s in self.agent_status() if recorded_alive(s)]
        info = self.head_json()
        head = [int(info["pid"])] if recorded_alive(info) else []
        sessions = sessions_of(agents + head) - {os.getsid(0)}
        terminate(*agents)
        if head:
            terminate(*head)
        wait_for(lambda: not processes_in_sessions(sessions), 20, 0.5)
        self.leftover = processes_in_sessions(sessions)
        if self.leftover:
            terminate(*self.leftover, grace=5)
        shutil.rmtree(self.state, ignore_errors=True)


def report_cleanup(console: Console, farms: list[LocalFarm]) -> None:
    left = set().union(*(f.leftover for f in farms)) if farms else set()
    still = {pid for pid in left if psutil.pid_exists(pid)}
    if left:
        console.print(f"[yellow]cleanup: {len(left)} process(es) outlived the stop and were terminated; "
                      f"{len(still)} still alive[/]")
    else:
        console.print("cleanup: no head, agent or Ray process left running")
