"""Attention scores scaled, causally masked (future positions to -inf) and softmaxed: 8 x 16 heads of 2048 x 2048."""

import torch

BATCH, HEADS, SEQ = 8, 16, 2048


class Model(torch.nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        seq = scores.shape[-1]
        future = torch.ones(seq, seq, dtype=torch.bool, device=scores.device).triu(diagonal=1)
        return torch.softmax((scores * self.scale).masked_fill(future, float("-inf")), dim=-1)


def get_inputs() -> list:
    return [torch.randn(BATCH, HEADS, SEQ, SEQ) * 8.0]


def get_init_inputs() -> list:
    return [0.125]
