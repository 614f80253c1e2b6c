"""Maximum over the middle dimension of a 384 x 4096 x 512 tensor (a strided reduction)."""

import torch

A, B, C = 384, 4096, 512


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.amax(x, dim=1)


def get_inputs() -> list:
    return [torch.randn(A, B, C)]


def get_init_inputs() -> list:
    return []
