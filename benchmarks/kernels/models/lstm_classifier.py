"""A one-layer LSTM over 128 steps of 32 features, batch 512, its mean state classified."""

import torch
from torch import nn

BATCH, STEPS, FEATURES, HIDDEN = 512, 128, 32, 256


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(FEATURES, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out.mean(1))


def get_inputs() -> list:
    return [torch.randn(BATCH, STEPS, FEATURES)]


def get_init_inputs() -> list:
    return []
