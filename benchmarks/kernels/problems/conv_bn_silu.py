"""3x3 convolution without bias, BatchNorm in inference mode, SiLU: the block a BN-folding pass would fuse."""

import torch

BATCH, CHANNELS, SIZE = 64, 128, 64


class Model(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.norm = torch.nn.BatchNorm2d(channels)
        with torch.no_grad():
            self.norm.running_mean.uniform_(-0.2, 0.2)
            self.norm.running_var.uniform_(0.5, 2.0)
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(self.norm(self.conv(x)))


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [CHANNELS]
