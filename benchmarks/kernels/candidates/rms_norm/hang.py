"""Deliberately never answers: the evaluator's time limit fails it alone."""

import time

import torch


class ModelNew(torch.nn.Module):
    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while True:
            time.sleep(3600)
