"""Volumetric decoder step: transposed 3-D convolution (kernel 4, stride 2) 64 to 32 channels, BatchNorm, ReLU."""

import torch

BATCH, IN, OUT, DEPTH, SIZE = 16, 64, 32, 16, 32


class Model(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = torch.nn.ConvTranspose3d(in_channels, out_channels, kernel_size=4, stride=2, padding=1)
        self.norm = torch.nn.BatchNorm3d(out_channels)
        with torch.no_grad():  # running statistics as a trained model has them
            self.norm.running_mean.uniform_(-0.2, 0.2)
            self.norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.up(x)))


def get_inputs() -> list:
    return [torch.randn(BATCH, IN, DEPTH, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [IN, OUT]
