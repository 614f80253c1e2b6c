"""A persistent worker's environment: the machine's own settings kept, the agent's secrets left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm_agent.daemon.workers import worker_env


def test_a_worker_keeps_the_machine_s_blas_settings_and_no_secret(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    # OpenBLAS's core type is set on processors where its own detection computes wrong results or crashes: a worker
    # that dropped it ran the job's numpy with the detection the machine's owner had turned off.
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1048576")
    monkeypatch.setenv("FARM_JOIN_TOKEN", "secret-join")
    monkeypatch.setenv("OWNER_SECRET", "s3cr3t")
    env = worker_env(tmp_path, None, "n-1", {"LD_PRELOAD": "/evil.so", "JOB_VAR": "1"})
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["OPENBLAS_L2_SIZE"] == "1048576"
    assert "FARM_JOIN_TOKEN" not in env and "OWNER_SECRET" not in env and "LD_PRELOAD" not in env
    assert env["JOB_VAR"] == "1" and env["HOME"] == str(tmp_path)
