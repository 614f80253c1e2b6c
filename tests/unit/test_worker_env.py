"""A persistent worker's environment: the machine's own settings kept, the agent's secrets left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm_agent.daemon.workers import exit_reason, worker_env


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


def test_a_worker_s_openmp_threads_wait_without_spinning_unless_the_machine_or_the_job_says_otherwise(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert worker_env(tmp_path, None, "n-1", {})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert worker_env(tmp_path, None, "n-1", {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert worker_env(tmp_path, None, "n-1", {})["OMP_WAIT_POLICY"] == "ACTIVE"


def test_a_crashed_worker_is_described_by_its_signal_and_its_last_words(tmp_path: Path) -> None:
    log = tmp_path / "w1.log"
    log.write_text("loading model\n" + "x" * 9000 + "\nlibfoo: illegal state\nFatal Python error: Segmentation fault\n\n"
                   "Current thread 0x00007f (most recent call first):\n  File \"/job/model.py\", line 9 in forward\n"
                   "  File \"/farm/host.py\", line 80 in main\n\nExtension modules: numpy (total: 1)\n")
    reason = exit_reason(-11, log)
    assert reason == ("its worker was killed by SIGSEGV; its last output: libfoo: illegal state | "
                      "Fatal Python error: Segmentation fault | File \"/job/model.py\", line 9 in forward")
    assert "\n" not in reason
    assert exit_reason(3, tmp_path / "missing.log") == "its worker exited with 3"
    log.write_text("a\nb\nc\nd\ne\n")
    assert exit_reason(1, log) == "its worker exited with 1; its last output: b | c | d | e"
