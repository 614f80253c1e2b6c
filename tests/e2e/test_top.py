"""`farm top --once`: one frame of the live terminal view, against a running head with two agents."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import FIXTURES, Cluster, farm

pytestmark = pytest.mark.slow


def test_top_shows_both_nodes_and_a_finished_job(cluster: Cluster, tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", tmp_path / "toyjob.py")
    np.savez(tmp_path / "numbers.npz", x=np.arange(40, dtype=np.float32).reshape(20, 2))
    spec = tmp_path / "top-toy.yaml"
    spec.write_text(yaml.safe_dump({"name": "top-toy", "model": "toyjob:doubler", "dataset": "numbers.npz",
                                    "shards": 2, "output": str(tmp_path / "out")}))
    submitted = cluster.farm("submit", str(spec), "--wait", "--workdir", str(tmp_path))
    assert submitted.returncode == 0, submitted.stderr

    result = farm("top", "--once", env={**cluster.env(), "COLUMNS": "160"}, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Farm") and "nodes (" in lines[0] and "power" in lines[0]
    for name in ("agent-a", "agent-b"):
        [row] = [line for line in lines if line.startswith(name)]
        assert "ready" in row and " W" in row
    [job] = [line for line in lines if "top-toy" in line]
    assert "succeeded" in job and "100%" in job and "2/2" in job


def test_top_without_a_head_says_so_in_one_line(tmp_path: Path) -> None:
    result = farm("top", "--once", env={"FARM_STATE_DIR": str(tmp_path)}, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: no head running from") and len(result.stderr.splitlines()) == 1
