"""What the head needs to know of each backend, in one table: adding a backend is its BackendName member, its line
here, and its agent module (farm_agent/backends/<name>.py, found by name)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from farm.core.models import BackendName


@dataclass(frozen=True)
class BackendTraits:
    prior_speedup: float  # items per second against one CPU core, until a device of it is measured
    per_thread: bool = False  # its prior scales with the threads an offer has (a CPU)
    own_memory: bool = False  # its device has memory of its own (a discrete GPU); else it shares the machine's
    kernel_eval: bool = False  # the hardened kernel evaluator runs on it
    nccl: bool = False  # training workers that all run on it reduce over NCCL (else gloo, on host copies)


BACKENDS: Mapping[BackendName, BackendTraits] = {
    BackendName.CUDA: BackendTraits(prior_speedup=50.0, own_memory=True, kernel_eval=True, nccl=True),
    BackendName.ANE: BackendTraits(prior_speedup=20.0),
    BackendName.MPS: BackendTraits(prior_speedup=15.0),
    BackendName.CPU: BackendTraits(prior_speedup=1.0, per_thread=True, kernel_eval=True),
}
