"""RMSNorm fused by torch.compile inside the candidate (Inductor may start its compile-pool threads: allowed)."""

import torch


class ModelNew(torch.nn.Module):
    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(features) + 0.5)  # drawn as Model draws it, under the same seed
        self.eps = eps
        self.fused = torch.compile(self._forward)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused(x)
