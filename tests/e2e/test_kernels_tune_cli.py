"""`farm kernels tune` on the CPU, as CI runs it: a tiny problem, the real evaluator and torch.compile; the winner
is cached, the policy saved, and the table and JSON carry the speedups, fast_p and trials."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import FIXTURES, farm

PROBLEM = FIXTURES / "kernels_tune" / "mlp_gelu.py"


def test_tune_a_problem_on_the_cpu(tmp_path: Path) -> None:
    env = {"FARM_STATE_DIR": str(tmp_path)}
    done = farm("kernels", "tune", str(PROBLEM), "--device", "cpu", "--budget-s", "60", "--runs", "3", "--json",
                env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    (report,) = data["reports"]
    trials = {t["candidate"]: t for t in report["trials"]}
    # Eager is the reference; compile-default is the baseline; nothing GPU-only is offered.
    assert {"eager", "compile-default"} <= set(trials) <= {"eager", "compile-default", "compile-max-autotune"}
    assert trials["eager"]["correct"] and trials["eager"]["median_ms"] > 0
    assert report["winner"] in trials and trials[report["winner"]]["correct"]
    assert report["speedup_vs_eager"] >= 1.0
    summary = data["summary"]
    assert summary["problems"] == 1 and summary["p"] == 0.05 and 0.0 <= summary["fast_p"] <= 1.0
    cached = list((tmp_path / "tuner" / "cache").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["winner"]["candidate"] == report["winner"]
    policy = json.loads((tmp_path / "tuner" / "policy.json").read_text())
    assert policy["runs"] == 1 and {"eager", "compile-default"} <= set(policy["arms"])

    table = farm("kernels", "tune", str(PROBLEM.parent), "--device", "cpu", "--budget-s", "1", "--runs", "3",
                 env=env, timeout=240)
    assert table.returncode == 0, table.stderr
    assert "mlp_gelu" in table.stdout and "fast_0.05" in table.stdout and "geomean" in table.stdout
    assert json.loads((tmp_path / "tuner" / "policy.json").read_text())["runs"] == 2


def test_a_missing_problem_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = farm("kernels", "tune", str(tmp_path / "nope.py"), "--device", "cpu", env={"FARM_STATE_DIR": str(tmp_path)})
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
