"""3x3 convolution (64 to 128 channels), GroupNorm (16 groups), Hardswish, on 32 images of 96 x 96."""

import torch

BATCH, IN, OUT, GROUPS, SIZE = 32, 64, 128, 16, 96


class Model(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int, groups: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.norm = torch.nn.GroupNorm(groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.hardswish(self.norm(self.conv(x)))


def get_inputs() -> list:
    return [torch.randn(BATCH, IN, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [IN, OUT, GROUPS]
