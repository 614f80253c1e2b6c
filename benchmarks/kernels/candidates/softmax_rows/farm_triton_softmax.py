"""Softmax through Farm's Triton kernel: each 16,384-wide row read once into registers and written once."""

import torch


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return torch.softmax(x, dim=-1)
        from farm_agent.tuner.triton_kernels.softmax import softmax

        return softmax(x)
