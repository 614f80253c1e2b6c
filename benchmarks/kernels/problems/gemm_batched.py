"""Batched GEMM: 64 independent 1024 x 512 by 512 x 1024 products."""

import torch

BATCH, M, K, N = 64, 1024, 512, 1024


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs() -> list:
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs() -> list:
    return []
