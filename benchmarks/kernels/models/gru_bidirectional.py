"""A two-layer bidirectional GRU over sequences of 64 steps of 64 features, batch 256, classifying the last step:
a recurrence of many small kernels."""

import torch
from torch import nn

BATCH, STEPS, FEATURES, HIDDEN = 256, 64, 64, 128


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(FEATURES, HIDDEN, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * HIDDEN, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def get_inputs() -> list:
    return [torch.randn(BATCH, STEPS, FEATURES)]


def get_init_inputs() -> list:
    return []
