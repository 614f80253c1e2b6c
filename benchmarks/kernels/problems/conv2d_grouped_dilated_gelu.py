"""Grouped (8 groups) dilated (2) strided (2) 3x3 convolution, 256 channels on 128 x 128 maps, with bias and GELU."""

import torch

BATCH, CHANNELS, GROUPS, SIZE = 64, 256, 8, 128


class Model(torch.nn.Module):
    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, stride=2, padding=2, dilation=2, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.conv(x))


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [CHANNELS, GROUPS]
