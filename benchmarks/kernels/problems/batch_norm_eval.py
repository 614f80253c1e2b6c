"""BatchNorm2d in inference mode (running statistics) over 512 channels of 256 maps of 64 x 64."""

import torch

BATCH, CHANNELS, SIZE = 256, 512, 64


class Model(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(channels)
        with torch.no_grad():  # statistics as if trained, not the identity defaults
            self.norm.running_mean.uniform_(-1.0, 1.0)
            self.norm.running_var.uniform_(0.5, 2.0)
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [CHANNELS]
