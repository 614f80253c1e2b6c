"""A wide MLP over tabular rows (256 features, three hidden layers of 1024 with LayerNorm), batch 4096."""

import torch
from torch import nn

BATCH, FEATURES, WIDTH = 4096, 256, 1024


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = FEATURES
        for _ in range(3):
            layers += [nn.Linear(width, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()]
            width = WIDTH
        self.body = nn.Sequential(*layers, nn.Linear(WIDTH, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs() -> list:
    return []
