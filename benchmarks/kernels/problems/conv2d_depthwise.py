"""Depthwise 3x3 convolution (one filter per channel), 256 channels on 128 images of 112 x 112."""

import torch

BATCH, CHANNELS, SIZE = 128, 256, 112


class Model(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, kernel_size=3, padding=1, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [CHANNELS]
