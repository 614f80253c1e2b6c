"""Square fp32 GEMM, 4096 x 4096 x 4096."""

import torch

N = 4096


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs() -> list:
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs() -> list:
    return []
