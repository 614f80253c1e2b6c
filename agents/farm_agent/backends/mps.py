"""PyTorch on the Mac GPU through Metal (`mps`).

Offering runs in the agent daemon from the detected hardware (no torch): an Apple Silicon Mac offers one `mps`
slot; any other machine offers none. Running happens in a Ray worker, which imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from farm.core.models import BackendName, BackendOffer, Hardware
from farm.core.tasks import Tuning
from farm_agent.backends.base import placed

if TYPE_CHECKING:
    import torch


WARM_UP_SHAPES = True  # a shape's first batch compiles its Metal kernels


def offers(hardware: Hardware, cpus: int) -> list[BackendOffer]:
    # Intel Macs have MPS too, on AMD GPUs, but no power meter here reads them: Apple Silicon only.
    if hardware.os != "darwin" or not hardware.apple_chip:
        return []
    # Its threads: the lent CPUs that read and decode its batches (farm_agent.backends.cuda says why).
    return [BackendOffer(name=BackendName.MPS, device="mps", detail=f"{hardware.apple_chip} GPU (Metal)", slots=1,
                         threads=max(cpus, 1))]


def run(module: torch.nn.Module, inputs: np.ndarray, batch_size: int, device: str, threads: int,
        tuning: Tuning = Tuning()) -> np.ndarray:
    import torch

    if not torch.backends.mps.is_available():
        raise RuntimeError("PyTorch's MPS backend is not available here (it needs macOS 12.3+ on Apple Silicon)")
    torch.set_num_threads(max(threads, 1))
    target = torch.device("mps")
    placed(module, "mps")
    # Metal has no float64: float inputs run as float32, as they do on the CPU backend.
    host = inputs.astype(np.float32, copy=False) if inputs.dtype == np.float64 else inputs
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(host), batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(host[start : start + batch_size])).to(target)
            outputs.append(module(batch))
        result = torch.cat(outputs).cpu() if outputs else torch.empty(0)
    # Every kernel done before the power meter's window closes.
    torch.mps.synchronize()
    return result.numpy()


def warm(device: str) -> None:
    import torch

    if torch.backends.mps.is_available():
        with torch.inference_mode():
            torch.nn.functional.linear(torch.ones(8, 8, device="mps"), torch.ones(8, 8, device="mps"))
        torch.mps.synchronize()
