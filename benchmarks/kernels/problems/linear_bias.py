"""Linear layer with bias, 8192 tokens from 4096 to 8192 features."""

import torch

TOKENS, IN, OUT = 8192, 4096, 8192


class Model(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def get_inputs() -> list:
    return [torch.randn(TOKENS, IN)]


def get_init_inputs() -> list:
    return [IN, OUT]
