"""A batch staged for its device: in page-locked (pinned) host memory when the device is CUDA, so that its copy to
the GPU is a DMA the backend issues with non_blocking=True (farm_agent.backends.cuda) and overlaps the GPU's work; as
it is for any other device.

Staged by the shard's reader thread (farm_agent.work.prefetch), while the device runs the batches before it: the
copy into pinned memory then costs the model's thread nothing, and the CUDA backend's own `pin_memory()` of the
batch returns it as it is (PyTorch returns a tensor already pinned unchanged). The pinned block comes from PyTorch's
caching host allocator, which reuses it only once the copies that read it have completed (the same path as
DataLoader's pin_memory). Only a CUDA machine exercises the pinned branch; elsewhere, and where pinning fails (a
locked-memory limit), the batch goes as it is.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def staged(inputs: np.ndarray, device: str) -> np.ndarray:
    """`inputs` in pinned host memory for a CUDA device (a copy; the array keeps its pinned tensor alive), else the
    very same array. Arrays of Python objects (not numbers) are never pinned: they are not a model's input."""
    if not device.startswith("cuda") or inputs.dtype.kind not in "biufc" or not _cuda():
        return inputs
    import torch

    try:
        dtype = torch.from_numpy(np.empty(0, inputs.dtype)).dtype
        pinned = torch.empty(inputs.shape, dtype=dtype, pin_memory=True).numpy()
    except (RuntimeError, TypeError):  # pinning refused (locked-memory limits), a dtype torch lacks: pageable
        return inputs
    pinned[...] = inputs  # one copy, from Arrow's or the decoder's memory (read-only arrays included)
    return pinned


@lru_cache(maxsize=1)
def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
