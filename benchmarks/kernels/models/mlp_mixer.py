"""An MLP-Mixer (4 x 4 patches of 32 x 32 images, width 256, 4 layers of token and channel mixing), batch 256."""

import torch
from torch import nn

BATCH, DIM, TOKENS, DEPTH = 256, 256, 64, 4


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.tokens = nn.Sequential(nn.Linear(TOKENS, 2 * TOKENS), nn.GELU(), nn.Linear(2 * TOKENS, TOKENS))
        self.channels = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, DIM, 4, 4)
        self.layers = nn.Sequential(*(Mixer() for _ in range(DEPTH)))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.layers(tokens)).mean(1))


def get_inputs() -> list:
    return [torch.randn(BATCH, 3, 32, 32)]


def get_init_inputs() -> list:
    return []
