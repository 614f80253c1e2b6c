"""1x1 (pointwise) convolution widening 256 to 512 channels on 64 images of 56 x 56."""

import torch

BATCH, IN, OUT, SIZE = 64, 256, 512, 56


class Model(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, IN, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [IN, OUT]
