"""A transformer MLP block: LayerNorm, Linear 1024 to 4096, GELU, Linear back, residual add; 16384 tokens."""

import torch

TOKENS, WIDTH, HIDDEN = 16384, 1024, 4096


class Model(torch.nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def get_inputs() -> list:
    return [torch.randn(TOKENS, WIDTH)]


def get_init_inputs() -> list:
    return [WIDTH, HIDDEN]
