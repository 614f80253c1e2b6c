"""Runs one shard inside a Ray worker on the node the scheduler chose; Ray made the job's code its cwd."""

from __future__ import annotations

import time
import weakref
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import psutil

from farm.core.tasks import ShardResult, ShardTask, Tuning
from farm_agent import backends
from farm_agent.backends.base import Backend
from farm_agent.capture import job_shard
from farm_agent.jobcode import load_dataset, load_model
from farm_agent.power import PowerMeter, meter_for

if TYPE_CHECKING:
    import torch

# What each loaded model has already run in this worker process: (device, tuning, batch rows). load_model keeps
# models cached, and Ray reuses a worker for the next job with the same code, whose tuning may differ.
_warm: weakref.WeakKeyDictionary[torch.nn.Module, set[tuple[str, Tuning, int]]] = weakref.WeakKeyDictionary()


@job_shard
def run_shard(task: ShardTask) -> ShardResult:
    import ray

    root = Path.cwd()
    inputs, labels = load_dataset(task.dataset, root)
    module = load_model(task.model, task.weights, root)
    backend = backends.load(task.backend)
    shard = inputs[task.start : task.stop]
    _warm_up(backend, module, shard, task)
    _reset_peak_memory(task.device)
    with _meter(task.device).window() as window:
        began = time.perf_counter()
        outputs = backend.run(module, shard, task.batch_size, task.device, task.threads, task.tuning)
        seconds = time.perf_counter() - began
    correct = None
    if labels is not None and outputs.ndim == 2:  # class scores: count the argmax that hits the label
        correct = int((np.argmax(outputs, axis=1) == labels[task.start : task.stop]).sum())
    return ShardResult(
        outputs=outputs, items=task.stop - task.start, seconds=seconds, correct=correct,
        node_ray_id=ray.get_runtime_context().get_node_id(), energy=window.energy,
        peak_memory_bytes=_peak_memory(task.device),
    )


def _warm_up(backend: Backend, module: torch.nn.Module, shard: np.ndarray, task: ShardTask) -> None:
    """The shard's batch shapes (a full batch, and its short last one) run once outside the measured window, the
    first time this worker runs them on the device.

    A model's first batch pays one-off costs: the CUDA context and its kernels' lazy loading, cuDNN's algorithm
    search, the allocator's first blocks, and the kernel tuner's search or its winner's compilation; a new batch
    shape loads kernels of its own. On the H200 a cold first shard took 4-10x a warm one, and with the full batch
    warmed alone, a shard whose last batch had 4 rows still took 25x. Inside the window these costs would be billed
    to the device's calibration, which would then rank the device by its start-up.
    """
    warmed = _warm.setdefault(module, set())
    for rows in {min(task.batch_size, len(shard)), len(shard) % task.batch_size} - {0}:
        if (task.device, task.tuning, rows) not in warmed:
            backend.run(module, shard[:rows], task.batch_size, task.device, task.threads, task.tuning)
            warmed.add((task.device, task.tuning, rows))


def _reset_peak_memory(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device: str) -> int:
    """Bytes the shard needed: the GPU's peak allocation over the shard (the model's weights included), or this
    worker's resident memory for host devices (an upper bound: it holds the Python runtime and torch as well)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    return int(psutil.Process().memory_info().rss)


@lru_cache(maxsize=8)
def _meter(device: str) -> PowerMeter:
    """One meter per device for the life of this worker process (an NVML session is worth keeping)."""
    return meter_for(device)
