"""The contract between the head's dispatcher and the code that runs a shard on a node."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from farm.core.energy import Energy


@dataclass(frozen=True)
class Tuning:
    """How far a faster implementation of the model may drift from it in fp32 (the job's tolerance), and whether to
    tune before running (the CUDA backend's kernel tuner; other backends run the model as it is)."""

    atol: float = 1e-4
    rtol: float = 1e-4
    budget_s: float | None = None  # tune first, once per model, batch shape and GPU, within this many seconds


@dataclass(frozen=True)
class ShardTask:
    job_id: str
    index: int
    start: int
    stop: int
    model: str  # module:callable returning a torch.nn.Module
    weights: str | None  # state_dict path inside the job's code
    dataset: str  # module:callable or a data file inside the job's code
    batch_size: int
    backend: str
    device: str
    threads: int
    tuning: Tuning = Tuning()


@dataclass(frozen=True)
class ShardResult:
    outputs: np.ndarray
    items: int
    seconds: float  # time spent in the model, loading excluded
    correct: int | None  # predictions equal to the dataset's labels, when it has labels
    node_ray_id: str
    energy: Energy | None  # what the device spent over `seconds`; None where no meter could tell
    peak_memory_bytes: int = 0  # the most memory the shard took on its device (0: not measured)
