"""RMSNorm through Farm's Triton norm kernel: each 8192-wide row read once, sum of squares, rsqrt and weight applied
in registers, written once (eager makes a pass for pow, mean, rsqrt-add and each multiply)."""

import torch


class ModelNew(torch.nn.Module):
    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(features) + 0.5)  # drawn as Model draws it, under the same seed
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight
        from farm_agent.tuner.triton_kernels.norm import norm

        return norm(x, self.weight, None, self.eps, rms=True)
