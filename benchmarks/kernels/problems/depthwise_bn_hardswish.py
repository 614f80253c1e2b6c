"""Depthwise 3x3 convolution over 384 channels of 112 x 112 maps, BatchNorm and Hardswish (a mobile block's middle)."""

import torch

BATCH, CHANNELS, SIZE = 64, 384, 112


class Model(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.norm = torch.nn.BatchNorm2d(channels)
        self.act = torch.nn.Hardswish()
        with torch.no_grad():
            self.norm.running_mean.uniform_(-0.2, 0.2)
            self.norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [CHANNELS]
