"""1-D convolution with a width-5 kernel over 8192-step sequences, 256 to 256 channels."""

import torch

BATCH, CHANNELS, LENGTH, WIDTH = 64, 256, 8192, 5


class Model(torch.nn.Module):
    def __init__(self, channels: int, width: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(channels, channels, kernel_size=width, padding=width // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, LENGTH)]


def get_init_inputs() -> list:
    return [CHANNELS, WIDTH]
