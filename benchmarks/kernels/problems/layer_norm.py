"""LayerNorm with affine weights over 8192 features of 65536 tokens."""

import torch

TOKENS, FEATURES = 65536, 8192


class Model(torch.nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(features)
        with torch.no_grad():  # non-trivial affine parameters, so that they matter
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list:
    return [torch.randn(TOKENS, FEATURES) * 2.0 + 1.0]


def get_init_inputs() -> list:
    return [FEATURES]
