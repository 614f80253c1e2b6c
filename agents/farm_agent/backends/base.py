"""The one small interface every backend implements (one backend per module in this package).

Offering runs in the agent daemon and must stay light (no torch); running happens in a Ray worker.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from farm.core.models import BackendOffer, Hardware
from farm.core.tasks import Tuning

if TYPE_CHECKING:
    import torch


class Backend(Protocol):
    # Whether a shard runs each batch shape new to its worker once before its measured window (CUDA's, cuDNN's and a
    # compiler's first-call costs are seconds; a CPU's a fraction of a batch).
    WARM_UP_SHAPES: bool

    def offers(self, hardware: Hardware, cpus: int) -> list[BackendOffer]:
        """What this backend can run on this machine; an unavailable offer says why."""
        ...

    def run(self, module: torch.nn.Module, inputs: np.ndarray, batch_size: int, device: str, threads: int,
            tuning: Tuning = Tuning()) -> np.ndarray:
        """Outputs for `inputs`, in input order; `tuning`: the job's tolerance and tuning budget, for a backend
        that runs models through tuned kernels (the others run the model as it is)."""
        ...

    def warm(self, device: str) -> None:
        """What any job's first shard on `device` would pay before its first batch (torch imported, the device's
        context and its libraries' handles made), paid in a warm worker before a job comes (farm_agent.work.host)."""
        ...


# The device each model was moved to (and set to eval mode on) in this worker: once, not each batch. `.to()` walks
# every parameter and buffer: 0.53 ms a call for a ResNet-18 on the dev box's CPU, more than a small model's batch
# takes on a GPU.
_placed: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def placed(module: torch.nn.Module, device: str) -> None:
    """`module` on `device` and in eval mode, moved there the first time only (_placed)."""
    if _placed.get(module) != device:
        module.to(device).eval()
        _placed[module] = device
