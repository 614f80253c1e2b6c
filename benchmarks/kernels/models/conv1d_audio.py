"""A 1-D convolutional audio classifier (strided front end, dilated residual stack) over one second at 16 kHz,
batch 128."""

import torch
from torch import nn

BATCH, SAMPLES, WIDTH = 128, 16000, 64


class Residual(nn.Module):
    def __init__(self, dilation: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(WIDTH, WIDTH, 3, padding=dilation, dilation=dilation), nn.BatchNorm1d(WIDTH),
                                  nn.ReLU(), nn.Conv1d(WIDTH, WIDTH, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.front = nn.Sequential(nn.Conv1d(1, WIDTH, 80, stride=16), nn.BatchNorm1d(WIDTH), nn.ReLU(),
                                   nn.MaxPool1d(4))
        self.stack = nn.Sequential(*(Residual(d) for d in (1, 2, 4, 8, 16)))
        self.head = nn.Linear(WIDTH, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stack(self.front(x)).mean(2))


def get_inputs() -> list:
    return [torch.randn(BATCH, 1, SAMPLES)]


def get_init_inputs() -> list:
    return []
