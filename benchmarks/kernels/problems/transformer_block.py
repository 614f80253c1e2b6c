"""A pre-norm transformer block (fused QKV, 16-head SDPA attention, GELU MLP, residuals), 8 x 1024 tokens of 1024."""

import torch
from torch import nn

BATCH, SEQ, WIDTH, HEADS = 8, 1024, 1024, 16


class Model(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


def get_inputs() -> list:
    return [torch.randn(BATCH, SEQ, WIDTH)]


def get_init_inputs() -> list:
    return [WIDTH, HEADS]
