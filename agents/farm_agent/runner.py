"""Runs one shard inside a Ray worker on the node the scheduler chose; Ray made the job's code its cwd."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from farm.core.tasks import ShardResult, ShardTask
from farm_agent import backends
from farm_agent.jobcode import load_dataset, load_model


def run_shard(task: ShardTask) -> ShardResult:
    import ray

    root = Path.cwd()
    inputs, labels = load_dataset(task.dataset, root)
    module = load_model(task.model, task.weights, root)
    backend = backends.load(task.backend)
    began = time.perf_counter()
    outputs = backend.run(module, inputs[task.start : task.stop], task.batch_size, task.device, task.threads)
    seconds = time.perf_counter() - began
    correct = None
    if labels is not None and outputs.ndim == 2:  # class scores: count the argmax that hits the label
        correct = int((np.argmax(outputs, axis=1) == labels[task.start : task.stop]).sum())
    return ShardResult(
        outputs=outputs, items=task.stop - task.start, seconds=seconds, correct=correct,
        node_ray_id=ray.get_runtime_context().get_node_id(), energy=None,
    )
