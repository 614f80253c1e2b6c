"""PyTorch on the CPU: the backend every node has."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from farm.core.models import BackendName, BackendOffer, Hardware
from farm.core.tasks import Tuning
from farm_agent.backends.base import placed

if TYPE_CHECKING:
    import torch


# No batch shape is run outside a shard's window first (farm_agent.work.kinds.inference._warm_up): a CPU's first
# batch of a shape costs a fraction of a batch more (an MLP on 4,096 rows: 21 ms, then 16-17; a small CNN on 256
# images: 27 ms, then 17-19; the 2-core dev box, 2026-12), while the warm-up ran a whole batch of the model's work
# again for each new shape: in a ResNet-shaped job over 6,553 images, 8.7 s of its 149 s.
WARM_UP_SHAPES = False


def offers(hardware: Hardware, cpus: int) -> list[BackendOffer]:
    # One slot using every core the agent was given: intra-op threads beat several single-threaded shards on a
    # node whose cores share caches and memory bandwidth.
    return [
        BackendOffer(
            name=BackendName.CPU, device="cpu", detail=f"{hardware.cpu_model}, {cpus} threads", slots=1, threads=cpus
        )
    ]


def run(module: torch.nn.Module, inputs: np.ndarray, batch_size: int, device: str, threads: int,
        tuning: Tuning = Tuning()) -> np.ndarray:
    import torch

    torch.set_num_threads(max(threads, 1))
    placed(module, "cpu")
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(inputs), batch_size):
            part = inputs[start : start + batch_size]
            # The model gets this memory itself: a read-only view (Arrow's, a mapped file's) is copied first, so that
            # a model writing its input in place cannot write into the dataset's buffers.
            writable = part.flags.writeable and part.flags.c_contiguous
            batch = torch.from_numpy(part if writable else np.array(part, order="C"))
            outputs.append(module(batch).numpy())
    return np.concatenate(outputs)


def warm(device: str) -> None:
    import torch

    with torch.inference_mode():
        torch.nn.functional.linear(torch.ones(8, 8), torch.ones(8, 8))
