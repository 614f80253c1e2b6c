from __future__ import annotations

import numpy as np
import torch

from farm.core.tasks import ShardTask, Tuning
from farm_agent import backends
from farm_agent.work.kinds.inference import _warm_up


class Recorder(torch.nn.Module):
    """A real model that remembers the batch sizes it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(len(x))
        return x * 2


def task(stop: int, tuning: Tuning = Tuning()) -> ShardTask:
    return ShardTask(job_id="j", index=0, start=0, stop=stop, model="m:b", weights=None, dataset="d:x",
                     batch_size=64, backend="cpu", device="cpu", threads=1, tuning=tuning)


def test_each_batch_shape_is_warmed_once_outside_the_window() -> None:
    model, cpu = Recorder(), backends.load("cpu")
    _warm_up(cpu, model, np.zeros((68, 2), np.float32), task(68))  # a full batch and a 4-row tail
    _warm_up(cpu, model, np.zeros((67, 2), np.float32), task(67))  # only its new 3-row tail
    _warm_up(cpu, model, np.zeros((68, 2), np.float32), task(68))  # nothing new
    assert model.seen == [64, 4, 3]
    _warm_up(cpu, model, np.zeros((64, 2), np.float32), task(64, Tuning(budget_s=30)))  # a job that asks to tune
    assert model.seen == [64, 4, 3, 64]


def test_a_job_s_shards_warm_once_whatever_rows_are_left_to_tune_for() -> None:
    """Tuning carries the job's rows left (for tuning's break-even): every shard of a job differs in it, and each
    re-warmed its batch before it did not count."""
    model, cpu = Recorder(), backends.load("cpu")
    for left in (10_000, 9_936, 9_872):
        _warm_up(cpu, model, np.zeros((64, 2), np.float32), task(64, Tuning(rows_left=left)))
    assert model.seen == [64]


def test_a_tuning_run_on_the_warm_up_batch_is_its_own_phase(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An H100's tuned job said "before them 36.80 s: ... warm-up 36.77 s": 33.7 s of it was the tuning run its
    first shard made on the warm-up batch. That run is now a phase of its own (the cuda backend's own code, with
    the CPU standing in for the GPU and a real tuning run of the evaluator there)."""
    import pyarrow as pa

    from farm.core.phases import before_text
    from farm_agent.backends import cuda
    from farm_agent.work.kinds.inference import ModelBatch, _run

    monkeypatch.setenv("FARM_STATE_DIR", str(tmp_path))  # a fresh winners cache: the shard tunes
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    model = torch.nn.Linear(4, 2)
    rows = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    batches = [ModelBatch(pa.record_batch({"row_id": np.arange(i, i + 32)}), rows[i:i + 32], None) for i in (0, 32)]
    shard = ShardTask(job_id="j", index=0, start=0, stop=64, model="m:b", weights=None, dataset="d:x", batch_size=32,
                      backend="cuda", device="cpu", threads=1, tuning=Tuning(budget_s=1.0))
    result = _run(shard, model, cuda, iter(batches), lambda table: None)
    assert result.tuning is not None and result.tuning.tuning_s > 0
    phases = result.phases
    assert phases is not None and phases.tuning == result.tuning.tuning_s
    assert 0 <= phases.warm_up < phases.tuning
    assert "tuning " in before_text(phases) and phases.before >= phases.tuning + phases.warm_up
