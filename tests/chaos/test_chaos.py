"""Chaos: a 200-shard job over a Parquet dataset on the head's machine (its nodes read it through the head's
DataService: `shared: false`) runs while agents are SIGKILLed (with their Ray nodes) and restarted at random, and the
head (with its Ray head) is SIGKILLed and restarted once from the same state folder. The job must succeed with every
shard's output written exactly once: one complete file per shard, no temporary file left, one result per shard in the
store, and a manifest of all 200.

The schedule is drawn from a seed, which is in the test id. `FARM_CHAOS_RUNS=N` runs it with N seeds (from
`FARM_CHAOS_SEED`, default 1); `python -m tests.chaos.runs N` counts the passes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from farm.client import Client, find_head
from farm.core.errors import FarmError
from farm.local import (
    processes_in_sessions,
    ray_temp_dir,
    read_json,
    recorded_alive,
    sessions_of,
    terminate,
    wait_for,
)
from farm.proto.v1 import job_pb2
from tests.chaos import chaosjob
from tests.conftest import ROOT, farm
from tests.ports import head_ports

pytestmark = pytest.mark.slow

RUNS = int(os.environ.get("FARM_CHAOS_RUNS", "1"))
FIRST_SEED = int(os.environ.get("FARM_CHAOS_SEED", "1"))
SEEDS = list(range(FIRST_SEED, FIRST_SEED + RUNS))
AGENTS = ("chaos-a", "chaos-b", "chaos-c")
SHARDS = 200
AGENT_KILLS = 3
CHAOS_WINDOW_S = 300.0  # the job must end within this once submitted, or the test fails


@dataclass
class Farm:
    """A head and agents on 127.0.0.1 in one state folder, and every process session they ever ran in (a killed
    process's Ray node may outlive it), so that stop() ends all of this farm and nothing else."""

    state: Path
    ports: list[str] = field(default_factory=head_ports)  # `--port P --ray-port R ...`: the same on every restart
    join: str = ""
    ca_hash: str = ""
    sessions: set[int] = field(default_factory=set)
    starting: dict[str, subprocess.Popen[str]] = field(default_factory=dict)  # `farm agent start --detach` under way

    @property
    def port(self) -> int:
        return int(self.ports[self.ports.index("--port") + 1])

    def start_head(self, within_s: float = 0.0) -> int:
        """Start the head; how many tries it took. With `within_s`, failed starts are tried again for that long, as
        a service manager does: after a kill, `ray start --head` refuses while raylets of the dead cluster on this
        host (the agents' Ray nodes, still trying to reach it) name its address."""
        deadline = time.monotonic() + within_s
        tries = 0
        while True:
            tries += 1
            started = farm("head", "start", "--host", "127.0.0.1", *self.ports, "--state-dir", str(self.state),
                           "--detach", timeout=180)
            if started.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert started.returncode == 0, started.stderr
        self.track()
        return tries

    def head_pid(self) -> int | None:
        info = read_json(self.state / "head.json")
        return int(info["pid"]) if info and recorded_alive(info) else None

    def start_agent(self, name: str) -> None:
        head = find_head(state_dir=self.state) if self.head_pid() else None
        self.join = head.join_token if head else self.join  # the tokens and the CA outlive a head's restart
        self.ca_hash = head.ca_hash if head else self.ca_hash
        self.starting[name] = subprocess.Popen(
            [sys.executable, "-m", "farm.cli.main", "agent", "start", f"--head=127.0.0.1:{self.port}",
             f"--token={self.join}", f"--ca-hash={self.ca_hash}", "--name", name, "--cpus", "1", "--state-dir",
             str(self.state), "--detach",
             "--max-foreign-cpu", "100"],  # agents sharing one host are not each other's owner
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )

    def agent_status(self, name: str) -> dict[str, object]:
        return read_json(self.state / "agents" / name / "agent.json") or {}

    def agent_pid(self, name: str) -> int | None:
        status = self.agent_status(name)
        return int(str(status["pid"])) if recorded_alive(status) else None

    def agent_ready(self, name: str) -> bool:
        return name not in self.starting and self.agent_pid(name) is not None and \
            self.agent_status(name).get("state") == "ready"

    def reap_starts(self) -> None:
        for name, proc in list(self.starting.items()):
            if proc.poll() is not None:  # failed starts (the head was down) are started again by the caller
                del self.starting[name]
        self.track()

    def track(self) -> None:
        pids = [pid for pid in (self.head_pid(), *(self.agent_pid(n) for n in AGENTS)) if pid]
        pids += [proc.pid for proc in self.starting.values()]  # the daemon it spawned, before its agent.json
        self.sessions |= sessions_of(pids) - {os.getsid(0)}

    def kill(self, pid: int) -> None:
        """SIGKILL a process and everything in its sessions and its children's (its Ray node, Ray's workers) at
        once: a machine that vanishes."""
        self.track()
        sessions = sessions_of([pid]) - {os.getsid(0)}
        doomed = []
        for member in processes_in_sessions(sessions) | {pid}:
            try:
                doomed.append(psutil.Process(member))
                os.kill(member, signal.SIGKILL)
            except (OSError, psutil.Error):
                continue
        psutil.wait_procs(doomed, timeout=10)

    def stop(self) -> set[int]:
        """End every process of this farm; what was still alive after a clean stop."""
        self.track()
        for proc in self.starting.values():  # with the daemon it spawned, which has no agent.json yet
            self.kill(proc.pid)
            proc.wait()
        agents = [pid for pid in (self.agent_pid(n) for n in AGENTS) if pid]
        terminate(*agents, grace=30)
        head = self.head_pid()
        if head:
            terminate(head, grace=30)
        wait_for(lambda: not processes_in_sessions(self.sessions), 20, 0.5)
        leftover = processes_in_sessions(self.sessions)
        terminate(*leftover, grace=5)
        for name in AGENTS:  # the agents' own Ray folders (farm.local.ray_temp_dir), outside the state folder
            node_id = (read_json(self.state / "agents" / name / "node.json") or {}).get("node_id")
            if node_id:
                shutil.rmtree(ray_temp_dir(str(node_id)), ignore_errors=True)
        return leftover


@dataclass
class Chaos:
    """What the seed decided, by progress (shards succeeded) so that every kill lands while the job runs."""

    head_kill_at: int
    agent_kills: list[tuple[int, str, float]]  # (at shards done, which agent, seconds down)

    @classmethod
    def draw(cls, seed: int) -> Chaos:
        rng = random.Random(seed)
        # Early enough that each lands while shards remain, even when it waits for the agents' restarts.
        kills = sorted((rng.randint(5, SHARDS // 2), rng.choice(AGENTS), rng.uniform(0.0, 4.0))
                       for _ in range(AGENT_KILLS))
        return cls(head_kill_at=rng.randint(SHARDS // 5, SHARDS // 2), agent_kills=kills)


def rng_choice(names: list[str], seed: int) -> str:
    return random.Random(seed).choice(names)


def job_progress(state: Path, job_id: str) -> job_pb2.Job | None:
    """The job's record, or None while no head answers."""
    try:
        with Client(find_head(state_dir=state), timeout=5) as client:
            return client.job(job_id)
    except FarmError:
        return None


@pytest.mark.timeout(540)  # a hang fails the test: the chaos window, the farm's start and stop
@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed-{s}" for s in SEEDS])
def test_a_job_survives_agents_and_the_head_killed_at_random(seed: int, tmp_path: Path) -> None:
    chaos = Chaos.draw(seed)
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(Path(chaosjob.__file__), work / "chaosjob.py")
    chaosjob.write_parquet(tmp_path / "data")
    spec = work / "chaos.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "chaos", "model": "chaosjob:sleeper", "shards": SHARDS, "batch_size": 2, "backends": ["cpu"],
        "dataset": {"location": str(tmp_path / "data"), "format": "parquet", "inputs": "x", "shared": False},
        "output": "out"}))
    cluster = Farm(tmp_path / "state")
    events: list[str] = []
    try:
        cluster.start_head()
        for name in AGENTS:
            cluster.start_agent(name)
        assert wait_for(lambda: not any(p.poll() is None for p in cluster.starting.values()), 240, 0.5)
        assert all(p.returncode == 0 for p in cluster.starting.values()), [
            p.stderr.read() for p in cluster.starting.values() if p.stderr]
        cluster.reap_starts()
        submitted = farm("submit", str(spec), "--workdir", str(work), env={"FARM_STATE_DIR": str(cluster.state)})
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()

        down_until = dict.fromkeys(AGENTS, 0.0)
        pending = list(chaos.agent_kills)
        head_killed = False
        final = None
        deadline = time.monotonic() + CHAOS_WINDOW_S
        while time.monotonic() < deadline:
            cluster.reap_starts()
            job = job_progress(cluster.state, job_id)
            if job is not None and job.state in ("succeeded", "failed", "cancelled"):
                final = job
                break
            done = 0 if job is None else sum(s.state == "succeeded" for s in job.shards)
            now = time.monotonic()
            if not head_killed and done >= chaos.head_kill_at and (pid := cluster.head_pid()):
                cluster.kill(pid)
                # Agents starting go too: one starting holds the host's Ray start lock (farm.local.RayProcess) while
                # its node waits for the dead head's Ray, and the new head's own Ray start would wait behind it.
                for name, proc in list(cluster.starting.items()):
                    cluster.kill(proc.pid)
                    proc.wait()
                    del cluster.starting[name]
                events.append(f"head killed at {done} shards")
                head_killed = True
                tries = cluster.start_head(within_s=120)
                events.append(f"head restarted ({tries} tries)")
                continue
            # Two agents ready at least: with every node down the job only waits, and on a busy host an agent's
            # restart (its Ray node's start) takes tens of seconds.
            ready = [n for n in AGENTS if cluster.agent_ready(n)]
            if pending and done >= pending[0][0] and len(ready) >= 2:
                _, name, down_s = pending.pop(0)
                name = name if name in ready else rng_choice(ready, seed + done)
                cluster.kill(int(str(cluster.agent_pid(name))))
                down_until[name] = now + down_s
                events.append(f"{name} killed at {done} shards, down {down_s:.1f} s")
            for name in AGENTS:  # a supervisor (systemd's Restart=on-failure): whatever is down comes back
                if now >= down_until[name] and name not in cluster.starting and cluster.agent_pid(name) is None:
                    cluster.start_agent(name)
                    events.append(f"{name} (re)started at {done} shards")
            time.sleep(0.5)
        leftover = cluster.stop()
    except BaseException:
        cluster.stop()
        raise
    report = "; ".join(events)
    assert final is not None, f"the job did not end within {CHAOS_WINDOW_S:.0f} s: {report}"
    assert final.state == "succeeded", f"{final.error} ({report})"
    assert head_killed and not pending, f"not every kill landed while the job ran: {report}"
    assert not leftover, f"processes left behind: {leftover}"

    # The store: one row and one recorded result per shard.
    db = sqlite3.connect(cluster.state / "state.db")
    rows = db.execute("SELECT idx, state, items FROM shards WHERE job_id=? ORDER BY idx", (job_id,)).fetchall()
    assert rows == [(i, "succeeded", 2) for i in range(SHARDS)]
    done_lines = Counter(
        int(message.split()[1]) for (message,) in db.execute(
            "SELECT message FROM job_logs WHERE job_id=? AND message LIKE 'shard % done:%'", (job_id,))
    )
    assert done_lines == dict.fromkeys(range(SHARDS), 1), report
    # Every restart of an agent came back as the same node: one record per machine, under the id it keeps.
    nodes = sorted(db.execute("SELECT name, id FROM nodes").fetchall())
    assert nodes == [(n, (read_json(cluster.state / "agents" / n / "node.json") or {}).get("node_id")) for n in AGENTS]

    # The output: exactly one complete Parquet file per shard, holding its rows once, and the manifest; nothing
    # else (no temporary files).
    output = Path(final.output)
    files = sorted(p.name for p in output.iterdir())
    assert files == sorted([*(f"shard-{i:05d}.parquet" for i in range(SHARDS)), "_manifest.json"]), report
    inputs = chaosjob.numbers()
    for i in range(SHARDS):
        table = pq.read_table(output / f"shard-{i:05d}.parquet")
        assert table.column("row_id").to_pylist() == [2 * i, 2 * i + 1], report
        np.testing.assert_array_equal(np.stack(table.column("output").to_numpy(zero_copy_only=False)),
                                      inputs[2 * i : 2 * i + 2] * 2)
    manifest = json.loads((output / "_manifest.json").read_text())
    assert [s["index"] for s in manifest["shards"]] == list(range(SHARDS))
    assert manifest["items"] == chaosjob.ITEMS and {s["file"] for s in manifest["shards"]} <= set(files)
    print(f"seed {seed}: {report}")
