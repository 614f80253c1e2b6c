"""addmm (bias in cuBLAS's epilogue) followed by GELU in place on the GEMM's output: no second 256 MiB output
buffer allocated and the activation written over the data it reads."""

import torch


class ModelNew(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.addmm(self.linear.bias, x.reshape(-1, x.shape[-1]), self.linear.weight.t())
        torch._C._nn.gelu_(y)
        return y.view(*x.shape[:-1], -1)
