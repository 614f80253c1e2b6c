"""A VGG-style stack (3 x 3 convolutions and max pooling) on 32 x 32 images, batch 256."""

import torch
from torch import nn

BATCH = 256


def stage(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(stage(3, 64), stage(64, 128), stage(128, 256))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(256 * 4 * 4, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def get_inputs() -> list:
    return [torch.randn(BATCH, 3, 32, 32)]


def get_init_inputs() -> list:
    return []
