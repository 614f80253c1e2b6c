"""A small vision transformer (4 x 4 patches of 32 x 32 images, width 192, 6 layers, 3 heads), batch 256."""

import torch
from torch import nn

BATCH, DIM, DEPTH, HEADS = 256, 192, 6, 3


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, DIM, 4, 4)
        self.position = nn.Parameter(torch.randn(1, 64, DIM) * 0.02)
        layer = nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, DEPTH, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(x).flatten(2).transpose(1, 2) + self.position
        return self.head(self.norm(self.encoder(tokens)).mean(1))


def get_inputs() -> list:
    return [torch.randn(BATCH, 3, 32, 32)]


def get_init_inputs() -> list:
    return []
