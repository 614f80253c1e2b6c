"""PyTorch on NVIDIA GPUs: one offer per GPU that NVML found, eager PyTorch on `cuda:<index>`.

Offering runs in the agent daemon from the hardware already detected through NVML (farm_agent.hardware): no torch,
no CUDA context here. A machine with no NVIDIA GPU offers no CUDA at all (not an unavailable offer: a CPU box simply
has no CUDA). Running happens in a Ray worker, which imports torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from farm.core.models import BackendName, BackendOffer, Hardware

if TYPE_CHECKING:
    import torch

GIB = 1024**3


def offers(hardware: Hardware, cpus: int) -> list[BackendOffer]:
    # One slot per GPU: a shard owns its device, and its energy window (NVML's per-device counter) covers only it.
    return [
        BackendOffer(
            name=BackendName.CUDA, device=f"cuda:{gpu.index}",
            detail=f"{gpu.name}, {gpu.memory_bytes / GIB:.0f} GiB" if gpu.memory_bytes else gpu.name,
            slots=1, threads=1,
        )
        for gpu in hardware.gpus
    ]


def run(module: torch.nn.Module, inputs: np.ndarray, batch_size: int, device: str, threads: int) -> np.ndarray:
    # NVML numbers GPUs in PCI bus order and CUDA, by default, fastest first: make cuda:N the GPU that NVML (and so
    # the offer and its power meter) calls N. Read by the CUDA driver when it initialises, so only before that.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import torch

    torch.set_num_threads(max(threads, 1))
    target = torch.device(device)
    module = module.to(target).eval()
    host = torch.from_numpy(np.ascontiguousarray(inputs))
    try:  # page-locked once for the shard, so each batch's copy is a real asynchronous DMA
        host = host.pin_memory()
    except RuntimeError:  # pinning can fail (locked-memory limits): pageable copies still work
        pass
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(host), batch_size):
            batch = host[start : start + batch_size].to(target, non_blocking=True)
            outputs.append(module(batch))
        result = torch.cat(outputs).cpu() if outputs else torch.empty(0)
    # .cpu() already waited for this stream; synchronize the whole device anyway so that the power meter's window,
    # which closes when this returns, covers every kernel the module launched (on any stream).
    torch.cuda.synchronize(target)
    return result.numpy()
