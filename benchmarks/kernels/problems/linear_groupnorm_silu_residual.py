"""Linear, GroupNorm over its features, SiLU written out (y * sigmoid(y)), then the residual: a diffusion MLP block."""

import torch

TOKENS, FEATURES, GROUPS = 16384, 2048, 32


class Model(torch.nn.Module):
    def __init__(self, features: int, groups: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(features, features)
        self.norm = torch.nn.GroupNorm(groups, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.linear(x))
        return y * torch.sigmoid(y) + x


def get_inputs() -> list:
    return [torch.randn(TOKENS, FEATURES)]


def get_init_inputs() -> list:
    return [FEATURES, GROUPS]
