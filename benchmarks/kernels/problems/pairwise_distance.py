"""Euclidean distances between every pair of 8192 points and 8192 others in 512 dimensions (torch.cdist)."""

import torch

POINTS, DIM = 8192, 512


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cdist(x, y, p=2.0)


def get_inputs() -> list:
    return [torch.randn(POINTS, DIM), torch.randn(POINTS, DIM)]


def get_init_inputs() -> list:
    return []
