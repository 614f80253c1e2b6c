"""LayerNorm over 8192 features of 32,768 rows, then exact GELU."""

import torch

ROWS, DIM = 32768, 8192


class Model(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.norm(x))


def get_inputs() -> list:
    return [torch.randn(ROWS, DIM) * 2.0 + 0.5]


def get_init_inputs() -> list:
    return [DIM]
