"""Issue 31 item 12: a model's exception names where in its shard it happened (the shard's rows and the batch's
first row id), and its traceback starts at the user's frame; the one with Farm's own frames is kept apart, for
`farm logs --verbose`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from farm.core.models import BackendName, BackendOffer, Hardware, NodeState
from farm.core.tasks import VERBOSE, ShardTask
from farm.head import arrivals, joblog
from farm.head.store import Store
from farm_agent.work.upload import failure_of
from tests.uploads import run_here

JOB = '''
import numpy as np
import torch


class Picky(torch.nn.Module):
    def forward(self, x):
        return check(x)


def check(x):
    if (x[:, 0] >= 40).any():
        raise ValueError(f"a value of {float(x[:, 0].max())} is too large")
    return x * 2


def build():
    return Picky()


def rows():
    return np.arange(64, dtype=np.float32).reshape(32, 2)  # row r holds 2r and 2r+1: row 20 is the first too large
'''


@pytest.fixture()
def job_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "picky.py").write_text(JOB)
    monkeypatch.chdir(folder)  # the job's code is the worker's working directory, as on a node
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "picky", raising=False)  # a previous test's, from its own folder
    return folder


def failure(start: int, stop: int) -> tuple[str, str, str]:
    task = ShardTask(job_id="j", index=3, start=start, stop=stop, model="picky:build", weights=None,
                     dataset="picky:rows", batch_size=4, backend="cpu", device="cpu", threads=1)
    with pytest.raises(ValueError) as caught:
        run_here(task)
    sent = failure_of(caught.value)
    return sent.message, sent.traceback, sent.farm_traceback


def test_a_model_exception_names_the_shards_rows_and_the_batchs_first_row(job_folder: Path) -> None:
    message, _, _ = failure(8, 32)
    assert message == "rows 8-31, the batch from row 20: ValueError: a value of 46.0 is too large"
    message, _, _ = failure(20, 28)  # on its first batch
    assert message == "rows 20-27, the batch from row 20: ValueError: a value of 46.0 is too large"


def test_the_traceback_starts_at_the_users_frame_and_farms_frames_are_kept_apart(job_folder: Path) -> None:
    _, trace, full = failure(8, 32)
    files = [line.strip() for line in trace.splitlines() if line.strip().startswith("File ")]
    assert files[0].startswith(f'File "{job_folder / "picky.py"}"') and "in forward" in files[0]
    assert not any("farm_agent" in f or "/farm/" in f for f in files), files
    assert trace.startswith("Traceback (most recent call last):") and trace.rstrip().endswith("is too large")
    assert "farm_agent/work/kinds/inference.py" in full and "picky.py" in full


def test_the_head_keeps_the_full_traceback_for_verbose_only(tmp_path: Path, job_folder: Path) -> None:
    store = Store(tmp_path / "state.db")
    hw = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)
    store.upsert_node("n-1", "box", hw, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.1", "h")
    store.set_node_state("n-1", NodeState.READY)
    store.add_job("j-1", "toy", "inference", "name: toy\nmodel: picky:build\ndataset: picky:rows\n", "/nowhere.zip",
                  str(tmp_path / "out"), 32, [(0, 32)])
    task = ShardTask(job_id="j-1", index=0, start=0, stop=32, model="picky:build", weights=None,
                     dataset="picky:rows", batch_size=4, backend="cpu", device="cpu", threads=1)
    with pytest.raises(ValueError) as caught:
        run_here(task)
    arrival = arrivals.failure_from_pb(failure_of(caught.value))
    assert arrival.failure is not None
    joblog.record_failure(store, "j-1", 0, arrival.log, arrival.traceback, arrival.failure.farm_trace)
    lines = {line["level"]: line["message"] for line in store.logs("j-1", 0)}
    assert "farm_agent" not in lines["error"] and "farm_agent/work/kinds/inference.py" in lines[VERBOSE]
