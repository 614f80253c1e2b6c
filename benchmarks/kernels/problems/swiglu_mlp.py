"""A SwiGLU feed-forward block (gate and up projections, SiLU gate, down projection), 8192 tokens of width 2048."""

import torch

TOKENS, WIDTH, HIDDEN = 8192, 2048, 5632


class Model(torch.nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(width, hidden, bias=False)
        self.up = torch.nn.Linear(width, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def get_inputs() -> list:
    return [torch.randn(TOKENS, WIDTH)]


def get_init_inputs() -> list:
    return [WIDTH, HIDDEN]
