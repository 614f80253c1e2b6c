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
