"""3x3 convolution (64 -> 128 channels) + BatchNorm + ReLU on 32 images of 112x112."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(32, 64, 112, 112)]


def get_init_inputs() -> list[int]:
    return [64, 128]
