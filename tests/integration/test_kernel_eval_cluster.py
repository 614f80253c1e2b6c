"""Kernel-eval jobs end to end on a real head and two real CPU agents: the fixture set's crashing and hanging
candidates fail alone, the job succeeds with its results table; the Python API returns the same rows."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from farm.client import Client
from tests.conftest import FIXTURES, Cluster, farm

pytestmark = pytest.mark.slow

EVAL = FIXTURES / "kernels" / "eval"


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    """The fixture set in a working directory, with a spec whose limits keep the test short."""
    work = tmp_path / "work"
    shutil.copytree(EVAL, work)
    spec = yaml.safe_load((work / "spec.yaml").read_text())
    spec["kernel_eval"].update(timeout_s=10, runs=3)
    spec["output"] = str(tmp_path / "out")
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    return work


def test_crash_and_hang_fail_alone_and_the_job_succeeds_with_its_table(cluster: Cluster, work: Path) -> None:
    env = {**cluster.env(), "COLUMNS": "250"}
    result = farm("submit", str(work / "spec.yaml"), "--wait", "--workdir", str(work), env=env)
    assert result.returncode == 0, result.stderr + result.stdout
    # The summary, then the results table.
    assert "REWARD" in result.stdout and "killed by SIGABRT" in result.stdout and "timed out after 10 s" in result.stdout
    job_id = next(j["id"] for j in json.loads(cluster.farm("jobs", "--json").stdout) if j["name"] == "kernels-fixture")
    job = json.loads(cluster.farm("job", job_id, "--json").stdout)
    assert job["state"] == "succeeded" and job["kind"] == "kernel-eval" and job["items"] == 5
    assert len(job["shards"]) == 2  # one per problem: its baselines measured once for its candidates
    assert all(s["backend"] == "cpu" and s["device"] == "cpu" for s in job["shards"])

    shown = cluster.farm("kernels", "results", job["id"], "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {(r["problem"], r["candidate"]): r for r in json.loads(shown.stdout)["results"]}
    assert list(rows) == [("relu", "abort"), ("relu", "clamp"), ("relu", "hang"), ("relu", "wrong"), ("scale", "add")]
    abort, hang = rows[("relu", "abort")], rows[("relu", "hang")]
    assert not abort["correct"] and "worker process died (killed by SIGABRT)" in abort["error"]
    assert not hang["correct"] and "timed out after 10 s" in hang["error"]
    assert abort["reward"] == hang["reward"] == -1  # milestones: incorrect
    wrong = rows[("relu", "wrong")]
    assert wrong["compiled"] and not wrong["correct"] and wrong["error"].startswith("incorrect:") and wrong["reward"] == -1
    for key in (("relu", "clamp"), ("scale", "add")):
        good = rows[key]
        assert good["compiled"] and good["correct"] and good["error"] == "", good
        assert good["max_abs_err"] == 0.0 and good["median_ms"] > 0 and good["eager_ms"] > 0
        assert good["speedup_vs_eager"] == pytest.approx(good["eager_ms"] / good["median_ms"])
        assert good["reward"] in (1, 2, 3) and good["node"] in ("agent-a", "agent-b")

    output = Path(job["output"])
    with (output / "results.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert [(r["problem"], r["candidate"], r["correct"]) for r in table][:2] == [
        ("relu", "abort", "False"), ("relu", "clamp", "True")]
    manifest = json.loads((output / "_manifest.json").read_text())
    assert manifest["kind"] == "kernel-eval" and manifest["correct"] == 2

    assert cluster.farm("kernels", "results", "j-nosuchjob").returncode == 2


GOOD = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x + x\n"
WRONG = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 3.0\n"


def test_the_python_api_returns_typed_rows_with_speedup_rewards(cluster: Cluster) -> None:
    with Client(cluster.head) as client:
        results = client.evaluate_kernels([EVAL / "problems" / "scale.py"], {"scale": [GOOD, WRONG]},
                                          reward="speedup", backends=["cpu"], runs=3, timeout_s=10)
    assert [(r.problem, r.candidate, r.correct) for r in results] == [
        ("scale", "c0000", True), ("scale", "c0001", False)]
    good, wrong = results
    assert good.reward == pytest.approx(good.speedup_vs_eager) and good.reward > 0
    assert wrong.reward == 0.0 and wrong.error.startswith("incorrect:")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"problems": "nowhere"}, "kernel_eval.problems: folder 'nowhere' not found"),
        ({"reward": "vibes"}, "field 'kernel_eval.reward'"),
    ],
)
def test_a_bad_kernel_eval_spec_is_one_line_and_exit_2(cluster: Cluster, work: Path, change: dict[str, str],
                                                      message: str) -> None:
    spec = yaml.safe_load((work / "spec.yaml").read_text())
    spec["kernel_eval"].update(change)
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = cluster.farm("submit", str(work / "spec.yaml"), "--workdir", str(work))
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
