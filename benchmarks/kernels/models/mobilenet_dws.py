"""A depthwise-separable network (MobileNet-v1 style) on 64 x 64 images, batch 256: many small kernels."""

import torch
from torch import nn

BATCH = 256


def separable(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(),
                         nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6())


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        widths = [(32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2),
                  (512, 512, 1), (512, 512, 1)]
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6())
        self.body = nn.Sequential(*(separable(a, b, s) for a, b, s in widths))
        self.head = nn.Linear(512, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)).mean((2, 3)))


def get_inputs() -> list:
    return [torch.randn(BATCH, 3, 64, 64)]


def get_init_inputs() -> list:
    return []
