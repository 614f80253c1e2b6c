"""farm_agent.work.capture: what a shard printed and its traceback travel to the head with its result or its error."""

from __future__ import annotations

import pickle
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from farm.core.tasks import SHARD_LOG_ATTR, SHARD_TRACEBACK_ATTR
from farm_agent.work.capture import BoundedText, job_shard
from tests.conftest import FIXTURES


@dataclass(frozen=True)
class Result:
    value: int
    log: str = ""


@job_shard
def prints_and_returns(n: int) -> Result:
    print("loading the model")
    sys.stderr.write("a warning\n")
    print(f"done {n}")
    return Result(n)


def inner_step() -> None:
    raise RuntimeError("mat1 and mat2 must have the same dtype")


@job_shard
def prints_and_fails() -> Result:
    print("about to fail")
    inner_step()
    return Result(0)


def test_a_result_carries_what_the_shard_printed_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    result = prints_and_returns(3)
    assert result.value == 3
    assert result.log == "loading the model\na warning\ndone 3\n"
    seen = capsys.readouterr()  # still written through to the worker's own streams (Ray's worker log)
    assert "done 3" in seen.out and "a warning" in seen.err
    assert sys.stdout is not None and not type(sys.stdout).__name__.startswith("_Tee")  # streams put back


def test_an_error_carries_the_output_and_the_full_traceback_through_pickling() -> None:
    with pytest.raises(RuntimeError) as caught:
        prints_and_fails()
    # Ray pickles the exception to send it to the head: the attributes go with it.
    error = pickle.loads(pickle.dumps(caught.value))
    assert getattr(error, SHARD_LOG_ATTR) == "about to fail\n"
    trace = getattr(error, SHARD_TRACEBACK_ATTR)
    assert trace.startswith("Traceback (most recent call last):")
    assert "in prints_and_fails" in trace and "in inner_step" in trace
    assert trace.rstrip().endswith("RuntimeError: mat1 and mat2 must have the same dtype")


def test_output_is_bounded_keeping_its_start_and_end() -> None:
    text = BoundedText(keep=10)
    for chunk in ("0123456789", "x" * 1000, "the end"):
        text.write(chunk)
    kept = text.getvalue()
    assert kept.startswith("0123456789\n[... 997 characters dropped ...]\n") and kept.endswith("xxxthe end")


def test_a_result_without_a_log_field_passes_unchanged() -> None:
    assert job_shard(lambda: 42)() == 42


def test_a_shard_printing_a_great_deal_stays_bounded() -> None:
    text = BoundedText(keep=1000)
    for index in range(200_000):
        text.write(f"line {index}\n")
    assert text.tail_len < 2 * 1000  # what is held, however much was written
    kept = text.getvalue()
    assert kept.startswith("line 0\n") and kept.endswith("line 199999\n") and len(kept) < 2100


TRAIN_SPEC = """name: noisy
kind: training
model: noisytrain:build
dataset: noisytrain:train_set
batch_size: 32
backends: [cpu]
training: {optimizer: sgd, lr: 0.05, steps: 20, loss: %s}
"""


@pytest.fixture()
def train_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("toytrain.py", "noisytrain.py"):
        shutil.copy(FIXTURES / "jobs" / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)  # a worker's job code is its working directory, as Ray's working_dir makes it
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_training_worker_hands_what_it_printed_over_with_each_stretch(train_dir: Path) -> None:
    from farm_agent.work.kinds.training import TrainWorker

    worker = TrainWorker(TRAIN_SPEC % "cross_entropy", "j", 0, 1, "g", "cpu", 1, None)
    worker.join()
    worker.probe(16)
    first = worker.train(0, 10, [32])["log"]
    assert first.startswith("building the noisy model in pid")  # its construction, before the first stretch
    assert "warning: this model is noisy" in first and "forward call 10 on 32 rows" in first
    second = worker.train(10, 20, [32])["log"]
    assert "building" not in second and "forward call 20 on 32 rows" in second  # only what came since


def test_a_training_worker_that_fails_carries_its_output_and_traceback(train_dir: Path) -> None:
    from farm_agent.work.kinds.training import TrainWorker

    worker = TrainWorker(TRAIN_SPEC % "noisytrain:failing_loss", "j", 0, 1, "g", "cpu", 1, None)
    with pytest.raises(ValueError) as caught:
        worker.train(0, 10, [32])
    error = pickle.loads(pickle.dumps(caught.value))
    assert "building the noisy model" in getattr(error, SHARD_LOG_ATTR)
    assert "computing a loss that cannot be computed" in getattr(error, SHARD_LOG_ATTR)
    trace = getattr(error, SHARD_TRACEBACK_ATTR)
    assert "in failing_loss" in trace and trace.rstrip().endswith("the loss does not take these targets")


def test_a_shard_gives_the_memory_it_freed_back_when_it_ends_or_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker outlives its shards on a lender's machine: glibc's arenas are trimmed after each, a failed one too."""
    from farm_agent.work import memory

    trims = []
    monkeypatch.setattr(memory, "give_back", lambda: trims.append(1))
    assert prints_and_returns(3).value == 3 and trims == [1]
    with pytest.raises(RuntimeError):
        prints_and_fails()
    assert trims == [1, 1]
    monkeypatch.undo()
    memory.give_back()  # the real one: malloc_trim where glibc has it, a no-op elsewhere
