"""A long elementwise chain (scale, shift, tanh, sigmoid gate, square, clamp): one pass each in eager PyTorch."""

import torch

ROWS, COLS = 16384, 16384


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x * 1.7 + 0.3)
        y = y * torch.sigmoid(x) - 0.25 * x * x
        return torch.clamp(y, min=-2.0, max=2.0) + 0.1 * x


def get_inputs() -> list:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list:
    return []
