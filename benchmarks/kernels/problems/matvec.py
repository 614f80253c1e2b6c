"""Matrix-vector product over a 4 GB matrix: memory-bound, one pass over the weights."""

import torch

ROWS, COLS = 65536, 16384


class Model(torch.nn.Module):
    def forward(self, matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        return torch.mv(matrix, vector)


def get_inputs() -> list:
    return [torch.randn(ROWS, COLS), torch.randn(COLS)]


def get_init_inputs() -> list:
    return []
