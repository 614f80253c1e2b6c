"""3-D max pooling (kernel 3, stride 2, padding 1) of 64-channel video features, 48 frames of 112 x 112."""

import torch

BATCH, CHANNELS, FRAMES, SIZE = 16, 64, 48, 112


class Model(torch.nn.Module):
    def __init__(self, kernel: int) -> None:
        super().__init__()
        self.pool = torch.nn.MaxPool3d(kernel, stride=2, padding=kernel // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs() -> list:
    return [torch.randn(BATCH, CHANNELS, FRAMES, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [3]
