"""3x3x3 volumetric convolution, 32 to 64 channels on 8 volumes of 32 x 64 x 64."""

import torch

BATCH, IN, OUT, DEPTH, SIZE = 8, 32, 64, 32, 64


class Model(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(in_channels, out_channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, IN, DEPTH, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [IN, OUT]
