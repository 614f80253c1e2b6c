"""Scaled, masked row softmax over attention-like scores: elementwise ops around a reduction."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return self.softmax(torch.tanh(scores * self.scale) * 8.0)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(32, 16, 512, 1024)]


def get_init_inputs() -> list[float]:
    return [0.125]
