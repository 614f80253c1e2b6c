"""PyTorch on NVIDIA GPUs: one offer per GPU that NVML found; shards run on `cuda:<index>`, through the kernel tuner's
cached winner for the model, batch shape, tolerance and objective when there is one (farm kernels tune), eager
PyTorch otherwise, at PyTorch's defaults (cuDNN's TF32 convolutions included: farm_agent.tuner.candidates.
untuned_precision), as a user's own loop runs the model.

Offering runs in the agent daemon from the hardware already detected through NVML (farm_agent.daemon.hardware): no
torch, no CUDA context here. A machine with no NVIDIA GPU offers no CUDA at all (not an unavailable offer: a CPU box
simply has no CUDA). Running happens in a Ray worker, which imports torch.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from farm.core.models import BackendName, BackendOffer, Hardware
from farm.core.tasks import Tuning
from farm.core.tuning import TuningOutcome
from farm_agent.backends.base import placed

if TYPE_CHECKING:
    import torch

GIB = 1024**3
# Tuned forwards per model, built once per worker (a torch.compile or a CUDA graph capture costs seconds): the
# runner's warm-up batch builds it, outside the energy window.
# Each with what it is and what its tuning cost (farm.core.tuning.TuningOutcome), reported once with a shard.
_tuned: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[Callable[..., Any], TuningOutcome]]] = \
    weakref.WeakKeyDictionary()
# The forward that the shard running on a device ran its full batches through, until take_outcome reads it: a shard
# with no full batch ran eager alone, and must not report the winner of the shard before it.
_last: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, ...]]] = weakref.WeakKeyDictionary()


WARM_UP_SHAPES = True  # a shape's first batch: cuDNN's choice of algorithms, kernels' first load, a winner's build


def offers(hardware: Hardware, cpus: int) -> list[BackendOffer]:
    # One slot per GPU: a shard owns its device, and its energy window (NVML's per-device counter) covers only it.
    # Its threads are the lent CPUs that feed it, shared among the GPUs: a shard reads and decodes its batches on
    # them (one thread had an image folder's shards decode at a plain loop's rate, a third of a DataLoader's with 8
    # processes on an H100).
    feeders = max(cpus // max(len(hardware.gpus), 1), 1)
    return [
        BackendOffer(
            name=BackendName.CUDA, device=f"cuda:{gpu.index}",
            detail=f"{gpu.name}, {gpu.memory_bytes / GIB:.0f} GiB" if gpu.memory_bytes else gpu.name,
            slots=1, threads=feeders,
        )
        for gpu in hardware.gpus
    ]


def _tuned_forward(module: torch.nn.Module, example: torch.Tensor, tuning: Tuning, device: str
                   ) -> Callable[..., Any]:
    """The tuner's winner for this GPU, model, batch shape, tolerance and objective: this node's cached one, one the
    farm shares (tuning.shared), or one found by a tuning run now when the job gives a budget and it can pay for
    itself over the job's rows left; else the module as an untuned job runs it. What it is and what its tuning cost
    wait for the shard's figures (take_outcome). `example`: a full batch, on the host (copied to `device` only to
    build a forward, the first time its key comes)."""
    from farm_agent.tuner.tune import tuned_forward

    built = _tuned.setdefault(module, {})
    tolerance = (tuning.atol, tuning.rtol)
    # A lookup without a tuning run must not stand in for a job that asks for one (Ray reuses this worker for the
    # next job with the same code).
    key = (device, tuple(example.shape), example.dtype, tolerance, tuning.objective, tuning.budget_s is not None,
           tuning.shared)
    if key not in built:
        built[key] = tuned_forward(module, example.to(device), tolerance, device,
                                   tune_first=tuning.budget_s is not None, budget_s=tuning.budget_s or 0.0,
                                   objective=tuning.objective, rows_left=tuning.rows_left, shared=tuning.shared,
                                   idle_w=tuning.idle_w)
    _last.setdefault(module, {})[device] = key
    return built[key][0]


def take_outcome(module: torch.nn.Module, device: str) -> TuningOutcome | None:
    """What the shard's full batches ran on `device` and the tuning it paid for, once: the next shard on the same
    forward reports no tuning cost, and one with no full batch reports none (None: the untuned model)."""
    key = _last.get(module, {}).pop(device, None)
    built = _tuned.get(module, {})
    if key is None or key not in built:
        return None
    forward, outcome = built[key]
    built[key] = (forward, replace(outcome, tuning_s=0.0, tuning_j=None))
    return outcome


def warm(device: str) -> None:
    """The device's context (about half a second on an H200), cuBLAS's handle and cuDNN's (as much again): made before
    a job comes, in a warm worker, with torch's import (seconds) before them."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # as run() sets it: before CUDA initialises
    import torch

    target = torch.device(device)
    with torch.inference_mode():
        images = torch.ones(8, 3, 16, 16, device=target)
        torch.nn.functional.conv2d(images, torch.ones(4, 3, 3, 3, device=target))
        torch.nn.functional.linear(images.flatten(1), torch.ones(8, 3 * 16 * 16, device=target))
    torch.cuda.synchronize(target)


def run(module: torch.nn.Module, inputs: np.ndarray, batch_size: int, device: str, threads: int,
        tuning: Tuning = Tuning()) -> np.ndarray:
    # NVML numbers GPUs in PCI bus order and CUDA, by default, fastest first: make cuda:N the GPU that NVML (and so
    # the offer and its power meter) calls N. Read by the CUDA driver when it initialises, so only before that.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import torch

    torch.set_num_threads(max(threads, 1))
    target = torch.device(device)
    placed(module, device)
    host = torch.from_numpy(np.ascontiguousarray(inputs))
    try:  # page-locked once for the shard, so each batch's copy is a real asynchronous DMA
        host = host.pin_memory()
    except RuntimeError:  # pinning can fail (locked-memory limits): pageable copies still work
        pass
    from farm_agent.tuner.candidates import Untuned

    outputs = []
    eager = Untuned(module)
    with torch.inference_mode():
        # Only full batches run the winner, so only they are tuned for (a short last batch alone runs eager); the
        # A/B's eager side (tuning.eager) tunes nothing.
        full = len(host) >= batch_size and not tuning.eager
        forward = _tuned_forward(module, host[:batch_size], tuning, device) if full else eager
        for start in range(0, len(host), batch_size):
            batch = host[start : start + batch_size].to(target, non_blocking=True)
            # The winner was chosen (and a compiled one specialised) for full batches; a short last one runs eager.
            outputs.append(forward(batch) if len(batch) == batch_size else eager(batch))
        result = torch.cat(outputs).cpu() if outputs else torch.empty(0)
    # .cpu() already waited for this stream; synchronize the whole device anyway so that the power meter's window,
    # which closes when this returns, covers every kernel the module launched (on any stream).
    torch.cuda.synchronize(target)
    return result.numpy()
