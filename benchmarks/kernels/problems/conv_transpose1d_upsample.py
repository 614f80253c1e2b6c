"""Transposed 1-D convolution upsampling a 2048-step signal 4x (kernel 8, stride 4), 256 to 128 channels, LeakyReLU."""

import torch

BATCH, IN, OUT, LENGTH = 64, 256, 128, 2048


class Model(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = torch.nn.ConvTranspose1d(in_channels, out_channels, kernel_size=8, stride=4, padding=2)
        self.act = torch.nn.LeakyReLU(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.up(x))


def get_inputs() -> list:
    return [torch.randn(BATCH, IN, LENGTH)]


def get_init_inputs() -> list:
    return [IN, OUT]
