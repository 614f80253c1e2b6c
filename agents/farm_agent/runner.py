"""Runs one shard inside a Ray worker on the node the scheduler chose; Ray made the job's code its cwd."""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from farm.core.tasks import ShardResult, ShardTask
from farm_agent import backends
from farm_agent.jobcode import load_dataset, load_model
from farm_agent.power import PowerMeter, meter_for


def run_shard(task: ShardTask) -> ShardResult:
    import ray

    root = Path.cwd()
    inputs, labels = load_dataset(task.dataset, root)
    module = load_model(task.model, task.weights, root)
    backend = backends.load(task.backend)
    with _meter(task.device).window() as window:
        began = time.perf_counter()
        outputs = backend.run(module, inputs[task.start : task.stop], task.batch_size, task.device, task.threads)
        seconds = time.perf_counter() - began
    correct = None
    if labels is not None and outputs.ndim == 2:  # class scores: count the argmax that hits the label
        correct = int((np.argmax(outputs, axis=1) == labels[task.start : task.stop]).sum())
    return ShardResult(
        outputs=outputs, items=task.stop - task.start, seconds=seconds, correct=correct,
        node_ray_id=ray.get_runtime_context().get_node_id(), energy=window.energy,
    )


@lru_cache(maxsize=8)
def _meter(device: str) -> PowerMeter:
    """One meter per device for the life of this worker process (an NVML session is worth keeping)."""
    return meter_for(device)
