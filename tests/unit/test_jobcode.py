from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from farm.client.preflight import prepare, zip_code
from farm.core.errors import SpecError
from farm_agent.work.jobcode import load_dataset, load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", tmp_path / "toyjob.py")
    return tmp_path


def test_datasets_load_from_callables_and_files(work: Path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.arange(6)
    np.save(work / "x.npy", x)
    np.savez(work / "xy.npz", inputs=x, labels=y)
    torch.save((torch.from_numpy(x), torch.from_numpy(y)), work / "xy.pt")
    inputs, labels = load_dataset("x.npy", work)
    assert labels is None and np.array_equal(inputs, x)
    for name in ("xy.npz", "xy.pt"):
        inputs, labels = load_dataset(name, work)
        assert np.array_equal(inputs, x) and labels is not None and np.array_equal(labels, y)
    inputs, labels = load_dataset("toyjob:numbers", work)
    assert inputs.shape == (32, 2) and labels is None


def test_dataset_problems_are_spec_errors(work: Path) -> None:
    np.savez(work / "bad.npz", something=np.zeros(3))
    np.savez(work / "mismatch.npz", x=np.zeros((4, 2)), y=np.zeros(3))
    with pytest.raises(SpecError, match="needs an 'inputs' or 'x' array"):
        load_dataset("bad.npz", work)
    with pytest.raises(SpecError, match="4 inputs but 3 labels"):
        load_dataset("mismatch.npz", work)
    with pytest.raises(SpecError, match="raised OSError: the data server is down"):
        load_dataset("toyjob:failing_dataset", work)


def test_weights_that_do_not_fit_the_model(work: Path) -> None:
    torch.save({"unexpected": torch.zeros(1)}, work / "w.pt")
    with pytest.raises(SpecError, match="weights 'w.pt' do not fit the model"):
        load_model("toyjob:doubler", "w.pt", work)


def test_the_code_zip_leaves_out_environments_caches_and_the_output(work: Path) -> None:
    for folder in (".git", ".venv", "venv", "__pycache__", "pkg.egg-info", "out/job", "src"):
        (work / folder).mkdir(parents=True)
        (work / folder / "file.txt").write_text("x")
    names = set(zipfile.ZipFile(io.BytesIO(zip_code(work, skip=work / "out"))).namelist())
    assert names == {"toyjob.py", "src/file.txt"}


def test_prepare_counts_items_and_resolves_the_output(work: Path) -> None:
    (work / "job.yaml").write_text("name: toy\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshards: 4\n")
    prepared = prepare(work / "job.yaml", work)
    assert prepared.items == 32 and prepared.output == work / "out" / "toy"
    assert "toyjob.py" in zipfile.ZipFile(io.BytesIO(prepared.code_zip)).namelist()


def test_prepare_measures_a_models_size_once_per_version_of_its_code(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    work, builds = tmp_path / "job", tmp_path / "builds.txt"  # the build counter lies outside the job's code
    work.mkdir()
    (work / "sizedjob.py").write_text(
        "import torch\n\n"
        "def build():\n"
        f"    with open({str(builds)!r}, 'a') as counter:\n"
        "        counter.write('x')\n"
        "    return torch.nn.Linear(4, 2)\n\n"
        "def data():\n"
        "    return torch.zeros(8, 4)\n"
    )
    (work / "job.yaml").write_text("name: sized\nmodel: sizedjob:build\ndataset: sizedjob:data\nshards: 2\n")
    first, second = prepare(work / "job.yaml", work), prepare(work / "job.yaml", work)
    assert first.model_bytes == second.model_bytes == (4 * 2 + 2) * 4
    assert builds.read_text() == "x"  # the second submission of the same code did not build the model
    (work / "notes.txt").write_text("any change to the job's code")
    assert prepare(work / "job.yaml", work).model_bytes == (4 * 2 + 2) * 4
    assert builds.read_text() == "xx"  # measured (and so checked) again


def test_the_code_zip_leaves_out_what_git_ignores(work: Path) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (work / ".gitignore").write_text("results/\n*.log\n")
    for name in ("results/shard-00000.npy", "run.log", "src/keep.py"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("x")
    names = set(zipfile.ZipFile(io.BytesIO(zip_code(work))).namelist())
    assert names == {"toyjob.py", "src/keep.py"}  # another job's outputs and logs stay home


def test_the_code_zip_leaves_out_secrets_and_hidden_folders(work: Path) -> None:
    """Issue 18 (15): a submit from a folder holding credentials shipped them to every node."""
    for name in (".env", ".netrc", ".aws/credentials", ".git/config", "src/.secret", "src/ok.py"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("x")
    names = set(zipfile.ZipFile(io.BytesIO(zip_code(work))).namelist())
    assert names == {"toyjob.py", "src/ok.py"}
