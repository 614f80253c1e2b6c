"""A small U-Net (two down and two up levels, transposed-convolution upsampling, skip concatenations) for
segmentation of 64 x 64 images, batch 64."""

import torch
from torch import nn

BATCH = 64


def double(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down1, self.down2, self.bottom = double(3, 32), double(32, 64), double(64, 128)
        self.up2, self.dec2 = nn.ConvTranspose2d(128, 64, 2, 2), double(128, 64)
        self.up1, self.dec1 = nn.ConvTranspose2d(64, 32, 2, 2), double(64, 32)
        self.out = nn.Conv2d(32, 4, 1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(self.pool(d1))
        b = self.bottom(self.pool(d2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], 1))
        return self.out(self.dec1(torch.cat([self.up1(u2), d1], 1)))


def get_inputs() -> list:
    return [torch.randn(BATCH, 3, 64, 64)]


def get_init_inputs() -> list:
    return []
