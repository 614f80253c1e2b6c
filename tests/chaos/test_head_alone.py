"""A head killed alone (SIGKILL of its pid only, as the out-of-memory killer does) while an agent's Ray node on the
same host still names its GCS: `farm head start` succeeds at the first try, ends what the dead head's Ray left
running, and the farm runs a job again. (The chaos test kills the head with its whole sessions, so it never saw
the Ray head outlive it.)"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
import yaml

from farm.local import read_json, wait_for
from tests.chaos import chaosjob
from tests.chaos.test_chaos import Farm
from tests.conftest import farm

pytestmark = pytest.mark.slow


def recorded_ray(state: Path) -> list[psutil.Process]:
    """The Ray head's processes, as the head recorded them (farm.local.record_session)."""
    found = []
    for pid, started in (read_json(state / "ray-head.json") or {}).get("processes", []):
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - started) < 0.01:
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.timeout(300)
def test_a_head_killed_alone_starts_again_at_once(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(Path(chaosjob.__file__), work / "chaosjob.py")
    spec = work / "small.yaml"
    spec.write_text(yaml.safe_dump({"name": "small", "model": "chaosjob:sleeper", "dataset": "chaosjob:numbers",
                                    "shards": 2, "batch_size": 200, "backends": ["cpu"], "output": "out"}))
    cluster = Farm(tmp_path / "state")
    try:
        cluster.start_head()
        cluster.start_agent("chaos-a")
        assert wait_for(lambda: cluster.starting["chaos-a"].poll() is not None, 180, 0.5)
        assert cluster.starting["chaos-a"].returncode == 0, cluster.starting["chaos-a"].stderr
        cluster.reap_starts()
        dead_ray = recorded_ray(cluster.state)
        assert dead_ray, "the head recorded no Ray processes"
        head = cluster.head_pid()
        assert head
        agent = cluster.agent_pid("chaos-a")
        assert agent

        os.kill(head, signal.SIGKILL)
        assert wait_for(lambda: cluster.head_pid() is None, 10)
        began = time.monotonic()
        assert cluster.start_head() == 1  # no retries: refused, it fails the test
        restart_s = time.monotonic() - began
        assert not [p.pid for p in dead_ray if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

        # The agent, whose Ray node belonged to the dead cluster, comes back by itself and runs work.
        submitted = farm("submit", str(spec), "--workdir", str(work), "--wait", "--json",
                         env={"FARM_STATE_DIR": str(cluster.state)}, timeout=200)
        assert submitted.returncode == 0, submitted.stderr + submitted.stdout
        # The same agent process came back (nothing here restarts agents): it tried the head again after waits
        # that grew and were drawn at random below their bounds (agents/farm_agent/daemon/backoff.py), not every 2 s.
        assert cluster.agent_pid("chaos-a") == agent
        log = (cluster.state / "agents" / "chaos-a" / "agent.log").read_text()
        waits = [float(w) for w in re.findall(r"heartbeat stream lost \(\w+\); retrying in ([0-9.]+) s", log)]
        assert len(waits) >= 2 and len(set(waits)) > 1 and all(0.0 <= w <= 30.0 for w in waits), waits  # not 2, 2, 2
        print(f"head restarted in {restart_s:.1f} s; the agent waited {waits} s between its tries")
    finally:
        leftover = cluster.stop()
    assert not leftover, f"processes left behind: {leftover}"
