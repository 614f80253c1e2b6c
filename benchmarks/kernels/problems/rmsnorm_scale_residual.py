"""RMSNorm over 4096 features of 49,152 tokens, scaled by 1.5 and added to a residual stream."""

import torch

TOKENS, DIM = 49152, 4096


class Model(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(dim, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * 1.5 + residual


def get_inputs() -> list:
    return [torch.randn(TOKENS, DIM), torch.randn(TOKENS, DIM)]


def get_init_inputs() -> list:
    return [DIM]
