"""A diffusion U-Net block: 3x3 convolution 256 to 256 channels on 64 x 64 maps, GroupNorm (32 groups), SiLU."""

import torch

BATCH, CHANNELS, SIZE = 16, 256, 64


class Model(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = torch.nn.GroupNorm(32, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(self.norm(self.conv(x)))


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [CHANNELS]
