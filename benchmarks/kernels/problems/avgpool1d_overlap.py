"""Overlapping 1-D average pooling (kernel 5, stride 2, padding 2, padding not counted) of 256 channels x 8192 steps."""

import torch

BATCH, CHANNELS, LENGTH = 256, 256, 8192


class Model(torch.nn.Module):
    def __init__(self, kernel: int) -> None:
        super().__init__()
        self.pool = torch.nn.AvgPool1d(kernel, stride=2, padding=kernel // 2, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, LENGTH)]


def get_init_inputs() -> list:
    return [5]
