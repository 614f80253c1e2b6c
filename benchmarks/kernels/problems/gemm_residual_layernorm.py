"""Linear, scaled residual add, then LayerNorm: a transformer sublayer's output path."""

import torch

TOKENS, FEATURES = 16384, 2048


class Model(torch.nn.Module):
    def __init__(self, features: int, residual_scale: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(features, features)
        self.norm = torch.nn.LayerNorm(features)
        self.residual_scale = residual_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.residual_scale * self.linear(x))


def get_inputs() -> list:
    return [torch.randn(TOKENS, FEATURES)]


def get_init_inputs() -> list:
    return [FEATURES, 0.5]
