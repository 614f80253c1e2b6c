"""Embedding lookup: 2 M random rows of a 1 M x 256 table (a memory-bound gather)."""

import torch

ROWS, DIM, LOOKUPS = 1_000_000, 256, 2_000_000


class Model(torch.nn.Module):
    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(rows, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


def get_inputs() -> list:
    return [torch.randint(0, ROWS, (LOOKUPS,))]


def get_init_inputs() -> list:
    return [ROWS, DIM]
