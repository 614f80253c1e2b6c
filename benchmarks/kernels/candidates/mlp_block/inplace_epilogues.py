"""MLP block with its elementwise work in place: GELU over the up projection's own output (no second 256 MiB
buffer) and the residual added into the down projection's output, both GEMMs with the bias in cuBLAS's epilogue."""

import torch
import torch.nn.functional as F


class ModelNew(torch.nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        h = F.layer_norm(x2, self.norm.normalized_shape, self.norm.weight, self.norm.bias, self.norm.eps)
        u = torch.addmm(self.up.bias, h, self.up.weight.t())
        torch._C._nn.gelu_(u)
        return torch.addmm(self.down.bias, u, self.down.weight.t()).add_(x2).view(x.shape)
