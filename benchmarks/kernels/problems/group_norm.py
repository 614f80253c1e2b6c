"""GroupNorm, 32 groups of 512 channels, on 256 maps of 64 x 64."""

import torch

BATCH, CHANNELS, GROUPS, SIZE = 256, 512, 32, 64


class Model(torch.nn.Module):
    def __init__(self, groups: int, channels: int) -> None:
        super().__init__()
        self.norm = torch.nn.GroupNorm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE) + 0.3]


def get_init_inputs() -> list:
    return [GROUPS, CHANNELS]
