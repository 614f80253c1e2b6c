"""GELU's tanh approximation: faster on some GPUs, but ~1e-3 off the exact GELU, so incorrect at 1e-4."""

import torch


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")
