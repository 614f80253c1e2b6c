"""Transposed convolution upsampling 64 x 64 maps to 128 x 128 (kernel 4, stride 2), 256 to 128 channels."""

import torch

BATCH, IN, OUT, SIZE = 32, 256, 128, 64


class Model(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(in_channels, out_channels, kernel_size=4, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, IN, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [IN, OUT]
