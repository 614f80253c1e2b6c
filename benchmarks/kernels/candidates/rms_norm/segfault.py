"""Deliberately crashes its evaluating process (a segmentation fault: reads address 0): fails alone."""

import ctypes

import torch


class ModelNew(torch.nn.Module):
    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctypes.string_at(0)
        return x
