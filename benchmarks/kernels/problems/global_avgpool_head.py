"""A classifier head: global average pooling of 2048 x 28 x 28 features, then a 2048 -> 1000 Linear."""

import torch

BATCH, CHANNELS, SIZE, CLASSES = 512, 2048, 28, 1000


class Model(torch.nn.Module):
    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(x), 1))


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [CHANNELS, CLASSES]
