"""Gated SiLU (the SwiGLU activation): a * silu(b) over two 16384 x 16384 inputs."""

import torch

ROWS, COLS = 16384, 16384


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * torch.nn.functional.silu(b)


def get_inputs() -> list:
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)]


def get_init_inputs() -> list:
    return []
