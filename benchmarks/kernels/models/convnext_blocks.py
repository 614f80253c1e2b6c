"""ConvNeXt-style blocks (7 x 7 depthwise, LayerNorm over channels, inverted MLP) at 28 x 28 x 96, batch 128."""

import torch
from torch import nn

BATCH, DIM, SIZE = 128, 96, 28


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(DIM, DIM, 7, padding=3, groups=DIM)
        self.norm = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.depthwise(x).permute(0, 2, 3, 1)
        return x + self.mlp(self.norm(h)).permute(0, 3, 1, 2)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block(), Block())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, DIM, SIZE, SIZE)]


def get_init_inputs() -> list:
    return []
