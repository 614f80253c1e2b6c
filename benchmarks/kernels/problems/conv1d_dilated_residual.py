"""Dilated (4) 1-D convolution, 128 channels over 8192 steps, ReLU, scaled and added back to its input."""

import torch

BATCH, CHANNELS, LENGTH = 64, 128, 8192


class Model(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(channels, channels, 3, padding=4, dilation=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.5 * torch.relu(self.conv(x))


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, LENGTH)]


def get_init_inputs() -> list:
    return [CHANNELS]
