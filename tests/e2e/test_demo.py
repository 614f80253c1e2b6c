"""README's first command: `farm demo` runs the digits job on a local head with two agents and cleans up."""

from __future__ import annotations

import pytest

from tests.conftest import farm, ray_processes

pytestmark = pytest.mark.slow


def test_demo_runs_the_digits_job_and_leaves_nothing_running() -> None:
    before = ray_processes()
    result = farm("demo", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "demo passed: 2 of 2 agents ran shards" in out
    assert "demo-1" in out and "demo-2" in out and "ITEMS/S" in out
    assert "accuracy 9" in out  # ≥ 90%, printed as e.g. "accuracy 97.78%"
    assert "nothing left running" in out
    assert ray_processes() <= before
