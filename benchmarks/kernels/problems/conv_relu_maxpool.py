"""3x3 convolution (64 to 128 channels), ReLU, then 2x2 max-pooling, on 32 images of 128 x 128."""

import torch

BATCH, IN, OUT, SIZE = 32, 64, 128, 128


class Model(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), kernel_size=2)


def get_inputs() -> list:
    return [torch.randn(BATCH, IN, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [IN, OUT]
