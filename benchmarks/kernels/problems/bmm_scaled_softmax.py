"""Attention scores without a fused kernel: 512 heads of q @ k^T (1024 x 64), scaled by 1/8, then softmax."""

import torch

HEADS, SEQ, HEAD_DIM = 512, 1024, 64


class Model(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(q, k.transpose(1, 2)) * (1.0 / HEAD_DIM ** 0.5)
        return torch.softmax(scores, dim=-1)


def get_inputs() -> list:
    return [torch.randn(HEADS, SEQ, HEAD_DIM), torch.randn(HEADS, SEQ, HEAD_DIM)]


def get_init_inputs() -> list:
    return []
