"""README's first command: `farm demo` runs the digits job on a local head with two agents and cleans up."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.conftest import farm

pytestmark = pytest.mark.slow


def demo_processes(since: float) -> set[int]:
    """Processes a demo started since `since` that are still alive: every process of a demo's farm (head, agents,
    their Ray nodes and workers) carries the demo's state folder in RAY_AUTH_TOKEN_PATH. Other farms on this machine
    (other test runs, benchmarks) do not."""
    found = set()
    for proc in psutil.process_iter(["create_time"]):
        try:
            if proc.info["create_time"] >= since and "/farm-demo-" in proc.environ().get("RAY_AUTH_TOKEN_PATH", ""):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def test_demo_runs_the_digits_job_and_leaves_nothing_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FARM_RAY_USER", raising=False)  # README's command as a user runs it (conftest sets root)
    began = time.time() - 1
    result = farm("demo", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "demo passed: 2 of 2 agents ran shards" in out
    assert "demo-1" in out and "demo-2" in out and "ITEMS/S" in out
    assert "accuracy 9" in out  # ≥ 90%, printed as e.g. "accuracy 97.78%"
    assert "nothing left running" in out
    assert demo_processes(began) == set()
