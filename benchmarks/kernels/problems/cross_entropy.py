"""Mean cross-entropy of 32768 rows of 32000-class logits against integer targets (one scalar out)."""

import torch

ROWS, CLASSES = 32768, 32000


class Model(torch.nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, targets)


def get_inputs() -> list:
    return [torch.randn(ROWS, CLASSES) * 2.0, torch.randint(0, CLASSES, (ROWS,))]


def get_init_inputs() -> list:
    return []
