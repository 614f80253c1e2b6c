"""Log-softmax over a 50,304-entry vocabulary for 8192 token positions."""

import torch

TOKENS, VOCAB = 8192, 50304


class Model(torch.nn.Module):
    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits, dim=-1)


def get_inputs() -> list:
    return [4.0 * torch.randn(TOKENS, VOCAB)]


def get_init_inputs() -> list:
    return []
