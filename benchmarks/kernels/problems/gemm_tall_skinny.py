"""Tall-skinny GEMM: 131072 rows projected from 1024 to 256 features."""

import torch

ROWS, K, COLS = 131072, 1024, 256


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, w)


def get_inputs() -> list:
    return [torch.randn(ROWS, K), torch.randn(K, COLS) / K**0.5]


def get_init_inputs() -> list:
    return []
