"""LayerNorm through Farm's Triton norm kernel: each 8192-wide row read once into registers, mean, variance, affine
and store in one program (one read and one write of the tensor)."""

import torch


class ModelNew(torch.nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(features)
        with torch.no_grad():  # the same draws as Model, in the same order
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return self.norm(x)
        from farm_agent.tuner.triton_kernels.norm import norm

        return norm(x, self.norm.weight, self.norm.bias, self.norm.eps, rms=False)
