"""Dilated 2-D max pooling (kernel 3, dilation 2, stride 1, padding 1) of 128 x 128 maps, 128 channels."""

import torch

BATCH, CHANNELS, SIZE = 128, 128, 128


class Model(torch.nn.Module):
    def __init__(self, kernel: int, dilation: int) -> None:
        super().__init__()
        self.kernel, self.dilation = kernel, dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, self.kernel, stride=1, padding=1,
                                              dilation=self.dilation)


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [3, 2]
