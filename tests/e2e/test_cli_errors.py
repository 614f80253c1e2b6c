"""Bad input gets one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, Cluster, farm

pytestmark = pytest.mark.slow


def assert_one_line_error(result: object, code: int, *fragments: str) -> None:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == code, (result.returncode, stderr)  # type: ignore[attr-defined]
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", tmp_path / "toyjob.py")
    return tmp_path


def spec(work: Path, text: str) -> str:
    path = work / "job.yaml"
    path.write_text(text)
    return str(path)


def test_no_head_running(tmp_path: Path) -> None:
    result = farm("nodes", env={"FARM_STATE_DIR": str(tmp_path)})
    assert_one_line_error(result, 2, "no head running from", "farm head start")


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("name: x\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshardz: 2\n", ["unknown field 'shardz'"]),
        ("name: [x\n", ["not valid YAML"]),
        ("name: x\nmodel: nosuchmodule:build\ndataset: toyjob:numbers\n",
         ["model 'nosuchmodule:build' does not import", "ModuleNotFoundError"]),
        ("name: x\nmodel: toyjob:missing\ndataset: toyjob:numbers\n", ["toyjob has no callable 'missing'"]),
        ("name: x\nmodel: toyjob:not_a_module\ndataset: toyjob:numbers\n", ["returned int, not a torch.nn.Module"]),
        ("name: x\nmodel: toyjob:doubler\ndataset: toyjob:failing_dataset\n",
         ["dataset 'toyjob:failing_dataset' raised OSError: the data server is down"]),
        ("name: x\nmodel: toyjob:doubler\ndataset: missing.npy\n", ["dataset file 'missing.npy' not found"]),
        ("name: x\nmodel: toyjob:doubler\nweights: nope.pt\ndataset: toyjob:numbers\n", ["weights 'nope.pt' not found"]),
    ],
)
def test_bad_specs_are_refused_before_submission(cluster: Cluster, work: Path, text: str, fragments: list[str]) -> None:
    result = cluster.farm("submit", spec(work, text), "--workdir", str(work))
    assert_one_line_error(result, 2, *fragments)


def test_a_missing_spec_file(cluster: Cluster, tmp_path: Path) -> None:
    assert_one_line_error(cluster.farm("submit", str(tmp_path / "nope.yaml")), 2, "nope.yaml: no such file")


def test_an_unknown_job(cluster: Cluster) -> None:
    assert_one_line_error(cluster.farm("job", "j-00000000"), 2, "no job 'j-00000000'")


def test_a_wrong_api_token(cluster: Cluster) -> None:
    result = farm("nodes", "--head", cluster.head.address,  # FARM_TOKEN: --token adds a warning line
                  env={"FARM_CA": str(cluster.state_dir / "tls" / "ca.pem"), "FARM_TOKEN": "wrong"})
    assert_one_line_error(result, 2, "invalid or missing API token")


def test_a_wrong_join_token(cluster: Cluster, tmp_path: Path) -> None:
    result = farm("agent", "start", "--head", cluster.head.address, "--name", "intruder",  # as the join line gives it
                  "--state-dir", str(tmp_path), "--ca-hash", cluster.head.ca_hash, env={"FARM_JOIN_TOKEN": "wrong"})
    assert_one_line_error(result, 2, "refused the join token")


def test_a_head_that_does_not_answer(tmp_path: Path) -> None:
    from farm.local import free_port

    result = farm("jobs", "--head", f"127.0.0.1:{free_port()}", env={"FARM_TOKEN": "t"})
    assert_one_line_error(result, 2, "does not answer")


def test_a_second_head_on_the_same_state_dir(cluster: Cluster) -> None:
    result = farm("head", "start", "--state-dir", str(cluster.state_dir), "--port", "1")
    assert_one_line_error(result, 2, "a head is already running")
