"""Projection to 16384 classes followed by a softmax over them (a classifier head)."""

import torch

TOKENS, FEATURES, CLASSES = 8192, 1024, 16384


class Model(torch.nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.head = torch.nn.Linear(features, classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.head(x), dim=-1)


def get_inputs() -> list:
    return [torch.randn(TOKENS, FEATURES)]


def get_init_inputs() -> list:
    return [FEATURES, CLASSES]
