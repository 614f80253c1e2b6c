"""Linear (4096 to 16384) followed by GELU: a GEMM with an activation epilogue."""

import torch

TOKENS, IN, OUT = 4096, 4096, 16384


class Model(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(x))


def get_inputs() -> list:
    return [torch.randn(TOKENS, IN)]


def get_init_inputs() -> list:
    return [IN, OUT]
