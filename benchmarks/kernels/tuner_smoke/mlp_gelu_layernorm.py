"""Linear (2048 -> 8192) + GELU + LayerNorm over 8192 rows: a GEMM with an epilogue and a norm."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.up(x)))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(8192, 2048)]


def get_init_inputs() -> list[int]:
    return [2048, 8192]
