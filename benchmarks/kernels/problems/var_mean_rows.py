"""Variance and mean of each row (two outputs) of a 49152 x 16384 matrix."""

import torch

ROWS, COLS = 49152, 16384


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        variance, mean = torch.var_mean(x, dim=1)
        return variance, mean


def get_inputs() -> list:
    return [torch.randn(ROWS, COLS) * 2.0 + 0.5]


def get_init_inputs() -> list:
    return []
