"""EfficientNet-style MBConv blocks (expansion, depthwise, squeeze-excitation, SiLU) on 64 x 64 images, batch 256:
launch-bound on a large GPU."""

import torch
from torch import nn

BATCH = 256


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU())
        self.depthwise = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
                                       nn.SiLU())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, mid // 16, 1), nn.SiLU(),
                                nn.Conv2d(mid // 16, mid, 1), nn.Sigmoid())
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.depthwise(self.expand(x))
        h = self.project(h * self.se(h))
        return x + h if self.residual else h


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU())
        self.blocks = nn.Sequential(MBConv(32, 32, 1), MBConv(32, 48, 2), MBConv(48, 48, 1), MBConv(48, 96, 2),
                                    MBConv(96, 96, 1), MBConv(96, 160, 2), MBConv(160, 160, 1))
        self.head = nn.Linear(160, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def get_inputs() -> list:
    return [torch.randn(BATCH, 3, 64, 64)]


def get_init_inputs() -> list:
    return []
