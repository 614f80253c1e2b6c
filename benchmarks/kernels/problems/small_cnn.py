"""A small residual CNN classifier: strided stem, two stages of residual blocks, global pooling, linear head."""

import torch
from torch import nn

BATCH, SIZE, CLASSES = 64, 160, 100


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class Model(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 5, stride=2, padding=2, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.stage1 = nn.Sequential(Block(64), Block(64))
        self.down = nn.Sequential(
            nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(128), nn.ReLU()
        )
        self.stage2 = nn.Sequential(Block(128), Block(128))
        self.head = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def get_inputs() -> list:
    return [torch.randn(BATCH, 3, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [CLASSES]
