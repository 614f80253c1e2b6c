"""PyTorch on the CPU: the backend every node has."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from farm.core.models import BackendName, BackendOffer, Hardware
from farm.core.tasks import Tuning

if TYPE_CHECKING:
    import torch


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
    module.eval()
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
