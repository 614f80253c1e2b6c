"""Scaled dot-product attention (no mask), 16 x 16 heads, 2048 positions, head size 64."""

import torch

BATCH, HEADS, SEQ, HEAD_DIM = 16, 16, 2048, 64


class Model(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def get_inputs() -> list:
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM) for _ in range(3)]


def get_init_inputs() -> list:
    return []
