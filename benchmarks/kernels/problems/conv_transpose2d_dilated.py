"""Dilated transposed convolution (kernel 3, stride 2, dilation 3: an atrous decoder) from 64 x 64 to 128 x 128 maps."""

import torch

BATCH, IN, OUT, SIZE = 32, 256, 128, 64


class Model(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(in_channels, out_channels, kernel_size=3, stride=2, padding=3,
                                           output_padding=1, dilation=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, IN, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [IN, OUT]
